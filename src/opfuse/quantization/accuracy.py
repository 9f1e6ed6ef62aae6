"""How far the int8 model is from the float one on held-back samples, per output: SQNR
(signal to quantization-noise ratio, dB), cosine similarity, max abs error, and where an
output scores classes (a classifier head makes it, N x C or N x T x C per step) top-1 and
top-5 agreement (the float model's top class is the int8 model's top one / among its top
five); where a Sigmoid makes a map (N x C x H x W probabilities: a detector's score map),
the map IoU: the IoU of the pixels above ``MAP_THRESHOLD`` in the float and int8 maps."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from opfuse.quantization.model_kind import mask_input, model_kind


@dataclass(frozen=True)
class OutputAccuracy:
    name: str
    sqnr_db: float
    cosine: float
    max_abs: float
    top1: float | None = None  # agreement, 0..1; None: the output does not score classes
    top5: float | None = None
    rows: int = 0  # the rows (samples x steps) the agreement is counted over
    # each sample's own SQNR (dB, in sample order; empty where not computed): what a
    # paired comparison of two models on the same samples needs (``Gate.better``)
    samples_sqnr_db: tuple[float, ...] = ()
    map_iou: float | None = None  # a Sigmoid-made map's IoU at map_threshold; None: no map
    map_threshold: float = 0.5
    # a CTC-like output ([N, T, C] scores, one class the argmax on most steps: the blank),
    # greedy-decoded in both models: the character error rate of the int8 text against the
    # float text, the share of samples (lines) whose text is the same, the float text's
    # characters; None: not CTC-like (per-step top-1 is then the measure)
    cer: float | None = None
    lines: float | None = None
    chars: int = 0
    # an embedding (a hidden state mean-pooled over its attention mask, or a pooled
    # vector), normalised: the cosine of the int8 model's to the float model's, mean and
    # lowest over the samples, and the share of samples whose nearest neighbour among the
    # others is the same in both (None: not an embedding, or fewer than 3 samples)
    embedding_cosine: float | None = None
    embedding_cosine_min: float | None = None
    neighbours: float | None = None
    # the task's own figure where the user gives it (``Task``): the accuracy against the
    # eval data's labels, or the user's metric, of the int8 and the float model (higher
    # is better); None: not given
    task: float | None = None
    task_float: float | None = None
    task_name: str = ""
    # a decoder's logits ([N, T, V] over the vocabulary, ``model_kind``): top-1 per position
    # is the next-token agreement; the perplexity of the text under each model (the NLL of
    # input_ids[t + 1] under logits[t], over the attention mask), on ``tokens`` positions
    # (None: no sample has a next token: one new token each, a decoding step)
    next_token: bool = False
    perplexity: float | None = None
    perplexity_float: float | None = None
    tokens: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "output": self.name,
            "sqnr_db": None if math.isinf(self.sqnr_db) else round(self.sqnr_db, 3),
            "cosine": round(self.cosine, 6),
            "max_abs": float(self.max_abs),
            "top1_agreement": self.top1,
            "top5_agreement": self.top5,
            "map_iou": self.map_iou,
            "map_threshold": self.map_threshold if self.map_iou is not None else None,
            "cer": self.cer,
            "line_agreement": self.lines,
            "embedding_cosine": self.embedding_cosine,
            "embedding_cosine_min": self.embedding_cosine_min,
            "neighbour_agreement": self.neighbours,
            "task": None
            if self.task is None
            else {"name": self.task_name, "int8": self.task, "float": self.task_float},
            "perplexity": None
            if self.perplexity is None
            else {
                "float": self.perplexity_float,
                "int8": self.perplexity,
                "change": self.perplexity_change,
                "tokens": self.tokens,
            },
            "measure": self.measure,
        }

    @property
    def perplexity_change(self) -> float | None:
        """The int8 model's perplexity over the float model's, minus 1 (0.05: 5% higher)."""
        if self.perplexity is None or not self.perplexity_float:
            return None
        return self.perplexity / self.perplexity_float - 1

    @property
    def measure(self) -> str:
        """The figure the gate reads for this output by default, by the output's kind:
        ``cer`` (a CTC-like text), ``map_iou`` (a Sigmoid's map), ``top1`` (class scores,
        labels), ``sqnr`` (anything else)."""
        if self.task is not None:
            return "drop"
        if self.cer is not None:
            return "cer"
        if self.embedding_cosine is not None:
            return "embedding_cosine"
        if self.map_iou is not None:
            return "map_iou"
        if self.next_token and self.top1 is not None:
            return "next_token"
        return "top1" if self.top1 is not None else "sqnr"

    def line(self) -> str:
        sqnr = "inf" if math.isinf(self.sqnr_db) else f"{self.sqnr_db:.1f}"
        text = f"{self.name}: SQNR {sqnr} dB, cosine {self.cosine:.4f}, max abs {self.max_abs:.3g}"
        if self.next_token and self.top1 is not None:
            text += f", next-token agreement {self.top1:.1%} ({self.rows} positions)"
            text += self._perplexity_text()
        elif self.top1 is not None and self.top5 is not None:
            text += f", top-1 {self.top1:.1%}, top-5 {self.top5:.1%} agreement"
        elif self.top1 is not None:  # labels, or rows only one model has: no top-5
            text += f", top-1 {self.top1:.1%} agreement"
        if self.map_iou is not None:
            text += f", map IoU {self.map_iou:.1%} (above {self.map_threshold:g})"
        if self.embedding_cosine is not None and self.embedding_cosine_min is not None:
            text += (
                f"; as an embedding (pooled, normalised): cosine {self.embedding_cosine:.4f} "
                f"mean, {self.embedding_cosine_min:.4f} lowest"
                + (
                    f", {self.neighbours:.1%} of the samples keep their nearest neighbour"
                    if self.neighbours is not None
                    else ""
                )
            )
        if self.task is not None and self.task_float is not None:
            text += (
                f"; {self.task_name}: {self.task:.4g} against {self.task_float:.4g} in float "
                f"(a drop of {self.task_float - self.task:.4g})"
            )
        if self.cer is not None and self.lines is not None:
            text += (
                f"; decoded as CTC: CER {self.cer:.2%} of the int8 text against the float "
                f"text ({self.chars} characters), {self.lines:.1%} of the lines the same "
                "(per-step top-1: a diagnostic)"
            )
        return text

    def _perplexity_text(self) -> str:
        change = self.perplexity_change
        if self.perplexity is None or self.perplexity_float is None or change is None:
            return "; perplexity: no next token in the samples (one new token each)"
        return (
            f"; perplexity {self.perplexity:.4g} against {self.perplexity_float:.4g} in float "
            f"({change:+.2%}, {self.tokens} tokens)"
        )


def scores_classes(array: np.ndarray) -> bool:
    """N x C or N x T x C floats with at least 2 classes."""
    return array.dtype.kind == "f" and array.ndim in (2, 3) and array.shape[-1] >= 2


# what makes class scores: probabilities, or the logits of a linear head (its bias Add)
SCORING_OPS = frozenset({"Softmax", "LogSoftmax", "Gemm", "MatMul", "Add"})
# ops that move or relabel data between the head and the output
_PASSING_OPS = frozenset(
    {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Cast"}
)


def scoring_outputs(model: onnx.ModelProto) -> set[str]:
    """The main graph's outputs a classifier head makes (SCORING_OPS, through data-moving
    ops; an Add only as the bias of a MatMul or Gemm; a Softmax written out as
    Div(Exp, ReduceSum(Exp))): the ones whose top-1 agreement
    means something. A recurrent state (LSTM, GRU, an If's output) or a pooled embedding
    is not one, whatever its shape."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    found = set()
    for out in graph.output:
        node = producer.get(out.name)
        while node is not None and node.op_type in _PASSING_OPS and node.input:
            node = producer.get(node.input[0])
        if node is not None and node.op_type == "Div" and _decomposed_softmax(node, producer):
            found.add(out.name)
            continue
        if node is None or node.op_type not in SCORING_OPS:
            continue
        if node.op_type == "Add" and not any(
            (p := producer.get(i)) is not None and p.op_type in ("MatMul", "Gemm")
            for i in node.input
        ):
            continue
        found.add(out.name)
    return found


MAP_THRESHOLD = 0.5  # a probability map binarized where the model says "more likely than not"
MAP_OPS = frozenset({"Sigmoid"})


def probability_maps(model: onnx.ModelProto) -> set[str]:
    """The main graph's outputs a Sigmoid makes (through data-moving ops): probability
    maps when they are N x C x H x W (``is_map``), judged by their map IoU, not top-1."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    found = set()
    for out in graph.output:
        node = _through_moves(producer.get(out.name), producer)
        if node is not None and node.op_type in MAP_OPS:
            found.add(out.name)
    return found


def is_map(array: np.ndarray) -> bool:
    """N x C x H x W floats in [0, 1] (within float rounding: MAP_ROUNDING) with more than
    one pixel."""
    return (
        array.dtype.kind == "f"
        and array.ndim == 4
        and array.shape[-1] * array.shape[-2] > 1
        and (
            array.size == 0
            or (float(array.min()) >= -MAP_ROUNDING and float(array.max()) <= 1.0 + MAP_ROUNDING)
        )
    )


# a float Sigmoid can round to a hair above 1 (PP-OCRv4's detector: 1.0000001 on one
# photo), which must not turn a map into a plain output judged by its SQNR
MAP_ROUNDING = 1e-5


def map_iou(ref: np.ndarray, got: np.ndarray, threshold: float = MAP_THRESHOLD) -> float:
    """The IoU of the pixels above ``threshold`` in ``ref`` and ``got`` (1.0 when neither
    has any: the maps agree that there is nothing)."""
    r, g = ref > threshold, got > threshold
    union = int(np.count_nonzero(r | g))
    return float(np.count_nonzero(r & g) / union) if union else 1.0


def _decomposed_softmax(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> bool:
    """Div(Exp(...), ReduceSum(Exp(...))): a Softmax written out (tf2onnx, jax2tf)."""
    made = [_through_moves(producer.get(i), producer) for i in node.input[:2]]
    if len(made) < 2 or made[0] is None or made[1] is None:
        return False
    return made[0].op_type == "Exp" and made[1].op_type == "ReduceSum"


def _through_moves(
    node: onnx.NodeProto | None, producer: dict[str, onnx.NodeProto]
) -> onnx.NodeProto | None:
    """The first node above ``node`` that does more than move or broadcast its input (a
    jax2tf Softmax divides by Expand(Reshape(ReduceSum(Exp))): magika's head)."""
    while node is not None and node.op_type in (*_PASSING_OPS, "Expand") and node.input:
        node = producer.get(node.input[0])
    return node


# the lowest SQNR given: an error on an output the float model leaves at zero (boxes only
# the int8 model keeps) is all error, not -3000 dB (the 1e-300 floor of the signal)
SQNR_FLOOR_DB = -100.0


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10 log10 of the signal's power over the error's (inf: no error)."""
    r = np.asarray(ref, dtype=np.float64).ravel()
    g = np.asarray(got, dtype=np.float64).ravel()
    noise = float(np.sum((r - g) ** 2))
    signal = float(np.sum(r**2))
    if noise == 0:
        return math.inf
    return max(10 * math.log10(max(signal, 1e-300) / noise), SQNR_FLOOR_DB)


def compare_output(
    name: str,
    ref: np.ndarray,
    got: np.ndarray,
    scores: bool = True,
    samples_sqnr_db: tuple[float, ...] = (),
    probability_map: bool = False,
    threshold: float = MAP_THRESHOLD,
    labels: bool = False,
    text: bool = True,
) -> OutputAccuracy:
    """``text``: the output may be a CTC text (``text_outputs``), decoded where its data
    says so. ``probability_map``: a Sigmoid makes the output (``probability_maps``); when it is a
    map (``is_map``), its map IoU at ``threshold`` is measured instead of top-1.
    ``labels``: the output holds labels, indices or counts (integers, booleans, strings:
    ``compare_outputs``), judged by the share of its elements that agree exactly (as
    top-1: a classifier's label off by one is a wrong answer, whatever its SQNR)."""
    r = ref.astype(np.float64).ravel()
    g = got.astype(np.float64).ravel()
    noise = float(np.sum((r - g) ** 2))
    sqnr = sqnr_db(r, g)
    norms = float(np.linalg.norm(r) * np.linalg.norm(g))
    cosine = float(r @ g / norms) if norms else (1.0 if noise == 0 else 0.0)
    max_abs = float(np.max(np.abs(r - g))) if r.size else 0.0
    top1 = top5 = None
    if labels:
        top1 = float(np.mean(r == g)) if r.size else 1.0
        return OutputAccuracy(name, sqnr, cosine, max_abs, top1, None, r.size, samples_sqnr_db)
    if probability_map and is_map(ref):
        iou = map_iou(ref, got, threshold)
        return OutputAccuracy(
            name,
            sqnr,
            cosine,
            max_abs,
            samples_sqnr_db=samples_sqnr_db,
            map_iou=iou,
            map_threshold=threshold,
        )
    if scores and scores_classes(ref) and ref.size:
        rows_ref = ref.reshape(-1, ref.shape[-1])
        rows_got = got.reshape(-1, got.shape[-1])
        want = rows_ref.argmax(axis=1)
        top1 = float(np.mean(rows_got.argmax(axis=1) == want))
        k = min(5, rows_got.shape[1])
        best = np.argpartition(-rows_got, k - 1, axis=1)[:, :k]
        top5 = float(np.mean([w in b for w, b in zip(want, best, strict=True)]))
        figures = OutputAccuracy(
            name, sqnr, cosine, max_abs, top1, top5, len(want), samples_sqnr_db
        )
        return _with_ctc(figures, ref, got) if text else figures
    return OutputAccuracy(name, sqnr, cosine, max_abs, top1, top5, 0, samples_sqnr_db)


# a [N, T, C] output of a model that reads no token ids (``text_outputs``) is CTC-like
# where one class (the blank) is the float model's argmax on more than this share of the
# steps: a recognizer's blank fills the gaps between characters (PP-OCRv4's: 80-95% of
# the steps of a sparse line, 49% of dense English lines of stdlib docstrings); a token
# classifier's "outside" class can hold as much, hence the token-id condition
CTC_BLANK_SHARE = 0.3


def text_outputs(model: onnx.ModelProto) -> set[str]:
    """The outputs that may be a CTC text: the main graph's rank-3 class scores
    (``scoring_outputs``) of a model whose inputs are all floats (an image, a sound: a
    model that reads token ids classifies tokens, it does not spell)."""
    ints = any(
        i.type.tensor_type.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
        for i in model.graph.input
    )
    if ints:
        return set()
    ranks = {
        o.name: len(o.type.tensor_type.shape.dim)
        for o in model.graph.output
        if o.type.tensor_type.HasField("shape")
    }
    return {name for name in scoring_outputs(model) if ranks.get(name) == 3}


def _with_ctc(figures: OutputAccuracy, ref: np.ndarray, got: np.ndarray) -> OutputAccuracy:
    """``figures`` with the decoded text's measures where ``ref`` is CTC-like."""
    if ref.ndim != 3 or ref.shape[0] == 0 or ref.shape[1] < 2 or ref.shape != got.shape:
        return figures
    if ref.shape[2] < 3:  # a blank and one symbol: a per-frame yes/no, not a text
        return figures
    steps_ref, steps_got = ref.argmax(axis=2), got.argmax(axis=2)
    counts = np.bincount(steps_ref.ravel(), minlength=ref.shape[2])
    blank = int(counts.argmax())
    if counts[blank] <= CTC_BLANK_SHARE * steps_ref.size:
        return figures
    edits = chars = same = 0
    for want_steps, got_steps in zip(steps_ref, steps_got, strict=True):
        want, have = ctc_decode(want_steps, blank), ctc_decode(got_steps, blank)
        edits += edit_distance(want, have)
        chars += len(want)
        same += want == have
    cer = edits / chars if chars else float(edits > 0)
    return replace(figures, cer=cer, lines=same / len(steps_ref), chars=chars)


def ctc_decode(steps: np.ndarray, blank: int) -> list[int]:
    """Greedy CTC decoding: the argmax per step, repeats collapsed, blanks dropped."""
    out: list[int] = []
    previous = -1
    for label in steps.tolist():
        if label != previous and label != blank:
            out.append(label)
        previous = label
    return out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance: insertions, deletions and substitutions."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


TASK_OUTPUT = "task metric"  # the figures' entry of a user's metric (``Task.metric``)


@dataclass(frozen=True)
class Task:
    """The task's own measure on the evaluation samples, where the user gives one:
    ``labels`` (one class index per sample, an eval ``.npz``'s ``labels`` array): the
    accuracy of the first output that scores classes; ``metric``: a function of one
    model's outputs on the samples (a list, per sample, of name -> array) to a number,
    higher is better (as NNCF's validation function), called on both models."""

    labels: np.ndarray | None = None
    metric: Callable[[list[dict[str, np.ndarray]]], float] | None = None

    def figures(
        self,
        names: Sequence[str],
        ref: Sequence[Sequence[np.ndarray]],
        got: Sequence[Sequence[np.ndarray]],
        out: list[OutputAccuracy],
        scoring: Collection[str] | None,
    ) -> list[OutputAccuracy]:
        """``out`` with the task's figures: the labels' accuracy on the first output that
        scores classes, the metric as one more entry."""
        if self.labels is not None:
            for k, figures in enumerate(out):
                if (scoring is None or figures.name in scoring) and figures.top1 is not None:
                    rows_ref = [np.asarray(r[k]) for r in ref]
                    rows_got = [np.asarray(g[k]) for g in got]
                    found = _label_accuracy(rows_ref, rows_got, self.labels)
                    if found is not None:
                        name = "accuracy on the labels"
                        out[k] = replace(
                            figures, task=found[1], task_float=found[0], task_name=name
                        )
                    break
        if self.metric is not None:
            as_dicts = [
                [dict(zip(names, sample, strict=True)) for sample in run] for run in (ref, got)
            ]
            value_float, value = (float(self.metric(d)) for d in as_dicts)
            out.append(
                OutputAccuracy(
                    TASK_OUTPUT,
                    math.inf,
                    1.0,
                    0.0,
                    task=value,
                    task_float=value_float,
                    task_name="the metric given",
                )
            )
        return out


def _label_accuracy(
    ref: list[np.ndarray], got: list[np.ndarray], labels: np.ndarray
) -> tuple[float, float] | None:
    """The share of samples whose top class is their label, float and int8 (None: the
    output's rows are not one per label)."""
    if any(r.ndim < 1 or r.shape[-1] < 2 or r.size != r.shape[-1] for r in ref):
        return None
    if len(ref) != len(labels):
        return None
    want = np.asarray(labels).reshape(-1)
    top_ref = np.array([int(np.argmax(r)) for r in ref])
    top_got = np.array([int(np.argmax(g)) for g in got])
    return float(np.mean(top_ref == want)), float(np.mean(top_got == want))


def compare_outputs(
    names: Sequence[str],
    ref: Sequence[Sequence[np.ndarray]],
    got: Sequence[Sequence[np.ndarray]],
    scoring: Collection[str] | None = None,
    maps: Collection[str] = (),
    threshold: float = MAP_THRESHOLD,
    embeddings: Collection[str] = (),
    masks: Sequence[np.ndarray | None] = (),
    texts: Collection[str] | None = None,
    logits: Collection[str] = (),
    token_ids: Sequence[np.ndarray | None] = (),
) -> list[OutputAccuracy]:
    """``ref``/``got``: per sample, the outputs in ``names`` order; joined along axis 0
    (each sample's own SQNR kept beside). ``scoring``: the outputs that may score classes
    (``scoring_outputs``; None: any); ``maps``: the outputs a Sigmoid makes
    (``probability_maps``), their map IoU measured at ``threshold`` where they are maps;
    ``logits``: a decoder's (``model_kind``), judged by next-token agreement and the
    perplexity of the samples' ``token_ids`` under each model."""
    out = []
    for i, name in enumerate(names):
        raw = [(_as_array(r[i]), _as_array(g[i])) for r, g in zip(ref, got, strict=True)]
        labels = any(r.dtype.kind not in "f" for r, _ in raw)
        pairs = [_aligned(r, g) for r, g in raw]
        each = tuple(sqnr_db(r, g) for r, g in pairs)
        r, g = _joined([r for r, _ in pairs]), _joined([g for _, g in pairs])
        scores = scoring is None or name in scoring
        text = texts is None or name in texts
        figures = compare_output(name, r, g, scores, each, name in maps, threshold, labels, text)
        if figures.top1 is not None and any(r.shape != g.shape for r, g in raw):
            top1, rows = _agreement(pairs, [r.shape != g.shape for r, g in raw], labels)
            figures = replace(figures, top1=top1, top5=None, rows=rows)
        if name in embeddings and not labels and all(r.shape == g.shape for r, g in raw):
            figures = _with_embedding(figures, raw, masks)
        if name in logits and figures.top1 is not None:
            figures = _with_perplexity(figures, raw, token_ids, masks)
        out.append(figures)
    return out


# the names of outputs that hold embeddings (a model's hidden state or pooled vector)
EMBEDDING_NAMES = ("hidden_state", "embedding", "pooler", "pooled", "sentence")


def embedding_outputs(model: onnx.ModelProto) -> set[str]:
    """The main graph's float outputs that hold embeddings: named so (EMBEDDING_NAMES), or
    a rank-3 hidden state of a model with an attention mask input (``mask_input``) that
    is no decoder (a decoder's logits and key/value cache are not embeddings)."""
    masked = mask_input(model) is not None and not model_kind(model).decoder
    found = set()
    for out in model.graph.output:
        tensor = out.type.tensor_type
        if tensor.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else 0
        named = any(key in out.name.lower() for key in EMBEDDING_NAMES)
        if (named and rank in (2, 3)) or (masked and rank == 3):
            found.add(out.name)
    return found


def pooled(output: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """One sample's embeddings, [n, H]: a hidden state [n, T, H] averaged over the steps
    its attention mask keeps (all of them without one), normalised to unit length."""
    rows = np.asarray(output, np.float64)
    if rows.ndim == 3:
        if mask is not None and mask.shape == rows.shape[:2]:
            weights = np.asarray(mask, np.float64)[:, :, None]
            rows = (rows * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-12)
        else:
            rows = rows.mean(axis=1)
    rows = rows.reshape(len(rows), -1)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def _with_embedding(
    figures: OutputAccuracy,
    raw: list[tuple[np.ndarray, np.ndarray]],
    masks: Sequence[np.ndarray | None],
) -> OutputAccuracy:
    """``figures`` with the embeddings' cosine and nearest-neighbour agreement."""
    each = list(masks) if len(masks) == len(raw) else [None] * len(raw)
    ref = np.concatenate([pooled(r, m) for (r, _), m in zip(raw, each, strict=True)])
    got = np.concatenate([pooled(g, m) for (_, g), m in zip(raw, each, strict=True)])
    if not len(ref):
        return figures
    cosines = np.sum(ref * got, axis=1)
    neighbours = None
    if len(ref) >= 3:
        near_ref, near_got = ref @ ref.T, got @ got.T
        np.fill_diagonal(near_ref, -np.inf)
        np.fill_diagonal(near_got, -np.inf)
        neighbours = float(np.mean(near_ref.argmax(axis=1) == near_got.argmax(axis=1)))
    return replace(
        figures,
        embedding_cosine=float(cosines.mean()),
        embedding_cosine_min=float(cosines.min()),
        neighbours=neighbours,
    )


def _with_perplexity(
    figures: OutputAccuracy,
    raw: list[tuple[np.ndarray, np.ndarray]],
    token_ids: Sequence[np.ndarray | None],
    masks: Sequence[np.ndarray | None],
) -> OutputAccuracy:
    """``figures`` as a decoder's logits: next-token agreement (its top-1 per position),
    and the perplexity of the samples' tokens under each model where they have a next
    token."""
    figures = replace(figures, next_token=True)
    ids = list(token_ids) if len(token_ids) == len(raw) else [None] * len(raw)
    each = list(masks) if len(masks) == len(raw) else [None] * len(raw)
    totals, count = np.zeros(2), 0
    for (r, g), t, m in zip(raw, ids, each, strict=True):
        if t is None or r.ndim != 3 or r.shape != g.shape or np.shape(t) != r.shape[:2]:
            continue
        keep = np.ones(r.shape[:2], bool)
        if m is not None and np.shape(m)[0] == r.shape[0] and np.shape(m)[1] >= r.shape[1]:
            keep = np.asarray(m)[:, np.shape(m)[1] - r.shape[1] :] != 0  # the new tokens'
        valid = keep[:, :-1] & keep[:, 1:]
        target = np.asarray(t, np.int64)[:, 1:]
        for k, logits in enumerate((r, g)):
            totals[k] += float(np.sum(token_nll(logits[:, :-1], target)[valid]))
        count += int(np.count_nonzero(valid))
    if not count:
        return figures
    ppl_float, ppl = (math.exp(x / count) for x in totals)
    return replace(figures, perplexity=ppl, perplexity_float=ppl_float, tokens=count)


def token_nll(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The negative log-likelihood of each ``target`` token under ``logits`` [..., V]."""
    x = np.asarray(logits, np.float64)
    top = x.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(x - top).sum(axis=-1)) + top[..., 0]
    return np.asarray(lse - np.take_along_axis(x, target[..., None], axis=-1)[..., 0])


def _agreement(
    pairs: list[tuple[np.ndarray, np.ndarray]], differs: list[bool], labels: bool
) -> tuple[float, int]:
    """Top-1 agreement and its rows where the two models' outputs differ in shape on some
    samples: every row of such a sample disagrees (a row only one model has is no
    agreement, and zero padding would agree with a zero row)."""
    agree = count = 0
    for (r, g), differ in zip(pairs, differs, strict=True):
        rows_r = r.ravel() if labels or r.ndim < 2 else r.reshape(-1, r.shape[-1])
        count += len(rows_r)
        if differ or not len(rows_r):
            continue
        if labels or r.ndim < 2:
            agree += int(np.sum(rows_r == g.ravel()))
        else:
            agree += int(np.sum(rows_r.argmax(axis=1) == g.reshape(-1, g.shape[-1]).argmax(axis=1)))
    return (agree / count if count else 1.0), count


def _as_array(value: object) -> np.ndarray:
    """An output as one numeric array: a tensor as it is; a sequence of tensors (a list)
    or a map (a dict, by its sorted keys), their values raveled and joined; an empty
    optional (None): empty."""
    if value is None:
        return np.zeros(0)
    if isinstance(value, dict):
        value = [value[k] for k in sorted(value)]
    if isinstance(value, list):
        parts = [_as_array(v).ravel() for v in value]
        return np.concatenate(parts) if parts else np.zeros(0)
    return np.asarray(value)


def _aligned(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One sample's output of the two models on one shape: where the int8 model's differs
    (a count that depends on the data: boxes kept by NonMaxSuppression), both padded with
    zeros to the larger (what one has and the other lacks is all error). Labels (strings)
    compare by equality: the reference all ones, the int8 model's 1 where it agrees."""
    if ref.dtype.kind not in "biuf" or got.dtype.kind not in "biuf":
        same = ref == got if ref.shape == got.shape else np.zeros(ref.shape, bool)
        return np.ones(ref.shape), np.asarray(same, np.float64)
    if ref.shape != got.shape:
        if ref.ndim != got.ndim:
            ref, got = ref.ravel(), got.ravel()
        shape = tuple(max(a, b) for a, b in zip(ref.shape, got.shape, strict=True))
        ref, got = _padded(ref, shape), _padded(got, shape)
    return ref, got


def _padded(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape, array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """The samples' arrays along axis 0 (a scalar as one row), or raveled end to end where
    their shapes past axis 0 differ (an output whose shape depends on the data)."""
    rows = [a.reshape(1) if a.ndim == 0 else a for a in arrays]
    if len({a.shape[1:] for a in rows}) == 1:
        return np.concatenate(rows)
    return np.concatenate([a.ravel() for a in rows])


def brief(figures: Sequence[OutputAccuracy]) -> str:
    """The figures in a few words, the lowest of each kind: top-1 where outputs score
    classes (next-token agreement for a decoder's logits), map IoU where they are maps,
    and SQNR."""
    top1 = [a.top1 for a in figures if a.top1 is not None and not a.next_token]
    tokens = [a.top1 for a in figures if a.top1 is not None and a.next_token]
    maps = [a.map_iou for a in figures if a.map_iou is not None]
    cer = [a.cer for a in figures if a.cer is not None]
    cos = [a.embedding_cosine for a in figures if a.embedding_cosine is not None]
    sqnr = min((a.sqnr_db for a in figures), default=float("nan"))
    return (
        (f"CER {max(cer):.2%}, " if cer else "")
        + (f"embedding cosine {min(cos):.4f}, " if cos else "")
        + (f"next-token agreement {min(tokens):.1%}, " if tokens else "")
        + (f"top-1 {min(top1):.1%}, " if top1 else "")
        + (f"map IoU {min(maps):.1%}, " if maps else "")
        + (f"SQNR {sqnr:.1f} dB" if not math.isinf(sqnr) else "SQNR inf")
    )
