"""Nothing lost: an interrupted write keeps the old output and leaves no partial or
temporary file; what no pass touches (custom-domain ops, functions, metadata, doc strings,
node names) survives an optimize; quantized (QDQ) models never grow and keep Q/DQ."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.errors import OpfuseError
from opfuse.model import io
from opfuse.pipeline.conductor import optimize_file, optimize_model

RNG = np.random.default_rng(0)


def conv_bn_model() -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        *(
            numpy_helper.from_array(RNG.uniform(0.5, 1.5, 4).astype(np.float32), n)
            for n in ("s", "b", "m", "v")
        ),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()} | {
        p.name + "/": b"" for p in d.iterdir() if p.is_dir()
    }


# -- interrupted writes --------------------------------------------------------------


def make_old_output(tmp_path: Path, external: bool) -> tuple[Path, Path]:
    """An input model and an existing output (from an earlier run) in tmp_path."""
    src = tmp_path / "m.onnx"
    if external:
        onnx.save_model(
            conv_bn_model(),
            str(src),
            save_as_external_data=True,
            location="m.weights",
            size_threshold=0,
        )
    else:
        onnx.save_model(conv_bn_model(), str(src))
    out = tmp_path / "o.onnx"
    # the old output (possibly with o.onnx.data), different from what a rerun writes
    optimize_file(src, out, disable=["ConvBatchNormFusionPass"])
    assert (tmp_path / "o.onnx.data").exists() == external
    return src, out


def partial_save(model, path, **kwargs):
    """onnx_ir.save that dies halfway: a partial model (and data) file, then an error."""
    Path(path).write_bytes(b"\x08\x08partial")
    if kwargs.get("external_data"):
        (Path(path).parent / kwargs["external_data"]).write_bytes(b"partial weights")
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_failing_save_keeps_the_old_output(tmp_path, monkeypatch, external):
    src, out = make_old_output(tmp_path, external)
    before = files(out.parent)
    monkeypatch.setattr(io.ir, "save", partial_save)
    with pytest.raises(OpfuseError, match="No space left on device"):
        optimize_file(src, out)
    assert files(out.parent) == before  # same files, same bytes, no staging folder


@pytest.mark.parametrize(
    "external,fail_at",
    [(False, 1), (True, 1), (True, 2)],
    ids=["inline", "external-data-move", "external-model-move"],
)
def test_failing_rename_keeps_the_old_output(tmp_path, monkeypatch, external, fail_at):
    """The data file and the model move into place one after the other: a failure at
    either move leaves the old pair as it was (the old output stays loadable). Found a
    bug: a failed model move used to leave the new data file beside the old model."""
    src, out = make_old_output(tmp_path, external)
    before = files(out.parent)
    real = os.replace
    calls = []

    def replace(a, b):
        if Path(b).parent == out.parent and Path(b).name.startswith("o.onnx"):
            calls.append(b)  # a move into place (not onnx_ir's own inside the staging)
            if len(calls) == fail_at:
                raise OSError(5, "Input/output error")
        return real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OpfuseError, match="Input/output error"):
        optimize_file(src, out)
    monkeypatch.setattr(os, "replace", real)
    assert files(out.parent) == before
    onnx.checker.check_model(str(out))


def test_interrupt_during_save_leaves_no_temp_files(tmp_path, monkeypatch):
    src = tmp_path / "m.onnx"
    onnx.save_model(conv_bn_model(), str(src))

    def interrupted(model, path, **kwargs):
        Path(path).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(io.ir, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        optimize_file(src, tmp_path / "o.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_killed_save_is_cleaned_up_by_a_later_one(tmp_path):
    """SIGKILL during a save leaves its hidden staging folder (or a probe or report temp
    file) beside the output; the next save into that folder removes those older than a
    day, and leaves younger ones (a save still running) and other hidden files alone."""
    src = tmp_path / "m.onnx"
    onnx.save_model(conv_bn_model(), str(src))
    stale = {
        tmp_path / ".opfuse-stage-k1ll3d_x": "dir",
        tmp_path / ".opfuse-probe-abc12345": "file",
        tmp_path / ".opfuse-report-q7w8e9r0.tmp": "file",
    }
    young = tmp_path / ".opfuse-stage-runn1ng0"
    other = tmp_path / ".opfuse-notes"  # not a name opfuse makes
    users = tmp_path / ".opfuse-settings"  # 8 lowercase letters, but no kind: the user's
    for path, kind in [*stale.items(), (young, "dir"), (other, "file"), (users, "dir")]:
        if kind == "dir":
            path.mkdir()
            (path / "o.onnx").write_bytes(b"partial")
        else:
            path.write_bytes(b"partial")
    old = time.time() - io.STALE_SECONDS - 60
    for path in [*stale, other, users]:
        os.utime(path, (old, old))
    optimize_file(src, tmp_path / "o.onnx")
    assert not any(p.exists() for p in stale)
    assert young.is_dir() and other.is_file() and (users / "o.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "m.onnx",
        "o.onnx",
    ]


def test_report_writes_are_atomic(tmp_path, monkeypatch):
    """Reports (advise -o, profile -o) go to a temporary file renamed into place: a
    failed rename keeps the old report and leaves no temporary file."""
    out = tmp_path / "report.txt"
    io.write_text(out, "old report\n")
    assert out.read_text() == "old report\n"
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as open() makes it

    def replace(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OpfuseError, match="report.txt: cannot write the report: No space left"):
        io.write_text(out, "new report\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]
    assert out.read_text() == "old report\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- what no pass touches survives -------------------------------------------------


def rich_model() -> onnx.ModelProto:
    """Conv+BN (folded) next to nodes no pass touches: a com.microsoft contrib op, a call
    of a model-local function in a custom domain, named nodes with doc strings and
    metadata, model metadata and doc strings."""
    model = conv_bn_model()
    g = model.graph
    g.output[0].name = "y_bn"
    g.node[1].output[0] = "y_bn"
    relu = helper.make_node("Relu", ["y_bn"], ["r"], name="keep_relu", doc_string="why relu")
    relu.metadata_props.add(key="source", value="layer3.relu")
    gelu = helper.make_node("Gelu", ["r"], ["gl"], name="keep_gelu", domain="com.microsoft")
    call = helper.make_node("ScaledTanh", ["gl"], ["y"], name="keep_call", domain="custom.fn")
    g.node.extend([relu, gelu, call])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6]))
    g.doc_string = "graph doc"
    g.input[0].doc_string = "the image"
    fn = helper.make_function(
        "custom.fn",
        "ScaledTanh",
        ["a"],
        ["b"],
        [
            helper.make_node("Tanh", ["a"], ["t"]),
            helper.make_node("Constant", [], ["two"], value_float=2.0),
            helper.make_node("Mul", ["t", "two"], ["b"]),
        ],
        [helper.make_opsetid("", 17)],
        doc_string="a local function",
    )
    model.functions.append(fn)
    model.opset_import.extend(
        [helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("custom.fn", 1)]
    )
    model.doc_string = "model doc"
    model.producer_name = "opfuse-tests"
    model.producer_version = "1.2.3"
    model.model_version = 7
    helper.set_model_props(model, {"author": "tests", "license": "MIT"})
    return model


def test_untouched_parts_survive(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save_model(rich_model(), str(src))
    out = tmp_path / "o.onnx"
    result = optimize_file(src, out)
    assert result.verify is not None and result.verify.ok
    got = onnx.load_model(str(out))
    nodes = {n.name: n for n in got.graph.node}
    assert "bn" not in nodes  # the BN was folded ...
    assert {"keep_relu", "keep_gelu", "keep_call"} <= set(nodes)  # ... the rest kept
    assert nodes["keep_relu"].doc_string == "why relu"
    assert {p.key: p.value for p in nodes["keep_relu"].metadata_props} == {"source": "layer3.relu"}
    assert (nodes["keep_gelu"].domain, nodes["keep_call"].domain) == ("com.microsoft", "custom.fn")
    assert [f.name for f in got.functions] == ["ScaledTanh"]
    assert got.functions[0].doc_string == "a local function"
    assert [n.op_type for n in got.functions[0].node] == ["Tanh", "Constant", "Mul"]
    opsets = {o.domain: o.version for o in got.opset_import}
    assert opsets["com.microsoft"] == 1 and opsets["custom.fn"] == 1
    assert {p.key: p.value for p in got.metadata_props} == {"author": "tests", "license": "MIT"}
    assert (got.doc_string, got.graph.doc_string) == ("model doc", "graph doc")
    assert (got.producer_name, got.producer_version, got.model_version) == (
        "opfuse-tests",
        "1.2.3",
        7,
    )
    assert got.graph.input[0].doc_string == "the image"


# -- quantized models ----------------------------------------------------------------


def qdq_model() -> onnx.ModelProto:
    """A QDQ model as quantizers write it: int8 weights through DequantizeLinear, Q/DQ
    around every activation, a Conv followed by a BatchNormalization whose folding
    would need float weights (4x the bytes), a Pad before a Conv, an Identity."""
    w1 = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    w2 = RNG.integers(-127, 128, (8, 8, 3, 3)).astype(np.int8)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
        numpy_helper.from_array(np.array(0.05, np.float32), "as"),
        numpy_helper.from_array(np.array(0, np.int8), "az"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(np.zeros(8, np.int32), "b1"),
        *(
            numpy_helper.from_array(RNG.uniform(0.5, 1.5, 8).astype(np.float32), n)
            for n in ("g", "beta", "mean", "var")
        ),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(np.full(8, 0.0005, np.float32), "bs"),
        numpy_helper.from_array(np.zeros(8, np.int32), "bz"),
    ]

    def qdq(x: str, out: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("QuantizeLinear", [x, "as", "az"], [out + "_q"], name=out + "_q"),
            helper.make_node("DequantizeLinear", [out + "_q", "as", "az"], [out], name=out),
        ]

    nodes = [
        *qdq("x", "xd"),
        helper.make_node("DequantizeLinear", ["w1", "ws", "wz"], ["w1d"], name="w1d", axis=0),
        helper.make_node("DequantizeLinear", ["b1", "bs", "bz"], ["b1d"], name="b1d", axis=0),
        helper.make_node("Conv", ["xd", "w1d", "b1d"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        *qdq("r1", "r1d"),
        helper.make_node("Identity", ["r1d"], ["i1"], name="identity"),
        helper.make_node("Pad", ["i1", "pads"], ["p1"], name="pad"),
        *qdq("p1", "p1d"),
        helper.make_node("DequantizeLinear", ["w2", "ws", "wz"], ["w2d"], name="w2d", axis=0),
        helper.make_node("Conv", ["p1d", "w2d"], ["c2"], name="conv2"),
        *qdq("c2", "y"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def qdq_counts(model: onnx.ModelProto) -> Counter[str]:
    return Counter(
        n.op_type for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
    )


def test_qdq_model_never_grows_and_keeps_its_qdq(tmp_path):
    src = tmp_path / "q.onnx"
    proto = qdq_model()
    onnx.save_model(proto, str(src))
    out = tmp_path / "o.onnx"
    result = optimize_file(src, out)
    assert result.verify is not None and result.verify.ok
    got = onnx.load_model(str(out))
    # the file grows only by the shapes inference wrote down (value_info), never by weights
    shapes = sum(v.ByteSize() + 4 for v in got.graph.value_info)
    assert out.stat().st_size - shapes <= src.stat().st_size
    assert qdq_counts(got) == qdq_counts(proto)
    weights = {t.name: t.data_type for t in got.graph.initializer}
    assert weights["w1"] == weights["w2"] == TensorProto.INT8  # still int8
    big_floats = [
        t.name
        for t in got.graph.initializer
        if t.data_type == TensorProto.FLOAT and np.prod(t.dims) >= 8 * 3 * 3
    ]
    assert big_floats == []  # no weight was dequantized into float
    assert "Identity" not in {n.op_type for n in got.graph.node}  # it was still optimized


def test_qdq_model_in_memory_keeps_weight_bytes():
    model = ir.from_proto(qdq_model())
    before = sum(v.const_value.nbytes for v in model.graph.initializers.values())
    result = optimize_model(model)
    after = sum(v.const_value.nbytes for v in result.model.graph.initializers.values())
    assert after <= before


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet1_1", "mobilenet_v2"])
def test_zoo_model_quantized_by_onnxruntime_never_grows(zoo_dir, tmp_path, name):
    """A real QDQ model (onnxruntime's static quantizer on a zoo model): the optimized
    file is no larger (beyond the shapes it records), keeps every Q/DQ, and verifies."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    src = zoo_dir / f"{name}.onnx"
    proto = onnx.load_model(str(src))
    inp = proto.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(
                [{inp.name: RNG.standard_normal(shape).astype(np.float32)} for _ in range(2)]
            )

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.feeds, None)

    qdq = tmp_path / "q.onnx"
    quantize_static(str(src), str(qdq), Reader(), quant_format=QuantFormat.QDQ)
    out = tmp_path / "o.onnx"
    result = optimize_file(qdq, out)
    assert result.verify is not None and result.verify.ok
    before, after = onnx.load_model(str(qdq)), onnx.load_model(str(out))
    shapes = sum(v.ByteSize() + 4 for v in after.graph.value_info) - sum(
        v.ByteSize() + 4 for v in before.graph.value_info
    )
    assert out.stat().st_size - max(shapes, 0) <= qdq.stat().st_size
    assert qdq_counts(after) == qdq_counts(before)

    def tensor_bytes(model: onnx.ModelProto, types: set[int], min_size: int = 0) -> list[int]:
        return sorted(
            len(t.raw_data) or numpy_helper.to_array(t).nbytes
            for t in model.graph.initializer
            if t.data_type in types and np.prod(t.dims) >= min_size
        )

    # the int8 weights all stay (identical zero points may be merged), no weight became float
    int8 = {TensorProto.INT8, TensorProto.UINT8}
    assert tensor_bytes(after, int8, 64) == tensor_bytes(before, int8, 64)
    floats = {TensorProto.FLOAT}
    assert sum(tensor_bytes(after, floats)) <= sum(tensor_bytes(before, floats))
