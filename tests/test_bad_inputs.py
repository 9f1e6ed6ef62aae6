"""Hostile and broken inputs: every case is one line on stderr naming the problem and the
file, exit status 2, no traceback, and nothing written.

The table runs ``opfuse.cli.main`` in-process (the console entry point, with its error
handling) so that it stays fast; ``test_real_process`` runs a few rows as a subprocess to
show the installed command behaves the same.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import run_cli

OUT = "out.onnx"


def small_model(opset: int = 17) -> onnx.ModelProto:
    """x[1,4] -> Add(w) -> Relu -> y, with a 4-float initializer."""
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "w"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def write_model(d: Path, model: onnx.ModelProto | None = None) -> Path:
    path = d / "m.onnx"
    onnx.save_model(model or small_model(), str(path))
    return path


def external_model(
    d: Path, location: str, length: int | str | None = None, offset: str = "0"
) -> Path:
    """A model whose ``w`` points to external data at ``location`` (the file is written
    beside the model as ``w.bin`` with the 16 real bytes)."""
    model = small_model()
    w = model.graph.initializer[0]
    (d / "w.bin").write_bytes(w.raw_data or numpy_helper.to_array(w).tobytes())
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": offset, "length": str(length or 16)}
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    path = d / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def empty(d: Path) -> list[str]:
    (d / "m.onnx").write_bytes(b"")
    return ["optimize", str(d / "m.onnx"), "-o", str(d / OUT)]


def text_file(d: Path) -> list[str]:
    (d / "m.onnx").write_text("this is a README, not a model\n" * 20)
    return ["optimize", str(d / "m.onnx"), "-o", str(d / OUT)]


def truncated(d: Path) -> list[str]:
    data = small_model().SerializeToString()
    (d / "m.onnx").write_bytes(data[: len(data) // 2])
    return ["optimize", str(d / "m.onnx"), "-o", str(d / OUT)]


def fails_checker(d: Path) -> list[str]:
    model = small_model()
    model.graph.node[1].input[0] = "nowhere"  # Relu reads a value nothing produces
    return ["optimize", str(write_model(d, model)), "-o", str(d / OUT)]


def transpose_of_wrong_rank(d: Path) -> list[str]:
    """Flatten's 2-D output transposed by a 3-D perm: onnx.checker passes it (no full
    check), onnxruntime refuses it; the layout pass indexed the dims by the perm (exit 3)."""
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["f"], axis=2),
            helper.make_node("Transpose", ["f"], ["t"], perm=[0, 2, 1]),
            helper.make_node("Reshape", ["t", "s"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])],
        [numpy_helper.from_array(np.array([1, 16, 8], np.int64), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ["optimize", str(write_model(d, model)), "-o", str(d / OUT)]


def opset(version: int) -> Callable[[Path], list[str]]:
    def case(d: Path) -> list[str]:
        return ["optimize", str(write_model(d, small_model(version))), "-o", str(d / OUT)]

    return case


def external(
    location: str | Callable[[Path], str], length: int | str | None = None, offset: str = "0"
):
    def case(d: Path) -> list[str]:
        loc = location(d) if callable(location) else location
        return ["optimize", str(external_model(d, loc, length, offset)), "-o", str(d / OUT)]

    return case


def absolute_location(d: Path) -> str:
    return str(d / "w.bin")


def escaping_location(d: Path) -> str:
    """Down into a folder and back up past the model's own."""
    return "sub/../../w.bin"


def escaping_case(d: Path) -> list[str]:
    """The model sits in d/models and reads d/w.bin through ``../``."""
    models = d / "models"
    models.mkdir()
    path = external_model(d, "../w.bin")
    path.rename(models / "m.onnx")
    return ["optimize", str(models / "m.onnx"), "-o", str(models / OUT)]


def symlink_case(d: Path) -> list[str]:
    """models/link.bin is a symlink to d/w.bin, outside the model's folder."""
    models = d / "models"
    models.mkdir()
    path = external_model(d, "link.bin")
    path.rename(models / "m.onnx")
    (models / "link.bin").symlink_to(d / "w.bin")
    return ["optimize", str(models / "m.onnx"), "-o", str(models / OUT)]


def output_is_input(d: Path) -> list[str]:
    path = write_model(d)
    return ["optimize", str(path), "-o", str(d / "." / "m.onnx")]


