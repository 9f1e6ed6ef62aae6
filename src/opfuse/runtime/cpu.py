"""The CPU features that decide whether int8 pays: VNNI (a fused u8 x s8 -> s32 dot
product), AMX (int8 tile multiplies), AVX-512 and AVX2, read from ``/proc/cpuinfo``.

Without VNNI an int8 dot product on x86 takes three instructions (vpmaddubsw, vpmaddwd,
vpaddd) against one fused multiply-add per float lane, so int8 kernels are at best even
with float ones and the Q/DQ around them is a loss; with VNNI it is one instruction
(vpdpbusd) over four times the lanes. Elsewhere (not Linux, no cpuinfo) the features are
unknown and said so."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# the input-channel (reduction) multiple of int8 kernels: 4 bytes summed into each int32 lane
REDUCTION_MULTIPLE = 4


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's instruction-set flags (empty when they could not be read)."""

    flags: frozenset[str]
    known: bool = True  # False when the flags could not be read at all

    @property
    def avx2(self) -> bool:
        return "avx2" in self.flags

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def vnni(self) -> bool:
        """AVX512-VNNI or AVX-VNNI (the 256-bit VEX form of Alder Lake and later)."""
        return "avx512_vnni" in self.flags or "avx_vnni" in self.flags

    @property
    def amx(self) -> bool:
        return "amx_int8" in self.flags or "amx_tile" in self.flags

    @property
    def channel_multiple(self) -> int:
        """The output-channel multiple an int8 Conv/MatMul kernel fills whole: one vector
        register of int32 accumulators, since an int8 dot product (vpdpbusd, or
        vpmaddubsw + vpmaddwd) sums 4 byte products into each 32-bit lane: 16 lanes for
        AVX-512, 8 for AVX2, 4 for 128-bit SSE/NEON. A count that is not a multiple
        leaves a partly filled register (masked or scalar tail) in every output row."""
        if self.avx512:
            return 16
        if self.avx2:
            return 8
        return 4

    def describe(self) -> str:
        """e.g. ``AVX2, AVX-512, AVX512-VNNI; no AMX``."""
        if not self.known:
            return f"CPU features unknown ({platform.system() or 'this system'})"
        have = []
        if self.avx2:
            have.append("AVX2")
        if self.avx512:
            have.append("AVX-512")
        if "avx512_vnni" in self.flags:
            have.append("AVX512-VNNI")
        if "avx_vnni" in self.flags:
            have.append("AVX-VNNI")
        if self.amx:
            have.append("AMX")
        missing = []
        if not self.vnni:
            missing.append("VNNI")
        if not self.amx:
            missing.append("AMX")
        text = ", ".join(have) if have else "no AVX2"
        return f"{text}; no {', no '.join(missing)}" if missing else text

    def int8_verdict(self) -> str:
        """One sentence: is int8 expected to pay here, and what would make it pay."""
        if not self.known:
            return (
                "The CPU features could not be read, so whether int8 pays here is only "
                "known from the measurement."
            )
        if self.amx:
            return (
                "This CPU has AMX and VNNI: int8 matrix kernels should run several times "
                "faster than float; measure to confirm the Q/DQ overhead does not eat it."
            )
        if self.vnni:
            return (
                "This CPU has VNNI (one-instruction int8 dot products): int8 Conv/MatMul "
                "kernels are expected to pay where they dominate the time; layers left in "
                "float and unfused Q/DQ pairs can still eat the gain, so measure."
            )
        if self.avx2:
            return (
                "This CPU has no VNNI: an int8 dot product costs three instructions against "
                "one float FMA, so int8 is expected to be at best even with float on "
                "onnxruntime; a CPU with VNNI or AMX, or an accelerator, would make it pay."
            )
        return (
            "This CPU has neither AVX2 nor VNNI: int8 kernels are not expected to pay; a "
            "CPU with VNNI or AMX, or an accelerator, would."
        )


def parse_cpuinfo(text: str) -> CpuFeatures:
    """The flags of the first processor in a ``/proc/cpuinfo`` text (x86 ``flags``, Arm
    ``Features``); unknown when there is no such line."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return CpuFeatures(frozenset(value.split()))
    return CpuFeatures(frozenset(), known=False)


def cpu_features(path: Path = CPUINFO) -> CpuFeatures:
    """This machine's CPU features; unknown where ``/proc/cpuinfo`` cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuFeatures(frozenset(), known=False)
    return parse_cpuinfo(text)
