"""The accuracy gate (``--max-drop``): floors the int8 model's figures must reach against
the float model on held-back samples.

Both keys are **floors**: ``top1=99%`` is top-1 agreement with the float model of at least
99% on every output that scores classes (Intel Neural Compressor's default tolerance is 1%
relative accuracy loss; agreement with the float model is the measure available without
labels); ``sqnr=25`` is an SQNR of at least 25 dB on every output. The default, ``auto``,
is ``top1=99%`` where an output scores classes and ``sqnr=20`` elsewhere: 20 dB is a noise
power of 1% of the signal's, the level at which detection boxes and embeddings start to
move measurably (onnxruntime's own QDQ debugging guide flags layers below it). ``off``
disables it. An output a Sigmoid makes as a map (N x C x H x W probabilities: a
detector's score map) is judged by its **map IoU** instead of its SQNR: ``iou=90%`` is an
IoU of at least 90% between the pixels above 0.5 in the float and int8 maps (the default
where such an output is; ``sqnr=DB`` given alone judges every output by its SQNR, as
before). No int8 tool's detector reaches 20 dB on its score map (PP-OCRv4's: 7 to 16 dB
at 81% to 96% map IoU: a map is near 0 or 1 almost everywhere and its SQNR is spent on the
saturated pixels no threshold sees). A floor that turns the gate off in effect is refused:
a top-1 floor below 50% (until this release ``top1=1%`` meant a drop of one point; now it
would pass a model that agrees on 1% of its answers), a map IoU floor below 50%, an SQNR
floor at or below 0 dB (noise as loud as the signal).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from opfuse.errors import OpfuseError
from opfuse.quantization.accuracy import OutputAccuracy
from opfuse.quantization.names import KEYS_HELP

DEFAULT_TOP1 = 0.99
DEFAULT_SQNR_DB = 20.0
DEFAULT_MAP_IOU = 0.9  # issue 31's goal for PP-OCRv4's detector
# the ceiling of a CTC-like output's character error rate (the int8 text against the float
# text, greedy-decoded): what a reader of the text sees, where per-step top-1 counts the
# blank-against-character flips at label boundaries that change no text (issue 41: on the
# recognizer 97-99% of the differing steps, half of them no change of the decoded text);
# 1%: one character in a hundred read differently from the float model
DEFAULT_CER = 0.01
HIGHEST_CER = 0.5  # above: the gate is off in effect
# the floor of an embedding's cosine to the float model's (pooled, normalised; the mean
# over the samples): what a search over the embeddings compares; issue 42's goal
DEFAULT_COSINE = 0.99
LOWEST_COSINE = 0.5
COSINE_TIE = 0.001  # two means of cosines within this are a tie
# the ceiling of the task's own figure's drop (the accuracy on the eval data's labels, or
# the user's metric: the float model's minus the int8 model's), in its units: 1 point of
# accuracy, as Intel Neural Compressor's default tolerance
DEFAULT_DROP = 0.01
TASK_TIE = 0.002
LOWEST_TOP1 = 0.5  # below: the gate is off in effect
# On an output that scores classes, a paired SQNR gain decides (top-1 within its noise)
# only when it is large and consistent (``consistent_gain``): per sample, the candidate's
# SQNR minus the other's, on at least CLASS_MIN_SAMPLES samples; the mean gain at least
# CLASS_GAIN_DB and beyond twice its standard error, the candidate ahead on at least
# CLASS_WINS of the samples where the two differ, and the output's SQNR over all samples
# (the figure the gate reads) up CLASS_GAIN_DB too. Measured (docs/QUANTIZATION_MEASUREMENTS.md,
# "Measured: float-requant in --recipe auto"): float-requant on magika's byte classifier,
# cross-validated over the calibration files, +8.6 dB a file (SE 1.6, ahead on 38 of 50)
# and +4.8 dB (SE 1.2, 27 of 35) on two data sets, gains that held on the evaluation
# files; the recognizer's drift, about 1 dB a step (all of it +2.6 dB a window, SE 2.8,
# ahead on 2 of its 4 validation windows), is below every threshold; one file whose answer
# changes moves its SQNR by -14 to -38 dB, which on fewer than 10 samples decides the mean
# alone; PP-OCR's direction classifier gained +33 dB per image where the error was already
# negligible, -0.2 dB over all (so the whole SQNR must rise too).
CLASS_MIN_SAMPLES = 10
CLASS_GAIN_DB = 3.0
CLASS_WINS = 2 / 3
SQNR_CAP_DB = 100.0  # a sample without error (inf) counts as this
LOWEST_MAP_IOU = 0.5
# two maps' IoU within a point of each other is a tie: a fixed margin, not fitted (the
# pixels of a map are not independent samples, so no binomial standard error applies)
MAP_IOU_TIE = 0.01


@dataclass(frozen=True)
class Gate:
    top1: float | None = DEFAULT_TOP1  # the floor of top-1 agreement; None: not checked
    sqnr_db: float | None = None  # None: checked only on outputs that score no classes
    off: bool = False
    # the floor of a Sigmoid-made map's IoU; None: DEFAULT_MAP_IOU unless sqnr= is given
    map_iou: float | None = None
    # the ceiling of a CTC-like output's CER; None: DEFAULT_CER unless sqnr= is given
    cer: float | None = None
    # the floor of an embedding's mean cosine; None: DEFAULT_COSINE unless sqnr= is given
    cosine: float | None = None
    # the ceiling of the task figure's drop where labels or a metric are given
    drop: float | None = None
    # the ceiling of a decoder's perplexity increase over the float model's (0.05: 5%
    # higher); None: reported, not checked
    perplexity: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Gate:
        if text is None or text == "auto":
            return cls()
        if text == "off":
            return cls(None, None, off=True)
        top1, sqnr, iou, cer, cos, drop, ppl = None, None, None, None, None, None, None
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise OpfuseError(f"--max-drop {text!r}: {KEYS_HELP}")
        for part in parts:
            key, _, value = part.partition("=")
            try:
                if key == "top1":
                    top1 = _floor_share(
                        value, LOWEST_TOP1, "agreement", "top1=99% keeps agreement >= 99%"
                    )
                elif key == "sqnr":
                    sqnr = float(value.removesuffix("dB").removesuffix("db"))
                    if sqnr <= 0:
                        raise ValueError(
                            "an SQNR floor at or below 0 dB (noise as loud as the signal) "
                            "turns the gate off in effect; give a positive floor, or "
                            "--max-drop off"
                        )
                elif key == "cer":
                    cer = _ceiling_share(value, "CER", "cer=1% keeps the decoded text within 1%")
                elif key == "drop":
                    drop = _ceiling_share(value, "drop", "drop=1% keeps the task's figure within 1")
                elif key == "ppl":
                    ppl = _ceiling_share(
                        value, "perplexity increase", "ppl=5% keeps it within 5% of float's"
                    )
                elif key == "cos":
                    cos = _floor_share(value, LOWEST_COSINE, "cosine", "cos=0.99 keeps it >= 0.99")
                elif key == "iou":
                    iou = _floor_share(
                        value, LOWEST_MAP_IOU, "map IoU", "iou=90% keeps the map IoU >= 90%"
                    )
                else:
                    raise ValueError(KEYS_HELP)
            except ValueError as exc:
                raise OpfuseError(f"--max-drop {text!r}: {exc}") from None
        if top1 is None and sqnr is None:  # iou= or cer= alone: classes keep their floor
            top1 = DEFAULT_TOP1
        return cls(top1, sqnr, map_iou=iou, cer=cer, cosine=cos, drop=drop, perplexity=ppl)

    def map_floor(self) -> float | None:
        """The map IoU floor of a Sigmoid-made map (None: judged by its SQNR: ``sqnr=``
        given without ``iou=``)."""
        if self.map_iou is not None:
            return self.map_iou
        return DEFAULT_MAP_IOU if self.sqnr_db is None else None

    def cer_ceiling(self) -> float | None:
        """The CER ceiling of a CTC-like output (None: judged as any output that scores
        classes, by top-1 and SQNR: ``sqnr=`` given without ``cer=``)."""
        if self.cer is not None:
            return self.cer
        return DEFAULT_CER if self.sqnr_db is None else None

    def cosine_floor(self) -> float | None:
        """The mean-cosine floor of an embedding (None: judged by its SQNR: ``sqnr=``
        given without ``cos=``)."""
        if self.cosine is not None:
            return self.cosine
        return DEFAULT_COSINE if self.sqnr_db is None else None

    def by_cer(self, o: OutputAccuracy) -> bool:
        """Is ``o`` judged by its decoded text's CER (its per-step top-1 a diagnostic)."""
        return o.cer is not None and self.cer_ceiling() is not None

    def misses(self, outputs: Sequence[OutputAccuracy]) -> list[str]:
        """Why the figures miss the gate (empty: they pass)."""
        if self.off:
            return []
        out = []
        for o in outputs:
            if math.isnan(o.sqnr_db):  # a NaN in either model's output: nothing holds
                out.append(f"{o.name}: NaN in the output")
                continue
            if o.task is not None and o.task_float is not None:
                limit = self.drop if self.drop is not None else DEFAULT_DROP
                if o.task_float - o.task > limit + 1e-12:
                    out.append(
                        f"{o.name}: {o.task_name} {o.task:.4g} against {o.task_float:.4g} in "
                        f"float, a drop of {o.task_float - o.task:.4g} > {limit:g}"
                    )
                continue  # the task's own figure decides
            ceiling = self.cer_ceiling()
            if o.cer is not None and ceiling is not None:
                if o.cer > ceiling + 1e-12:
                    out.append(f"{o.name}: CER {o.cer:.2%} of the decoded text > {ceiling:.2%}")
                continue  # a text is judged by its CER, not per step nor by SQNR
            floor = self.cosine_floor()
            if o.embedding_cosine is not None and floor is not None:
                if o.embedding_cosine < floor - 1e-12:
                    out.append(f"{o.name}: embedding cosine {o.embedding_cosine:.4f} < {floor:g}")
                continue  # an embedding is judged by its cosine, not by SQNR
            if o.top1 is not None and self.top1 is not None and o.top1 < self.top1 - 1e-12:
                what = "next-token" if o.next_token else "top-1"
                out.append(f"{o.name}: {what} agreement {o.top1:.1%} < {self.top1:.1%}")
            out += self._perplexity_misses(o)
            iou_floor = self.map_floor() if o.map_iou is not None else None
            if iou_floor is not None and o.map_iou is not None:
                if o.map_iou < iou_floor - 1e-12:
                    out.append(f"{o.name}: map IoU {o.map_iou:.1%} < {iou_floor:.1%}")
                if self.sqnr_db is None:
                    continue  # a map is judged by its IoU, not its SQNR
            sqnr_floor = self.sqnr_db
            if sqnr_floor is None and o.top1 is None:
                sqnr_floor = DEFAULT_SQNR_DB
            if sqnr_floor is not None and o.sqnr_db < sqnr_floor:
                out.append(f"{o.name}: SQNR {o.sqnr_db:.1f} dB < {sqnr_floor:g} dB")
        return out

    def _perplexity_misses(self, o: OutputAccuracy) -> list[str]:
        change, ceiling = o.perplexity_change, self.perplexity
        if change is None or ceiling is None or change <= ceiling + 1e-12:
            return []
        return [f"{o.name}: perplexity {change:+.2%} against the float model's > +{ceiling:.0%}"]

    def better(
        self, a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy], strict: bool = False
    ) -> bool:
        """Are figures ``a`` better than ``b`` beyond their noise (how recipes and fallback
        tries are compared): fewer outputs missing the gate (the default gate's when this
        one is off); else a higher lowest top-1 agreement when the difference exceeds twice
        its standard error on the rows counted (on 160 rows near 95%, 3.4 points: a few
        rows more or less is not a difference); else a higher lowest map IoU by more than
        MAP_IOU_TIE where maps are judged by it; else, with top-1 within its noise, the
        SQNR: on the outputs that score classes only a large and consistent paired gain
        (``sqnr_verdict``), on the others (every output when the gate has an SQNR floor,
        ``sqnr=DB``) a higher lowest SQNR by 0.1 dB; ``a`` is better when it wins one of
        the two and loses neither, else it is a tie (not better). ``strict``: ``a`` is
        better only with a large and consistent paired SQNR gain on the outputs the gate
        judges, every one of them (and not worse by the rules above): how a change whose
        gain on the calibration data may not hold elsewhere is judged
        (``recipes.PAIRED``)."""
        judge = Gate() if self.off else self
        misses_a, misses_b = len(judge.misses(a)), len(judge.misses(b))
        if strict:
            return (
                misses_a <= misses_b
                and self._top1_verdict(a, b) >= 0
                and self._cer_verdict(a, b) >= 0
                and self._map_verdict(a, b) >= 0
                and sqnr_verdict(a, b, strict=True) > 0
            )
        if misses_a != misses_b:
            return misses_a < misses_b
        # the task's own figure first, then each kind's measure where the gate judges by it
        for verdict, judged in (
            (self._task_verdict, True),
            (self._cer_verdict, judge.cer_ceiling() is not None),
            (self._cosine_verdict, judge.cosine_floor() is not None),
            (self._top1_verdict, True),
            (self._map_verdict, judge.map_floor() is not None),
        ):
            found = verdict(a, b) if judged else 0
            if found:
                return found > 0
        # the SQNR of the outputs the gate judges by it (those that score no classes): on
        # an output that scores classes, top-1 within its noise is a tie, not a contest of
        # the lowest SQNR (on PP-OCRv4's recognizer the SQNR of 4 validation windows rose
        # step by step, 13.2 -> 16.6 dB, through minmax,bias-correction, mse and cle, while
        # the evaluation text's fell 15.6 -> 10.9 dB and its top-1 98.1% -> 95.0%); only a
        # paired gain large and consistent over enough samples counts there
        # (with an SQNR floor given, ``sqnr=DB``, every output is judged by its lowest SQNR)
        by_sqnr = judge.sqnr_db is not None
        by_iou = judge.map_floor() is not None  # a map judged by its IoU is no SQNR contest
        plain_a = [
            o.sqnr_db for o in a if by_sqnr or (o.top1 is None and not _judged_by_iou(o, by_iou))
        ]
        plain_b = [
            o.sqnr_db for o in b if by_sqnr or (o.top1 is None and not _judged_by_iou(o, by_iou))
        ]
        plain = 0
        if plain_a and plain_b:
            plain = (min(plain_a) > min(plain_b) + 0.1) - (min(plain_b) > min(plain_a) + 0.1)
        classes = 0 if by_sqnr else sqnr_verdict(a, b)
        return plain >= 0 and classes >= 0 and plain + classes > 0

    @staticmethod
    def _map_verdict(a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy]) -> int:
        """1: ``a``'s lowest map IoU is higher than ``b``'s by more than MAP_IOU_TIE; -1:
        lower; 0: within it, or no output is a map. The pixels of a map are not independent
        samples (a text line is thousands of them), so no binomial noise: a fixed margin."""
        return _higher([o.map_iou for o in a], [o.map_iou for o in b], MAP_IOU_TIE)

    @staticmethod
    def _task_verdict(a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy]) -> int:
        """1: ``a``'s lowest task figure is higher than ``b``'s by more than TASK_TIE; -1:
        lower; 0: within it, or no task figure."""
        return _higher([o.task for o in a], [o.task for o in b], TASK_TIE)

    @staticmethod
    def _cosine_verdict(a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy]) -> int:
        """1: ``a``'s lowest mean embedding cosine is higher than ``b``'s by more than
        COSINE_TIE; -1: lower; 0: within it, or no output is an embedding."""
        cos_a, cos_b = [o.embedding_cosine for o in a], [o.embedding_cosine for o in b]
        return _higher(cos_a, cos_b, COSINE_TIE)

    @staticmethod
    def _cer_verdict(a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy]) -> int:
        """1: ``a``'s highest CER is lower than ``b``'s beyond twice the standard error on
        the characters counted (a binomial share, as top-1's); -1: higher; 0: within it,
        or no output is CTC-like."""
        cer_a = [o for o in a if o.cer is not None]
        cer_b = [o for o in b if o.cer is not None]
        if not cer_a or not cer_b:
            return 0
        worst_a = max(cer_a, key=lambda o: o.cer or 0.0)
        worst_b = max(cer_b, key=lambda o: o.cer or 0.0)
        pa, pb = min(worst_a.cer or 0.0, 1.0), min(worst_b.cer or 0.0, 1.0)
        chars = min(worst_a.chars, worst_b.chars)
        p = (pa + pb) / 2
        noise = 2 * math.sqrt(max(p * (1 - p), 0.25 / max(chars, 1)) / chars) if chars else 0.0
        return (pb > pa) - (pa > pb) if abs(pa - pb) > noise else 0

    @staticmethod
    def _top1_verdict(a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy]) -> int:
        """1: ``a``'s lowest top-1 agreement is higher than ``b``'s beyond twice the
        standard error on the rows counted (on 160 rows near 95%, 3.4 points); -1: lower;
        0: within it, or no output scores classes."""
        top_a = [o for o in a if o.top1 is not None and o.cer is None]
        top_b = [o for o in b if o.top1 is not None and o.cer is None]
        if not top_a or not top_b:
            return 0
        worst_a = min(top_a, key=lambda o: o.top1 or 0.0)
        worst_b = min(top_b, key=lambda o: o.top1 or 0.0)
        pa, pb = worst_a.top1 or 0.0, worst_b.top1 or 0.0
        rows = min(worst_a.rows, worst_b.rows)
        p = (pa + pb) / 2
        noise = 2 * math.sqrt(max(p * (1 - p), 0.25 / max(rows, 1)) / rows) if rows else 0.0
        return (pa > pb) - (pb > pa) if abs(pa - pb) > noise else 0

    def describe(self, measures: Collection[str] | None = None) -> str:
        """The gate in words; ``measures``: only the parts for outputs of those kinds
        (``OutputAccuracy.measure``: the model's own; None: every part)."""
        if self.off:
            return "off"

        def wanted(kind: str) -> bool:
            return measures is None or kind in measures

        parts = []
        if self.top1 is not None and wanted("top1"):
            parts.append(
                f"top-1 agreement >= {self.top1:.0%} where an output scores classes or holds labels"
            )
        if self.top1 is not None and measures is not None and "next_token" in measures:
            parts.append(f"next-token agreement >= {self.top1:.0%} on a decoder's logits")
        if self.perplexity is not None and wanted("next_token"):
            parts.append(f"perplexity <= +{self.perplexity:.0%} of float's on a decoder's logits")
        iou = self.map_floor()
        if iou is not None and wanted("map_iou"):
            parts.append(f"map IoU >= {iou:.0%} where a Sigmoid makes a map")
        cer = self.cer_ceiling()
        if cer is not None and wanted("cer"):
            parts.append(f"CER <= {cer:.0%} of the decoded text where an output is CTC-like")
        cosine = self.cosine_floor()
        if cosine is not None and wanted("embedding_cosine"):
            parts.append(f"embedding cosine >= {cosine:g} (mean) where an output is an embedding")
        if wanted("drop") and (self.drop is not None or measures is not None):
            drop = self.drop if self.drop is not None else DEFAULT_DROP
            parts.append(f"a drop of the task's figure <= {drop:g} where one is given")
        if wanted("sqnr") or self.sqnr_db is not None:
            parts.append(
                f"SQNR >= {self.sqnr_db if self.sqnr_db is not None else DEFAULT_SQNR_DB:g} dB"
                + ("" if self.sqnr_db is not None else " elsewhere")
            )
        return "; ".join(parts)

    def loosened(self, outputs: Sequence[OutputAccuracy]) -> str | None:
        """The ``--max-drop`` value nearest this gate that ``outputs`` pass: each floor they
        miss lowered to their figure, rounded down to a whole percent or dB (None: they
        pass this gate, the gate is off, or such a floor would be refused)."""
        if self.off or not self.misses(outputs):
            return None
        top1, sqnr, iou, floor = self.top1, self.sqnr_db, self.map_iou, self.map_floor()
        cer, ceiling = self.cer, self.cer_ceiling()
        cos, cos_floor = self.cosine, self.cosine_floor()
        drop, ppl = self.drop, self.perplexity
        for o in outputs:
            if o.task is not None and o.task_float is not None:
                lost = o.task_float - o.task
                if lost > (drop if drop is not None else DEFAULT_DROP):
                    drop = math.ceil(lost * 100 - 1e-9) / 100
                continue
            low = o.embedding_cosine
            if low is not None and cos_floor is not None and low < (cos or cos_floor):
                cos = math.floor(low * 1000 + 1e-9) / 1000
            if o.cer is not None and ceiling is not None and o.cer > (cer or ceiling):
                cer = math.ceil(o.cer * 100 - 1e-9) / 100
            judged = o.top1 is not None and top1 is not None and not self.by_cer(o)
            if judged and o.top1 is not None and top1 is not None and o.top1 < top1:
                top1 = math.floor(o.top1 * 100 + 1e-9) / 100
            if o.map_iou is not None and floor is not None and o.map_iou < (iou or floor):
                iou = math.floor(o.map_iou * 100 + 1e-9) / 100
            change = o.perplexity_change
            if change is not None and ppl is not None and change > ppl:
                ppl = math.ceil(change * 100 - 1e-9) / 100
        loose = Gate(top1, sqnr, map_iou=iou, cer=cer, cosine=cos, drop=drop, perplexity=ppl)
        if any("SQNR" in m for m in loose.misses(outputs)):
            # an explicit SQNR floor judges every output, the maps too (kept to their IoU
            # floor by giving it)
            maps = floor is not None and any(o.map_iou is not None for o in outputs)
            iou = (iou or floor) if maps else iou
            lowest = min(o.sqnr_db for o in outputs)
            loose = Gate(
                top1,
                float(math.floor(lowest)),
                map_iou=iou,
                cer=cer,
                cosine=cos,
                drop=drop,
                perplexity=ppl,
            )
        option = loose.option()
        try:
            again = Gate.parse(option)
        except OpfuseError:
            return None
        return None if again.misses(outputs) else option

    def option(self) -> str:
        """The ``--max-drop`` value that gives this gate."""
        if self.off:
            return "off"
        parts = []
        if self.top1 is not None:
            parts.append(f"top1={self.top1 * 100:g}%")
        if self.sqnr_db is not None:
            parts.append(f"sqnr={self.sqnr_db:g}")
        if self.map_iou is not None:
            parts.append(f"iou={self.map_iou * 100:g}%")
        if self.cer is not None:
            parts.append(f"cer={self.cer * 100:g}%")
        if self.cosine is not None:
            parts.append(f"cos={self.cosine:g}")
        if self.drop is not None:
            parts.append(f"drop={self.drop * 100:g}%")
        if self.perplexity is not None:
            parts.append(f"ppl={self.perplexity * 100:g}%")
        return ",".join(parts) or "auto"