def output_folder(sub: str) -> Callable[[Path], list[str]]:
    def case(d: Path) -> list[str]:
        (d / "file").write_text("a regular file, not a folder")
        target = sub.replace("{d}", str(d))
        return ["optimize", str(write_model(d)), "-o", target]

    return case


def switch(content: str) -> Callable[[Path], list[str]]:
    def case(d: Path) -> list[str]:
        (d / "switch.json").write_text(content)
        return [
            "optimize",
            str(write_model(d)),
            "-o",
            str(d / OUT),
            "--fusion-switch-file",
            str(d / "switch.json"),
        ]

    return case


def cut(option: str, name: str) -> Callable[[Path], list[str]]:
    def case(d: Path) -> list[str]:
        return ["optimize", str(write_model(d)), "-o", str(d / OUT), option, name]

    return case


def npz(**arrays: np.ndarray) -> Callable[[Path], list[str]]:
    def case(d: Path) -> list[str]:
        np.savez(d / "inputs.npz", **arrays)
        return [
            "optimize",
            str(write_model(d)),
            "-o",
            str(d / OUT),
            "--verify-inputs",
            str(d / "inputs.npz"),
        ]

    return case


def not_npz(d: Path) -> list[str]:
    (d / "inputs.npz").write_text("not numpy")
    return [
        "optimize",
        str(write_model(d)),
        "-o",
        str(d / OUT),
        "--verify-inputs",
        str(d / "inputs.npz"),
    ]


def verify_bad_original(d: Path) -> list[str]:
    (d / "good.onnx").write_bytes(small_model().SerializeToString())
    (d / "m.onnx").write_bytes(b"")
    return ["verify", str(d / "m.onnx"), str(d / "good.onnx")]


def command(*args: str, setup: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    """Any command on a good model: ``{m}`` is the model written to d/m.onnx, ``{d}`` the
    folder; ``setup`` writes the other files the case reads."""

    def case(d: Path) -> list[str]:
        model = write_model(d)
        if setup:
            setup(d)
        return [a.replace("{m}", str(model)).replace("{d}", str(d)) for a in args]

    return case


def write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        if isinstance(data, bytes):
            (d / name).write_bytes(data)
        else:
            (d / name).write_text(data)

    return setup


def npz_file(**arrays: np.ndarray) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        np.savez(d / "inputs.npz", **arrays)

    return setup


def empty_model(command_args: list[str]) -> Callable[[Path], list[str]]:
    def case(d: Path) -> list[str]:
        (d / "m.onnx").write_bytes(b"")
        return [a.replace("{m}", str(d / "m.onnx")).replace("{d}", str(d)) for a in command_args]

    return case


def two_inputs(*args: str) -> Callable[[Path], list[str]]:
    """``{m}``: z = x + y with x, y of shape [N, 4] (N symbolic)."""

    def case(d: Path) -> list[str]:
        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "y"], ["z"], name="add")],
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in "xy"],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path = write_model(d, model)
        return [a.replace("{m}", str(path)).replace("{d}", str(d)) for a in args]

    return case


CLASHING_SHAPES = ("--input-shape", "x:2,4", "--input-shape", "y:3,4")
BINARY = bytes(range(256)) * 8  # not UTF-8 from byte 128 on
PROFILE = ["profile", "{m}", "--runs", "1", "--warmup", "0"]
ADVISE = ["advise", "{m}", "--runs", "1", "--warmup", "0"]
OP_SUMMARY = "Op Name,OP Type,Task Duration(us)\nadd,Add,1.5\n"


@dataclass
class Case:
    make: Callable[[Path], list[str]]
    message: str  # a part of the one-line message
    file: str | None = "m.onnx"  # the file the message must name (None: see `message`)


