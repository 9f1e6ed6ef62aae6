"""The CPU features that decide whether int8 pays on this machine: VNNI (AVX512-VNNI or
AVX-VNNI: int8 dot products in one instruction), AMX (int8 matrix tiles), AVX-512, AVX2.
Without VNNI, onnxruntime's int8 kernels widen to int16 and often lose to float32."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuFeatures:
    flags: frozenset[str]
    known: bool = True  # False: not read (not Linux): nothing is claimed

    @property
    def vnni(self) -> bool:
        return bool({"avx512_vnni", "avx_vnni"} & self.flags)

    @property
    def amx(self) -> bool:
        return "amx_int8" in self.flags

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def avx2(self) -> bool:
        return "avx2" in self.flags

    def describe(self) -> str:
        if not self.known:
            return "CPU features unknown (not read on this system)"
        have = [n for n, on in (("AVX2", self.avx2), ("AVX-512", self.avx512),
                                ("VNNI", self.vnni), ("AMX", self.amx)) if on]  # fmt: skip
        missing = [n for n in ("VNNI", "AMX") if n not in have]
        return ", ".join(have or ["none of AVX2/AVX-512/VNNI/AMX"]) + (
            f"; no {', no '.join(missing)}" if missing else ""
        )

    def int8_hint(self) -> str:
        """What would make int8 pay where it does not here."""
        if not self.known:
            return "measure on the deployment machine"
        if not self.vnni:
            return (
                "this CPU has no VNNI: int8 pays on CPUs with VNNI or AMX, on OpenVINO, "
                "or on a GPU/NPU"
            )
        return "the CPU has VNNI: try more threads, OpenVINO, or keep the float model"


def cpu_features(cpuinfo: str | None = None) -> CpuFeatures:
    """Read the flags of the first processor in /proc/cpuinfo (or the text given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return CpuFeatures(frozenset(), known=False)
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return CpuFeatures(frozenset(value.split()))
    return CpuFeatures(frozenset(), known=False)
