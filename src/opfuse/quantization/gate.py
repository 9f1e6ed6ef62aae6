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
from collections.abc import Sequence
from dataclasses import dataclass

from opfuse.errors import OpfuseError
from opfuse.quantization.accuracy import OutputAccuracy
from opfuse.quantization.names import KEYS_HELP

DEFAULT_TOP1 = 0.99
DEFAULT_SQNR_DB = 20.0
DEFAULT_MAP_IOU = 0.9  # issue 31's goal for PP-OCRv4's detector
LOWEST_TOP1 = 0.5  # below: the gate is off in effect
LOWEST_MAP_IOU = 0.5


@dataclass(frozen=True)
class Gate:
    top1: float | None = DEFAULT_TOP1  # the floor of top-1 agreement; None: not checked
    sqnr_db: float | None = None  # None: checked only on outputs that score no classes
    off: bool = False
    # the floor of a Sigmoid-made map's IoU; None: DEFAULT_MAP_IOU unless sqnr= is given
    map_iou: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Gate:
        if text is None or text == "auto":
            return cls()
        if text == "off":
            return cls(None, None, off=True)
        top1, sqnr, iou = None, None, None
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise OpfuseError(f"--max-drop {text!r}: {KEYS_HELP}")
        for part in parts:
            key, _, value = part.partition("=")
            try:
                if key == "top1":
                    top1 = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
                    if not 0 <= top1 <= 1:
                        raise ValueError("a share between 0 and 100%")
                    if top1 < LOWEST_TOP1:
                        raise ValueError(
                            f"a floor of {top1:.0%} agreement turns the gate off in effect "
                            f"(top1 is a floor: top1=99% keeps agreement >= 99%); give at "
                            f"least {LOWEST_TOP1:.0%}, or --max-drop off"
                        )
                elif key == "sqnr":
                    sqnr = float(value.removesuffix("dB").removesuffix("db"))
                    if sqnr <= 0:
                        raise ValueError(
                            "an SQNR floor at or below 0 dB (noise as loud as the signal) "
                            "turns the gate off in effect; give a positive floor, or "
                            "--max-drop off"
                        )
                elif key == "iou":
                    iou = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
                    if not 0 <= iou <= 1:
                        raise ValueError("a share between 0 and 100%")
                    if iou < LOWEST_MAP_IOU:
                        raise ValueError(
                            f"a floor of {iou:.0%} map IoU turns the gate off in effect "
                            f"(iou is a floor: iou=90% keeps the map IoU >= 90%); give at "
                            f"least {LOWEST_MAP_IOU:.0%}, or --max-drop off"
                        )
                else:
                    raise ValueError(KEYS_HELP)
            except ValueError as exc:
                raise OpfuseError(f"--max-drop {text!r}: {exc}") from None
        return cls(top1, sqnr, map_iou=iou)

    def map_floor(self) -> float | None:
        """The map IoU floor of a Sigmoid-made map (None: judged by its SQNR: ``sqnr=``
        given without ``iou=``)."""
        if self.map_iou is not None:
            return self.map_iou
        return DEFAULT_MAP_IOU if self.sqnr_db is None else None

    def misses(self, outputs: Sequence[OutputAccuracy]) -> list[str]:
        """Why the figures miss the gate (empty: they pass)."""
        if self.off:
            return []
        out = []
        for o in outputs:
            if o.top1 is not None and self.top1 is not None and o.top1 < self.top1 - 1e-12:
                out.append(f"{o.name}: top-1 agreement {o.top1:.1%} < {self.top1:.1%}")
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

    def better(self, a: Sequence[OutputAccuracy], b: Sequence[OutputAccuracy]) -> bool:
        """Are figures ``a`` better than ``b`` beyond their noise (how recipes and fallback
        tries are compared): fewer outputs missing the gate (the default gate's when this
        one is off); else a higher lowest top-1 agreement when the difference exceeds twice
        its standard error on the rows counted (on 160 rows near 95%, 3.4 points: a few
        rows more or less is not a difference); else a higher lowest SQNR (by 0.1 dB) of
        the outputs the gate judges by it: those that score no classes, every output when
        the gate has an SQNR floor (``sqnr=DB``); none of them: a tie."""
        judge = Gate() if self.off else self
        misses_a, misses_b = len(judge.misses(a)), len(judge.misses(b))
        if misses_a != misses_b:
            return misses_a < misses_b
        top_a = [o for o in a if o.top1 is not None]
        top_b = [o for o in b if o.top1 is not None]
        if top_a and top_b:
            worst_a = min(top_a, key=lambda o: o.top1 or 0.0)
            worst_b = min(top_b, key=lambda o: o.top1 or 0.0)
            pa, pb = worst_a.top1 or 0.0, worst_b.top1 or 0.0
            rows = min(worst_a.rows, worst_b.rows)
            p = (pa + pb) / 2
            noise = 2 * math.sqrt(max(p * (1 - p), 0.25 / max(rows, 1)) / rows) if rows else 0.0
            if abs(pa - pb) > noise:
                return pa > pb
        # the SQNR of the outputs the gate judges by it (those that score no classes): on
        # an output that scores classes, top-1 within its noise is a tie, not a contest of
        # SQNR (on PP-OCRv4's recognizer the SQNR of 4 validation windows rose step by step,
        # 13.2 -> 16.6 dB, through minmax,bias-correction, mse and cle, while the
        # evaluation text's fell 15.6 -> 10.9 dB and its top-1 98.1% -> 95.0%)
        # (with an SQNR floor given, ``sqnr=DB``, every output is judged by it)
        by_sqnr = judge.sqnr_db is not None
        plain_a = [o.sqnr_db for o in a if by_sqnr or o.top1 is None]
        plain_b = [o.sqnr_db for o in b if by_sqnr or o.top1 is None]
        if not plain_a or not plain_b:
            return False
        return min(plain_a) > min(plain_b) + 0.1

    def describe(self) -> str:
        if self.off:
            return "off"
        parts = []
        if self.top1 is not None:
            parts.append(f"top-1 agreement >= {self.top1:.0%} where an output scores classes")
        iou = self.map_floor()
        if iou is not None:
            parts.append(f"map IoU >= {iou:.0%} where a Sigmoid makes a map")
        parts.append(
            f"SQNR >= {self.sqnr_db if self.sqnr_db is not None else DEFAULT_SQNR_DB:g} dB"
            + ("" if self.sqnr_db is not None else " elsewhere")
        )
        return "; ".join(parts)

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
        return ",".join(parts) or "auto"