X = np.zeros((1, 4), np.float32)
CASES = {
    "empty file": Case(empty, "empty file"),
    "text file": Case(text_file, "not an ONNX model"),
    "truncated protobuf": Case(truncated, "not an ONNX model or truncated"),
    "fails onnx.checker": Case(fails_checker, "fails onnx.checker"),
    "transpose of the wrong rank": Case(transpose_of_wrong_rank, "Invalid attribute perm"),
    "opset too new": Case(opset(99), "opset 99 is not supported"),
    "external data missing": Case(external("gone.bin"), "external data file 'gone.bin' is missing"),
    "external data short": Case(
        external("w.bin", length=64), "is shorter (16 bytes) than declared"
    ),
    "external data offset not a number": Case(
        external("w.bin", offset="4k"), "has external data offset '4k'; expected a byte count"
    ),
    "external data length not a number": Case(
        external("w.bin", length="16.0"), "has external data length '16.0'; expected a byte count"
    ),
    "external data offset negative": Case(
        external("w.bin", offset="-8"), "has external data offset '-8'"
    ),
    "external data absolute": Case(external(absolute_location), "absolute external data location"),
    "external data ../": Case(escaping_case, "outside the model's folder"),
    "external data ../ and back": Case(external(escaping_location), "outside the model's folder"),
    "external data symlink out": Case(symlink_case, "outside the model's folder"),
    "output is the input": Case(output_is_input, "output path is the input model"),
    "output folder missing": Case(
        output_folder("{d}/nowhere/out.onnx"), "does not exist", "nowhere"
    ),
    # root ignores chmod, so unwritable folders are a path under a regular file and /proc
    "output folder is a file": Case(output_folder("{d}/file/out.onnx"), "is not a folder", "file"),
    "output folder /proc": Case(output_folder("/proc/opfuse-test.onnx"), "cannot write", "/proc"),
    "switch file not JSON": Case(
        switch("{GraphFusion: on"), "switch file is not JSON", "switch.json"
    ),
    "switch value On": Case(
        switch('{"Switch": {"GraphFusion": {"ALL": "On"}}}'), 'is "On"; must be', "switch.json"
    ),
    "switch value 1": Case(
        switch('{"Switch": {"GraphFusion": {"ConvBatchNormFusionPass": 1}}}'),
        'is 1; must be "on" or "off"',
        "switch.json",
    ),
    "switch unknown pass": Case(
        switch('{"Switch": {"GraphFusion": {"NoSuchFusionPass": "on"}}}'),
        "unknown pass 'NoSuchFusionPass'",
        "switch.json",
    ),
    "--keep-inputs unknown": Case(
        cut("--keep-inputs", "ghost"), "'ghost' given to --keep-inputs/--keep-outputs"
    ),
    "--keep-outputs unknown": Case(
        cut("--keep-outputs", "ghost"), "'ghost' given to --keep-inputs/--keep-outputs"
    ),
    "npz missing input": Case(npz(other=X), "has no array for model input 'x'", "inputs.npz"),
    "npz wrong dtype": Case(npz(x=X.astype(np.float64)), "is float64", "inputs.npz"),
    "npz wrong shape": Case(npz(x=np.zeros((2, 4), np.float32)), "has shape [2, 4]", "inputs.npz"),
    "npz extra array": Case(npz(x=X, z=X), "'z' is not a model input", "inputs.npz"),
    "npz not numpy": Case(not_npz, "cannot read inputs .npz", "inputs.npz"),
    "--input-shape wrong rank": Case(
        command("optimize", "{m}", "-o", "{d}/out.onnx", "--input-shape", "x:1,2,3"),
        "input 'x' has rank 2 [1,4]; give 2 dims",
        "--input-shape x:1,2,3",
    ),
    "--input-shape fixed dim": Case(
        command("optimize", "{m}", "-o", "{d}/out.onnx", "--input-shape", "x:1,5"),
        "its dim 1 is fixed at 4",
        "--input-shape x:1,5",
    ),
    "--no-verify --verify-inputs": Case(
        command(
            "optimize",
            "{m}",
            "-o",
            "{d}/out.onnx",
            "--no-verify",
            "--verify-inputs",
            "{d}/inputs.npz",
            setup=write("inputs.npz", "not numpy"),
        ),
        "--verify-inputs has no effect with --no-verify",
        None,
    ),  # fmt: skip
    "--no-verify --input-shape": Case(
        command("optimize", "{m}", "-o", "{d}/out.onnx", "--no-verify", "--input-shape", "x:1,4"),
        "--input-shape has no effect with --no-verify",
        None,
    ),
    "--verify-inputs and --input-shape": Case(
        command(
            "optimize",
            "{m}",
            "-o",
            "{d}/out.onnx",
            "--verify-inputs",
            "{d}/inputs.npz",
            "--input-shape",
            "x:1,4",
            setup=npz_file(x=X),
        ),
        "both give the input shapes",
        "inputs.npz",
    ),  # fmt: skip
    # -- verify ORIGINAL OPTIMIZED
    "verify: empty original": Case(verify_bad_original, "empty file"),
    "verify: optimized missing": Case(
        command("verify", "{m}", "{d}/gone.onnx"), "gone.onnx: no such file", None
    ),
    "verify: optimized not a model": Case(
        command("verify", "{m}", "{d}/o.onnx", setup=write("o.onnx", BINARY)),
        "not an ONNX model",
        "o.onnx",
    ),
    "verify: --input-shape wrong rank": Case(
        command("verify", "{m}", "{m}", "--input-shape", "x:1,2,3"),
        "input 'x' has rank 2 [1,4]; give 2 dims",
        "--input-shape x:1,2,3",
    ),
    "verify: --input-shape dims that clash": Case(
        two_inputs("verify", "{m}", "{m}", *CLASHING_SHAPES),
        "onnxruntime cannot run the model on inputs x [2, 4], y [3, 4]",
    ),
    "verify: --input-shape unknown input": Case(
        command("verify", "{m}", "{m}", "--input-shape", "ghost:1,4"),
        "names 'ghost', which is not a model input (x)",
        None,
    ),
    "verify: --input-shape negative": Case(
        command("verify", "{m}", "{m}", "--input-shape", "x:1,-4"),
        "dims must be 0 or more",
        "--input-shape 'x:1,-4'",
    ),
    "verify: --input-shape not integers": Case(
        command("verify", "{m}", "{m}", "--input-shape", "x:1,four"),
        "expected NAME:D0,D1,... with integers",
        "--input-shape 'x:1,four'",
    ),
    "verify: --verify-inputs wrong shape": Case(
        command(
            "verify",
            "{m}",
            "{m}",
            "--verify-inputs",
            "{d}/inputs.npz",
            setup=npz_file(x=np.zeros((2, 4), np.float32)),
        ),
        "has shape [2, 4]",
        "inputs.npz",
    ),  # fmt: skip
    "verify: --verify-inputs and --input-shape": Case(
        command(
            "verify",
            "{m}",
            "{m}",
            "--verify-inputs",
            "{d}/inputs.npz",
            "--input-shape",
            "x:1,4",
            setup=npz_file(x=X),
        ),
        "both give the input shapes",
        "inputs.npz",
    ),  # fmt: skip
    # -- profile MODEL
    "profile: empty model": Case(empty_model(PROFILE), "empty file"),
    "profile: output is the input": Case(
        command(*PROFILE, "-o", "{m}"), "output path is the input model"
    ),
    "profile: output folder missing": Case(
        command(*PROFILE, "-o", "{d}/nowhere/p.json"), "does not exist", "nowhere"
    ),
    "profile: output folder is a file": Case(
        command(*PROFILE, "-o", "{d}/m.onnx/p.json"), "is not a folder", "m.onnx"
    ),
    "profile: output folder /proc": Case(
        command(*PROFILE, "-o", "/proc/opfuse-test.onnx"), "cannot write", "/proc"
    ),
    "profile: --input-shape wrong rank": Case(
        command(*PROFILE, "--input-shape", "x:1,2,3"),
        "input 'x' has rank 2 [1,4]; give 2 dims",
        "--input-shape x:1,2,3",
    ),
    "profile: --input-shape dims that clash": Case(
        two_inputs(*PROFILE, *CLASHING_SHAPES),
        "onnxruntime cannot run the model on inputs x [2, 4], y [3, 4]",
    ),
    "profile: --runs 0": Case(
        command("profile", "{m}", "--runs", "0"), "--runs 0: must be 1 or more", None
    ),
    "advise: --threads -1": Case(
        command("advise", "{m}", "--threads", "-1"), "--threads -1: must be 0 or more", None
    ),
    "tune: --static-shapes alone": Case(
        command("tune", "{m}", "-o", "{d}/t.onnx", "--static-shapes"),
        "--static-shapes needs --input-shape NAME:D0,D1,... for the inputs",
        None,
    ),
    "tune: --runtimes unknown": Case(
        command("tune", "{m}", "-o", "{d}/t.onnx", "--runtimes", "onnxruntime,tvm"),
        "--runtimes 'tvm': expected some of onnxruntime, openvino",
        None,
    ),
    # -- advise [MODEL]
    "advise: empty model": Case(empty_model(ADVISE), "empty file"),
    "advise: output is the input": Case(
        command(*ADVISE, "-o", "{m}"), "output path is the input model"
    ),
    "advise: output is the profile": Case(
        command(
            "advise",
            "{m}",
            "--profile",
            "{d}/p.json",
            "-o",
            "{d}/p.json",
            setup=write("p.json", "[]"),
        ),
        "output path is the profile",
        "p.json",
    ),  # fmt: skip
    "advise: output is the op summary": Case(
        command(
            "advise",
            "--op-summary",
            "{d}/s.csv",
            "-o",
            "{d}/s.csv",
            setup=write("s.csv", OP_SUMMARY),
        ),
        "output path is the op summary",
        "s.csv",
    ),  # fmt: skip
    "advise: output folder missing": Case(
        command(*ADVISE, "-o", "{d}/nowhere/r.txt"), "does not exist", "nowhere"
    ),
    "advise: output folder /proc": Case(
        command(*ADVISE, "-o", "/proc/opfuse-test.onnx"), "cannot write", "/proc"
    ),
    "advise: --input-shape wrong rank": Case(
        command(*ADVISE, "--input-shape", "x:1,2,3"),
        "input 'x' has rank 2 [1,4]; give 2 dims",
        "--input-shape x:1,2,3",
    ),
    "advise: binary op summary": Case(
        command("advise", "--op-summary", "{d}/s.csv", setup=write("s.csv", BINARY)),
        "not a text CSV (byte 128 is not UTF-8)",
        "s.csv",
    ),
    "advise: op summary without durations": Case(
        command("advise", "--op-summary", "{d}/s.csv", setup=write("s.csv", "Op Name,OP Type\n")),
        "lacks the column(s) Task Duration(us)",
        "s.csv",
    ),
    "advise: binary profile": Case(
        command("advise", "{m}", "--profile", "{d}/p.json", setup=write("p.json", BINARY)),
        "not JSON (byte 128 is not UTF-8)",
        "p.json",
    ),
    "advise: profile not JSON": Case(
        command("advise", "{m}", "--profile", "{d}/p.json", setup=write("p.json", "[{")),
        "not JSON",
        "p.json",
    ),
    "advise: profile with a non-numeric duration": Case(
        command(
            "advise",
            "{m}",
            "--profile",
            "{d}/p.json",
            setup=write(
                "p.json",
                '[{"cat": "Node", "name": "n_kernel_time", "ts": 1, "dur": "abc", "args": {}}]',
            ),
        ),
        "has dur 'abc', not a number",
        "p.json",
    ),
    "advise: profile with a non-numeric run start": Case(
        command(
            "advise",
            "{m}",
            "--profile",
            "{d}/p.json",
            setup=write("p.json", '[{"cat": "Session", "name": "model_run", "ts": "x"}]'),
        ),
        "has ts 'x', not a number",
        "p.json",
    ),
    "advise: profile missing": Case(
        command("advise", "{m}", "--profile", "{d}/p.json"), "cannot read the profile", "p.json"
    ),
    "advise: no model": Case(command("advise"), "give a MODEL, or --op-summary", None),
    "advise: unknown target": Case(
        command(*ADVISE, "--target", "tpu"), "built-in targets are ascend310, cpu, cuda", None
    ),
}