def paired_gain(a: OutputAccuracy, b: OutputAccuracy) -> tuple[int, float, float, float]:
    """Per sample, ``a``'s SQNR minus ``b``'s (each capped at SQNR_CAP_DB): the samples
    paired, the mean gain, its standard error and the share of the samples where they
    differ that ``a`` is ahead on (0 samples: not paired, the figures hold no per-sample
    SQNR or not on the same samples)."""
    if not a.samples_sqnr_db or len(a.samples_sqnr_db) != len(b.samples_sqnr_db):
        return 0, 0.0, 0.0, 0.0
    cap = SQNR_CAP_DB
    gains = [
        min(x, cap) - min(y, cap) for x, y in zip(a.samples_sqnr_db, b.samples_sqnr_db, strict=True)
    ]
    n = len(gains)
    mean = sum(gains) / n
    var = sum((g - mean) ** 2 for g in gains) / (n - 1) if n > 1 else math.inf
    ahead = sum(g > 0 for g in gains)
    apart = ahead + sum(g < 0 for g in gains)
    return n, mean, math.sqrt(var / n), ahead / apart if apart else 0.0


def consistent_gain(a: OutputAccuracy, b: OutputAccuracy) -> bool:
    """``a``'s SQNR beats ``b``'s largely and consistently: by CLASS_GAIN_DB or more on
    the whole (the figure the gate reads) and sample by sample (the CLASS_* thresholds)."""
    n, mean, se, ahead = paired_gain(a, b)
    return (
        n >= CLASS_MIN_SAMPLES
        and a.sqnr_db - b.sqnr_db >= CLASS_GAIN_DB
        and mean >= CLASS_GAIN_DB
        and mean > 2 * se
        and ahead >= CLASS_WINS - 1e-9
    )


