"""CPU features from /proc/cpuinfo text: the flags that decide whether int8 pays."""

from __future__ import annotations

from pathlib import Path

from opfuse.runtime.cpu import CpuFeatures, cpu_features, parse_cpuinfo

# abridged from real machines: the first processor's block is the one read
VNNI_AVX512 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 avx f16c avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni
processor\t: 1
flags\t\t: fpu sse sse2
"""
AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx fma avx2\n"
SAPPHIRE = "flags\t: avx2 avx512f avx512_vnni avx_vnni amx_tile amx_int8 amx_bf16\n"
ALDER = "flags\t: avx2 avx_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 asimddp\n"


def test_avx512_vnni_machine() -> None:
    f = parse_cpuinfo(VNNI_AVX512)
    assert (f.avx2, f.avx512, f.vnni, f.amx) == (True, True, True, False)
    assert f.describe() == "AVX2, AVX-512, AVX512-VNNI; no AMX"
    assert f.channel_multiple == 16
    assert "has VNNI" in f.int8_verdict()


def test_avx2_without_vnni() -> None:
    f = parse_cpuinfo(AVX2_ONLY)
    assert (f.avx2, f.avx512, f.vnni, f.amx) == (True, False, False, False)
    assert f.describe() == "AVX2; no VNNI, no AMX"
    assert f.channel_multiple == 8
    verdict = f.int8_verdict()
    assert "no VNNI" in verdict and "VNNI or AMX" in verdict


def test_amx_and_avx_vnni() -> None:
    spr = parse_cpuinfo(SAPPHIRE)
    assert spr.amx and spr.vnni
    assert spr.describe() == "AVX2, AVX-512, AVX512-VNNI, AVX-VNNI, AMX"
    assert "AMX" in spr.int8_verdict()
    alder = parse_cpuinfo(ALDER)
    assert alder.vnni and not alder.avx512
    assert alder.describe() == "AVX2, AVX-VNNI; no AMX"


def test_arm_features_line_is_read() -> None:
    f = parse_cpuinfo(ARM)
    assert f.known and "asimd" in f.flags
    assert not f.vnni and f.channel_multiple == 4
    assert "neither AVX2 nor VNNI" in f.int8_verdict()


def test_unknown_without_flags_or_file(tmp_path: Path) -> None:
    assert not parse_cpuinfo("processor\t: 0\nmodel name\t: x\n").known
    missing = cpu_features(tmp_path / "no-cpuinfo")
    assert missing == CpuFeatures(frozenset(), known=False)
    assert missing.describe().startswith("CPU features unknown")
    assert "only known from the measurement" in missing.int8_verdict()


def test_reads_a_cpuinfo_file(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(VNNI_AVX512)
    assert cpu_features(path) == parse_cpuinfo(VNNI_AVX512)