def snapshot(d: Path) -> dict[str, str]:
    """Every file's content hash (and every folder) under d."""
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in d.rglob("*")
    }


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, tmp_path, monkeypatch, capsys):
    case = CASES[name]
    args = case.make(tmp_path)
    before = snapshot(tmp_path)
    status, stderr = run_cli(args, monkeypatch, capsys)
    lines = stderr.strip().splitlines()
    assert status == 2, stderr
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("opfuse: error: "), stderr
    assert case.message in lines[0], stderr
    if case.file:
        assert case.file in lines[0], stderr
    assert snapshot(tmp_path) == before  # nothing written, no staging folder left
    assert not Path("/proc/opfuse-test.onnx").exists()


@pytest.mark.parametrize(
    "name",
    [
        "truncated protobuf",
        "switch value On",
        "npz wrong shape",
        "profile: output is the input",
        "advise: binary op summary",
        "profile: --input-shape dims that clash",  # onnxruntime logs nothing of its own
    ],
)
def test_real_process(name, tmp_path):
    case = CASES[name]
    args = case.make(tmp_path)
    before = snapshot(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "opfuse", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "OPFUSE_DEBUG"},
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert case.message in proc.stderr
    assert not (tmp_path / OUT).exists()
    assert snapshot(tmp_path) == before