def sqnr_verdict(
    a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy], strict: bool = False
) -> int:
    """1: ``a``'s SQNR is ahead of ``b``'s largely and consistently (``consistent_gain``)
    on an output that scores classes and behind on none; -1 the reverse; 0 neither (a
    tie). ``strict``: on every output, and 1 only when ahead on every one."""
    other = {o.name: o for o in b}
    pairs = [(o, other[o.name]) for o in a if o.name in other and (strict or o.top1 is not None)]
    ahead = [consistent_gain(x, y) for x, y in pairs]
    behind = [consistent_gain(y, x) for x, y in pairs]
    if strict:
        return int(bool(pairs) and all(ahead)) - int(any(behind))
    return int(any(ahead) and not any(behind)) - int(any(behind) and not any(ahead))


def _higher(a: Sequence[float | None], b: Sequence[float | None], tie: float) -> int:
    """1: the lowest of ``a`` is higher than the lowest of ``b`` by more than ``tie``; -1:
    lower; 0: within it, or either has no figure (None: the output has none)."""
    low_a = min((x for x in a if x is not None), default=None)
    low_b = min((x for x in b if x is not None), default=None)
    if low_a is None or low_b is None:
        return 0
    return (low_a > low_b + tie) - (low_b > low_a + tie)


def _judged_by_iou(o: OutputAccuracy, by_iou: bool) -> bool:
    return by_iou and o.map_iou is not None


def _floor_share(value: str, lowest: float, what: str, example: str) -> float:
    """A floor given as a share (``99%`` or ``0.99``); one below ``lowest`` turns the gate
    off in effect and is refused (ValueError, said with the option)."""
    share = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
    if not 0 <= share <= 1:
        raise ValueError("a share between 0 and 100%")
    if share < lowest:
        key = example.split("=")[0]
        raise ValueError(
            f"a floor of {share:.0%} {what} turns the gate off in effect ({key} is a floor: "
            f"{example}); give at least {lowest:.0%}, or --max-drop off"
        )
    return share


def _ceiling_share(value: str, what: str, example: str) -> float:
    """A ceiling given as a share (``1%`` or ``0.01``); above HIGHEST_CER (half the text
    misread, half the answers lost) it turns the gate off in effect and is refused."""
    share = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
    if not 0 <= share <= 1:
        raise ValueError("a share between 0 and 100%")
    if share > HIGHEST_CER:
        key = example.split("=")[0]
        raise ValueError(
            f"a ceiling of {share:.0%} {what} turns the gate off in effect ({key} is a "
            f"ceiling: {example}); give at most {HIGHEST_CER:.0%}, or --max-drop off"
        )
    return share
