"""The accuracy gate (``--max-drop``) and the fallback that keeps the most sensitive layers
in float.

``top1=1%``: top-1 agreement with the float model of at least 99% on every output that
scores classes (Intel Neural Compressor's default tolerance is 1% relative accuracy loss;
agreement with the float model is the measure available without labels). ``sqnr=25``: an
SQNR of at least 25 dB on every output. The default, ``auto``, is ``top1=1%`` where an
output scores classes and ``sqnr=20`` elsewhere: 20 dB is a noise power of 1% of the
signal's, the level at which detection boxes and embeddings start to move measurably
(onnxruntime's own QDQ debugging guide flags layers below it). ``off`` disables it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opfuse.errors import OpfuseError
from opfuse.quantization.accuracy import OutputAccuracy

DEFAULT_TOP1_DROP = 0.01
DEFAULT_SQNR_DB = 20.0


@dataclass(frozen=True)
class Gate:
    top1_drop: float | None = DEFAULT_TOP1_DROP  # None: not checked
    sqnr_db: float | None = None  # None: checked only on outputs that score no classes
    off: bool = False

    @classmethod
    def parse(cls, text: str | None) -> Gate:
        if text is None or text == "auto":
            return cls()
        if text == "off":
            return cls(None, None, off=True)
        top1, sqnr = None, None
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            try:
                if key == "top1":
                    top1 = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
                    if not 0 <= top1 < 1:
                        raise ValueError("a share between 0 and 100%")
                elif key == "sqnr":
                    sqnr = float(value)
                else:
                    raise ValueError("expected top1=P% or sqnr=DB")
            except ValueError as exc:
                raise OpfuseError(f"--max-drop {text!r}: {exc}") from None
        return cls(top1, sqnr)

    def misses(self, outputs: Sequence[OutputAccuracy]) -> list[str]:
        """Why the figures miss the gate (empty: they pass)."""
        if self.off:
            return []
        out = []
        for o in outputs:
            floor = None if self.top1_drop is None else 1 - self.top1_drop
            if o.top1 is not None and floor is not None and o.top1 < floor - 1e-12:
                out.append(f"{o.name}: top-1 agreement {o.top1:.1%} < {floor:.1%}")
            sqnr_floor = self.sqnr_db
            if sqnr_floor is None and o.top1 is None:
                sqnr_floor = DEFAULT_SQNR_DB
            if sqnr_floor is not None and o.sqnr_db < sqnr_floor:
                out.append(f"{o.name}: SQNR {o.sqnr_db:.1f} dB < {sqnr_floor:g} dB")
        return out

    def describe(self) -> str:
        if self.off:
            return "off"
        parts = []
        if self.top1_drop is not None:
            parts.append(
                f"top-1 agreement >= {1 - self.top1_drop:.0%} where an output scores classes"
            )
        parts.append(
            f"SQNR >= {self.sqnr_db if self.sqnr_db is not None else DEFAULT_SQNR_DB:g} dB"
            + ("" if self.sqnr_db is not None else " elsewhere")
        )
        return "; ".join(parts)
