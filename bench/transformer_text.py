"""The text and tokenizer of bench.quant_transformers: sentences of this Python's
standard-library docstrings, calibration and held-out text from different modules, and
BERT's uncased WordPiece tokenizer (no tokenizers package needed)."""

from __future__ import annotations

import importlib
import inspect
import random
import re
import unicodedata

import numpy as np

CALIBRATION, HELD_OUT, TOKENS = 64, 160, 128
# calibration and held-out text from different modules (and from none of the modules a
# one-off measurement outside the benchmark used: os, collections, json, re, email, ...)
CAL_MODULES = ("ast", "inspect", "dataclasses", "enum", "contextlib", "pickle", "copy",
               "random", "shlex", "glob", "abc", "io", "numbers")  # fmt: skip
EVAL_MODULES = ("socket", "ssl", "selectors", "signal", "concurrent.futures", "queue", "gzip",
                "bz2", "lzma", "hashlib", "base64", "struct", "codecs", "locale", "gettext",
                "pprint", "traceback", "warnings", "weakref", "operator", "bisect", "mailbox",
                "mimetypes", "html.parser", "xml.etree.ElementTree", "wave", "plistlib",
                "platform", "timeit", "doctest", "pdb", "imaplib", "poplib")  # fmt: skip


# ---------------------------------------------------------------------------- tokenizer


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF


class WordPiece:
    """BERT's uncased tokenizer: the basic tokenizer (lower case, accents stripped,
    control characters dropped, punctuation and CJK characters split off), then greedy
    longest-match WordPiece over ``vocab`` (its lines: the token of id = line number)."""

    def __init__(self, vocab: list[str], max_word: int = 100) -> None:
        self.ids = {tok: i for i, tok in enumerate(vocab)}
        self.max_word = max_word

    def basic(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        words: list[str] = []
        cur = ""
        for ch in text:
            cat = unicodedata.category(ch)
            if cat == "Mn" or ch in ("\x00", "\ufffd"):
                continue
            if ch.isspace():
                if cur:
                    words.append(cur)
                cur = ""
            elif _is_punctuation(ch) or _is_cjk(ch):
                if cur:
                    words.append(cur)
                words.append(ch)
                cur = ""
            elif cat.startswith("C"):
                continue
            else:
                cur += ch
        if cur:
            words.append(cur)
        return words

    def pieces(self, word: str) -> list[str]:
        if len(word) > self.max_word:
            return ["[UNK]"]
        out: list[str] = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = ("##" if start else "") + word[start:end]
                if piece in self.ids:
                    break
                end -= 1
            else:
                return ["[UNK]"]
            out.append(piece)
            start = end
        return out

    def tokens(self, text: str) -> list[str]:
        return [p for word in self.basic(text) for p in self.pieces(word)]

    def encode(self, texts: list[str], length: int = TOKENS) -> dict[str, np.ndarray]:
        """input_ids, attention_mask, token_type_ids of shape (len(texts), length): [CLS]
        tokens [SEP], truncated to ``length``, padded with [PAD]'s id."""
        ids = np.full((len(texts), length), self.ids.get("[PAD]", 0), np.int64)
        mask = np.zeros((len(texts), length), np.int64)
        for row, text in enumerate(texts):
            toks = ["[CLS]", *self.tokens(text)[: length - 2], "[SEP]"]
            ids[row, : len(toks)] = [self.ids[t] for t in toks]
            mask[row, : len(toks)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


# -------------------------------------------------------------------------------- text


def docstring_sentences(modules: tuple[str, ...] | list[str]) -> list[str]:
    """The sentences (6 to 80 words, no doctest lines) of the docstrings of ``modules``
    and of the functions and classes they define, in order, each once."""
    out: dict[str, None] = {}
    for name in modules:
        mod = importlib.import_module(name)
        docs = [mod.__doc__ or ""]
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(
                obj, "__module__", ""
            ) == name:
                docs.append(obj.__doc__ or "")
        for doc in (d for d in docs if isinstance(d, str)):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                if 6 <= len(sentence.split()) <= 80 and ">>>" not in sentence:
                    out.setdefault(sentence, None)
    return list(out)


def texts() -> tuple[list[str], list[str]]:
    """The calibration and held-out sentences (no held-out sentence in calibration)."""
    cal = docstring_sentences(CAL_MODULES)
    random.Random(1).shuffle(cal)
    seen = set(cal)
    held = [s for s in docstring_sentences(EVAL_MODULES) if s not in seen]
    random.Random(2).shuffle(held)
    return cal[:CALIBRATION], held[:HELD_OUT]
