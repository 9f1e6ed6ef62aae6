"""The advisor on small models: durations from a synthetic profile, constraint hints with
the pass verdicts, and the JSON schema."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from advisor_models import (
    FIXTURES,
    SWISH_TIMES,
    make_model,
    ort_profile,
    swish_net,
    write_json,
)
from onnx import helper

from opfuse.advisor.conductor import SCHEMA, AdviseOptions, advise

TIMES = SWISH_TIMES
OPTS = AdviseOptions(warmup=1, compare_onnxruntime=False)


@pytest.fixture
def swish(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "swish.onnx"
    onnx.save(swish_net(), path)
    return path


def test_group_durations_add_up_to_the_profile(swish, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prof = write_json(tmp_path / "p.json", ort_profile(TIMES, runs=4))
    report = advise(swish, profile_path=prof, options=OPTS)
    assert report["profile"]["runs"] == 3  # the warm-up run (100x slower) dropped
    assert report["profile"]["total_us"] == pytest.approx(sum(t for _, t in TIMES.values()))
    ub = {g["fusion_type"]: g for g in report["ub_fusion"]}
    assert ub["Conv+Sigmoid+Mul"]["duration_us"] == pytest.approx(122.0)
    assert ub["Conv+Relu"]["duration_us"] == pytest.approx(55.0)
    assert ub["GlobalAveragePool+Add+Relu"]["duration_us"] == pytest.approx(12.0)
    for g in report["ub_fusion"]:
        assert g["duration_us"] == pytest.approx(sum(TIMES[n][1] for n in g["nodes"]))
    durations = [g["duration_us"] for g in report["ub_fusion"]]
    assert durations == sorted(durations, reverse=True)
    assert report["profile"]["unmapped_us"] == 0


def test_unknown_profile_names_are_reported_unmapped(swish, tmp_path) -> None:  # type: ignore[no-untyped-def]
    times = dict(TIMES, ghost=("Relu", 40.0))
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=2))
    report = advise(swish, profile_path=prof, options=AdviseOptions(warmup=1))
    assert report["profile"]["unmapped_us"] == pytest.approx(40.0)
    assert report["profile"]["unmapped_nodes"] == ["ghost"]


def test_onnxruntime_profiling_and_fusion_comparison(swish) -> None:  # type: ignore[no-untyped-def]
    report = advise(swish, options=AdviseOptions(runs=2, warmup=1))
    assert report["profile"]["source"] == "onnxruntime"
    assert report["profile"]["unmapped_us"] == 0
    names = {r["name"] for r in report["top_nodes"]}
    assert {"conv1", "sig1", "mul1"} <= names
    group = next(g for g in report["ub_fusion"] if g["fusion_type"] == "Conv+Relu")
    # onnxruntime runs Conv+Relu as one kernel (FusedConv, or an NCHWc Conv with activation)
    assert group["onnxruntime"]["fuses"] == "yes"
    assert len(group["onnxruntime"]["kernels"]) == 1
    assert len(group["onnxruntime"]["absorbed"]) == 1


def hint_model() -> onnx.ModelProto:
    n = helper.make_node
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((10, 3, 1, 1)).astype(np.float32),  # 10 output channels
        "two": np.array(2.0, np.float32),
        "odd": np.array(2.5, np.float32),
        "roi": np.zeros(0, np.float32),
        "sizes": np.array([1, 10, 350, 350], np.int64),
    }
    nodes = [
        n("Conv", ["x", "W"], ["c"], name="conv10"),
        n("Pow", ["c", "two"], ["p"], name="pow_square"),
        n("Pow", ["p", "odd"], ["q"], name="pow_odd"),
        n(
            "Resize",
            ["q", "roi", "", "sizes"],
            ["y"],
            name="resize",
            mode="linear",
            coordinate_transformation_mode="align_corners",
        ),
    ]
    return make_model(nodes, {"x": [1, 3, 175, 175]}, {"y": [1, 10, 350, 350]}, inits)


def test_constraint_hints_and_pass_verdicts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "hints.onnx"
    onnx.save(hint_model(), path)
    times = {
        "conv10": ("Conv", 30.0),
        "pow_square": ("Pow", 5.0),
        "pow_odd": ("Pow", 9.0),
        "resize": ("Resize", 200.0),
    }
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=2))
    report = advise(path, profile_path=prof, options=AdviseOptions(target="ascend310", warmup=1))
    hints = {(h["kind"], h["node"]): h for h in report["hints"]}
    align = hints[("alignment", "conv10")]
    assert "output channels 10 not a multiple of 16" in align["message"]
    square = hints[("replace", "pow_square")]["opfuse"]
    assert square["pass"] == "PowToMulFusionPass" and square["fires"] is True
    odd = hints[("replace", "pow_odd")]["opfuse"]
    assert odd["fires"] is False and odd["reason"]
    resize = hints[("resize_align_corners", "resize")]
    assert "(350-1)/(175-1)" in resize["message"]
    assert "input 176 and output 351" in resize["message"]  # the guide's own fix
    assert resize["duration_us"] == pytest.approx(200.0)
    # PowToMulFusionPass's refusal covers the one Pow: it says nothing about fusing the group
    (group,) = report["ub_fusion"]
    assert group["nodes"] == ["conv10", "pow_square", "pow_odd"]
    assert group["op_types"] == ["Conv", "Pow", "Pow"]  # the graph that ran, as profiled
    assert group["opfuse"]["pass"] is None and group["opfuse"]["fires"] is None


def test_group_verdict_only_from_a_refusal_about_the_group(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Pad with a non-zero value before a Conv: PadConvFusionPass refuses at the Conv, but
    the Pad is not in the Conv's group, so the group does not inherit it. A Mul by a
    spatially varying constant after a Conv: ConvMulFusionPass's refused match covers the
    Conv and the Mul, both in the group, so the group carries its reason."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    inits = {
        "W1": rng.standard_normal((4, 4, 1, 1)).astype(np.float32),
        "W2": rng.standard_normal((4, 4, 1, 1)).astype(np.float32),
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "one": np.array(1.0, np.float32),
        "rows": rng.standard_normal((1, 1, 4, 1)).astype(np.float32),
    }
    nodes = [
        n("Pad", ["x", "pads", "one"], ["p"], name="pad", mode="constant"),
        n("Conv", ["p", "W1"], ["c1"], name="conv_after_pad"),
        n("Relu", ["c1"], ["y1"], name="relu1"),
        n("Conv", ["x", "W2"], ["c2"], name="conv_rows"),
        n("Mul", ["c2", "rows"], ["m2"], name="mul_rows"),
        n("Relu", ["m2"], ["y2"], name="relu2"),
    ]
    path = tmp_path / "refusals.onnx"
    model = make_model(nodes, {"x": [1, 4, 4, 4]}, {"y1": [1, 4, 6, 6], "y2": [1, 4, 4, 4]}, inits)
    onnx.save(model, path)
    times = {name: ("X", 1.0) for name in ("pad", "conv_after_pad", "relu1", "conv_rows")}
    times.update(mul_rows=("Mul", 1.0), relu2=("Relu", 1.0))
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=1))
    report = advise(path, profile_path=prof, options=AdviseOptions(warmup=0))
    reasons = {(r["pass"], x["reason"]) for r in report["graph_fusion"] for x in r["reasons"]}
    assert ("PadConvFusionPass", "Pad value is not zero") in reasons  # it did refuse
    groups = {tuple(g["nodes"]): g["opfuse"] for g in report["ub_fusion"]}
    assert groups[("conv_after_pad", "relu1")]["pass"] is None
    rows = groups[("conv_rows", "mul_rows", "relu2")]
    assert rows["pass"] == "ConvMulFusionPass" and rows["fires"] is False
    assert "constants vary along axis 2" in rows["reason"]


def test_fallback_hint_from_the_profile(swish, tmp_path) -> None:  # type: ignore[no-untyped-def]
    events = ort_profile(TIMES, runs=1)
    for e in events:
        if e.get("cat") == "Node" and e["name"] != "gap_kernel_time":
            e["args"]["provider"] = "CUDAExecutionProvider"
    prof = write_json(tmp_path / "p.json", events)
    report = advise(
        swish,
        profile_path=prof,
        options=AdviseOptions(
            provider="CUDAExecutionProvider", warmup=0, compare_onnxruntime=False
        ),
    )
    nodes = {h["node"] for h in report["hints"] if h["kind"] == "fallback"}
    assert nodes == {"gap"} and "fell back from CUDAExecutionProvider" in next(
        h["message"] for h in report["hints"] if h["node"] == "gap" and h["kind"] == "fallback"
    )


SCHEMA_KEYS = {
    "schema",
    "model",
    "target",
    "graph",
    "profile",
    "op_statistic",
    "top_nodes",
    "ub_fusion",
    "aipp_fusion",
    "l2_fusion",
    "hints",
    "graph_fusion",
    "ascend_sections",
    "next_steps",
    "quantized",
}
# a finding of the quantized section (tests/advisor/test_advise_quantized.py fills it)
QUANTIZED_KEYS = {"kind", "finding", "why", "what_to_do", "nodes", "count", "cost_us"}
QUANTIZED_KINDS = {"unfused_qdq", "requantize", "float_layer", "channels", "int8_does_not_pay"}
TARGET_KEYS = {
    "name",
    "source",
    "alignment",
    "l2_bytes",
    "peak_flops",
    "vector_flops",
    "bandwidth_bytes_per_s",
    "ub_limits",
    "peaks",
    "peaks_measured_on",
}
GRAPH_KEYS = {
    "analysed",
    "nodes_original",
    "nodes_analysed",
    "constant_nodes_counted",
    "subgraphs",
    "quantized",
}
PROFILE_KEYS = {
    "source",
    "path",
    "runs",
    "warmup",
    "provider",
    "graph_opt",
    "total_us",
    "run_total_median_us",
    "total_iqr_us",
    "variance_warning",
    "unmapped_us",
    "unmapped_nodes",
    "missing_columns",
    "notes",
    "inputs",
    "input_shape_hint",
    "inputs_fed",
}
INPUT_KEYS = {"name", "shape", "declared", "dynamic"}
FED_KEYS = {"shapes", "generated", "npz", "seed", "how", "grown", "refused"}
NEXT_STEP_KEYS = {"command", "ratio", "helps"}
STAT_KEYS = {"op_type", "count", "total_us", "mean_us", "share"}
TOP_KEYS = {"name", "op_type", "duration_us", "iqr_us", "share", "provider", "nodes", "of_peak"}
OF_PEAK_KEYS = {"flops", "bandwidth"}
STEPS_KEYS = {"trial", "skipped", "commands", "helps", "dominant", "inputs"}
COMMAND_KEYS = {
    "command",
    "flags",
    "why",
    "ratio",
    "noise",
    "runs",
    "effect",
    "helps",
    "error",
}
DOMINANT_KEYS = {"op_type", "share", "suggestion"}
ACTIVATION_KEYS = {"name", "nodes"}
UB_KEYS = {
    "subgraph",
    "fusion_type",
    "kind",
    "nodes",
    "op_types",
    "model_nodes",
    "activations",
    "edges",
    "duration_us",
    "share",
    "opfuse_removes_us",
    "opfuse",
    "onnxruntime",
    "next_step",
}
ORT_KEYS = {"fuses", "kernels", "absorbed"}
AIPP_KEYS = {"nodes", "op_types", "normalization", "first_conv", "duration_us", "opfuse"}
L2_KEYS = {
    "nodes",
    "duration_us",
    "batch",
    "max_intermediate_bytes",
    "batch_split",
    "ratios_source",
    "ops",
    "opfuse",
}
OP_KEYS = {
    "name",
    "op_type",
    "input_shapes",
    "mac_ratio",
    "vec_ratio",
    "mte2_ratio",
    "mte3_ratio",
    "duration_us",
}
HINT_KEYS = {"kind", "node", "op_type", "message", "duration_us", "gain_us", "opfuse"}
HINT_KINDS = {"alignment", "replace", "resize_align_corners", "fallback"}
VERDICT_KEYS = {"pass", "available", "fires", "reason"}
GRAPH_FUSION_KEYS = {"pass", "section", "matched", "effected", "reasons"}
REASON_KEYS = {"pattern", "reason", "count", "nodes"}


def check_verdict(verdict: object) -> None:
    assert isinstance(verdict, dict) and set(verdict) == VERDICT_KEYS, verdict
    assert verdict["pass"] is None or isinstance(verdict["pass"], str)
    assert isinstance(verdict["available"], bool)
    assert verdict["fires"] in (None, True, False)
    if verdict["pass"] is None:  # no opfuse pass: the reason says why
        assert verdict["fires"] is None and verdict["reason"]
    if verdict["fires"] is False:
        assert verdict["reason"]


def schema_reports(tmp_path) -> list[dict]:  # type: ignore[no-untyped-def]
    """Reports that fill every section: the swish net; a net with every hint kind (and the
    onnxruntime comparison); a first-layer chain; a fallback from CUDA to CPU."""
    swish = tmp_path / "swish.onnx"
    onnx.save(swish_net(), swish)
    prof = write_json(tmp_path / "p.json", ort_profile(TIMES, runs=2))
    reports = [advise(swish, profile_path=prof, options=OPTS)]
    ascend = AdviseOptions(target="ascend310", warmup=1, compare_onnxruntime=False)
    reports.append(advise(swish, profile_path=prof, options=ascend))
    hints = hint_model()
    hints.graph.node.append(helper.make_node("ReduceL2", ["x"], ["n2"], name="norm", axes=[1]))
    hints.graph.output.append(
        helper.make_tensor_value_info("n2", onnx.TensorProto.FLOAT, [1, 1, 175, 175])
    )
    path = tmp_path / "hints.onnx"
    onnx.save(hints, path)
    times = {"conv10": ("Conv", 3.0), "pow_odd": ("Pow", 1.0), "resize": ("Resize", 9.0)}
    prof = write_json(tmp_path / "ph.json", ort_profile(dict(times, norm=("ReduceL2", 1)), 2))
    reports.append(advise(path, profile_path=prof, options=AdviseOptions(warmup=1)))
    path = tmp_path / "aipp.onnx"
    onnx.save(aipp_model([0, 0, 0, 0]), path)
    times = {k: ("X", 1.0) for k in ("norm_mul", "norm_add", "to_nchw", "first_conv")}
    prof = write_json(tmp_path / "pa.json", ort_profile(times, runs=1))
    reports.append(advise(path, profile_path=prof, options=AdviseOptions(warmup=0)))
    events = ort_profile(TIMES, runs=1)
    for e in events:
        if e.get("cat") == "Node" and e["name"] == "gap_kernel_time":
            e["args"]["provider"] = "CPUExecutionProvider"
        elif e.get("cat") == "Node":
            e["args"]["provider"] = "CUDAExecutionProvider"
    prof = write_json(tmp_path / "pf.json", events)
    cuda = AdviseOptions(provider="CUDAExecutionProvider", warmup=0, compare_onnxruntime=False)
    reports.append(advise(swish, profile_path=prof, options=cuda))
    return [json.loads(json.dumps(r.to_json())) for r in reports]


def test_json_schema_is_stable_and_documented(tmp_path) -> None:  # type: ignore[no-untyped-def]
    reports = schema_reports(tmp_path)
    report = reports[0]
    assert report["schema"] == SCHEMA == "opfuse.advise/2"
    assert report["graph"] == {
        "analysed": "the model's nodes, as profiled (the graph that ran)",
        "nodes_original": 8,
        "nodes_analysed": 8,
        "constant_nodes_counted": False,
        "subgraphs": 0,
        "quantized": False,
    }
    assert report["next_steps"]["commands"], "the trial ran"
    assert not report["l2_fusion"] and not report["ascend_sections"]  # cpu: not Ascend's
    assert reports[1]["l2_fusion"], "the small net has an L2 chain on an Ascend target"
    assert reports[1]["l2_fusion"][0]["ratios_source"] == "estimate"
    kinds = {h["kind"] for r in reports for h in r["hints"]}
    assert kinds == HINT_KINDS, "every hint kind is checked"
    assert any(r["aipp_fusion"] for r in reports)
    assert any(g["onnxruntime"] for r in reports for g in r["ub_fusion"])
    assert any(r["graph_fusion"] for r in reports)
    for r in reports:
        assert set(r) == SCHEMA_KEYS
        assert set(r["target"]) == TARGET_KEYS and set(r["graph"]) == GRAPH_KEYS
        assert set(r["profile"]) == PROFILE_KEYS
        assert all(set(i) == INPUT_KEYS for i in r["profile"]["inputs"])
        assert all(set(s) == STAT_KEYS for s in r["op_statistic"])
        assert all(set(n) == TOP_KEYS for n in r["top_nodes"])
        assert all(
            n["of_peak"] is None or set(n["of_peak"]) == OF_PEAK_KEYS for n in r["top_nodes"]
        )
        assert set(r["next_steps"]) == STEPS_KEYS
        assert all(set(c) == COMMAND_KEYS for c in r["next_steps"]["commands"])
        assert all(set(d) == DOMINANT_KEYS for d in r["next_steps"]["dominant"])
        for g in r["ub_fusion"]:
            assert set(g) == UB_KEYS
            assert all(set(a) == ACTIVATION_KEYS for a in g["activations"])
            assert g["onnxruntime"] is None or set(g["onnxruntime"]) == ORT_KEYS
            check_verdict(g["opfuse"])
            assert g["next_step"] is None or set(g["next_step"]) == NEXT_STEP_KEYS
        for a in r["aipp_fusion"]:
            assert set(a) == AIPP_KEYS
            check_verdict(a["opfuse"])
        for c in r["l2_fusion"]:
            assert set(c) == L2_KEYS and all(set(op) == OP_KEYS for op in c["ops"])
            check_verdict(c["opfuse"])
        for h in r["hints"]:
            assert set(h) == HINT_KEYS and h["kind"] in HINT_KINDS
            check_verdict(h["opfuse"])
        for row in r["graph_fusion"]:
            assert set(row) == GRAPH_FUSION_KEYS
            assert all(set(x) == REASON_KEYS for x in row["reasons"])
    no_pass = {
        h["kind"]: h["opfuse"]["reason"]
        for r in reports
        for h in r["hints"]
        if h["opfuse"]["pass"] is None
    }
    assert no_pass["alignment"].startswith("no opfuse pass pads channels")
    assert no_pass["replace"] == "no opfuse pass replaces ReduceL2"
    doc = (FIXTURES.parents[2] / "docs" / "ADVISOR.md").read_text()
    documented = (
        SCHEMA_KEYS | TARGET_KEYS | GRAPH_KEYS | PROFILE_KEYS | STAT_KEYS | TOP_KEYS | UB_KEYS
    )
    documented |= ORT_KEYS | AIPP_KEYS | L2_KEYS | OP_KEYS | HINT_KEYS | HINT_KINDS
    documented |= VERDICT_KEYS | GRAPH_FUSION_KEYS | REASON_KEYS | OF_PEAK_KEYS | STEPS_KEYS
    documented |= COMMAND_KEYS | DOMINANT_KEYS | ACTIVATION_KEYS
    documented |= QUANTIZED_KEYS | QUANTIZED_KINDS | INPUT_KEYS | NEXT_STEP_KEYS | FED_KEYS
    for key in documented:
        assert f"`{key}`" in doc, f"docs/ADVISOR.md does not document {key}"


def aipp_model(pads: list[int]) -> onnx.ModelProto:
    n = helper.make_node
    inits = {
        "scale": np.full((1, 1, 1, 3), 1 / 127.5, np.float32),
        "shift": np.full((1, 1, 1, 3), -1.0, np.float32),
        "W": np.ones((16, 3, 3, 3), np.float32),
    }
    nodes = [
        n("Mul", ["x", "scale"], ["m"], name="norm_mul"),
        n("Add", ["m", "shift"], ["a"], name="norm_add"),
        n("Transpose", ["a"], ["t"], name="to_nchw", perm=[0, 3, 1, 2]),
        n("Conv", ["t", "W"], ["y"], name="first_conv", pads=pads),
    ]
    side = 6 + 2 * pads[0]
    return make_model(nodes, {"x": [1, 8, 8, 3]}, {"y": [1, 16, side, side]}, inits)


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1]])
def test_aipp_section_names_the_normalization_chain(pads, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "aipp.onnx"
    onnx.save(aipp_model(pads), path)
    times = {k: ("X", 1.0) for k in ("norm_mul", "norm_add", "to_nchw", "first_conv")}
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=1))
    report = advise(path, profile_path=prof, options=AdviseOptions(warmup=0))
    (aipp,) = report["aipp_fusion"]
    assert aipp["nodes"] == ["norm_mul", "norm_add", "to_nchw"]
    assert aipp["normalization"] == ["norm_mul", "norm_add"]
    assert aipp["first_conv"] == "first_conv"
    verdict = aipp["opfuse"]
    assert verdict["pass"] == "AippFusionPass" and verdict["available"] is True
    if pads[0] == 0:  # folded exactly into the Conv's weights and bias
        assert verdict["fires"] is True and verdict["reason"] is None
    else:  # zero padding after a shift: the engine's reason, recorded on the Conv
        assert verdict["fires"] is False
        assert "pads" in verdict["reason"] and "not listed" not in verdict["reason"]


def test_inlined_function_kernels_go_to_their_node(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """onnxruntime runs HardSwish as HardSigmoid_N + Mul_M kernels with names of its own."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    inits = {
        "W1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "W2": rng.standard_normal((16, 8, 1, 1)).astype(np.float32),
    }
    nodes = [
        n("Conv", ["x", "W1"], ["c1"], name="conv1"),
        n("HardSwish", ["c1"], ["h1"], name="hswish1"),
        n("Conv", ["h1", "W2"], ["c2"], name="conv2"),
        n("HardSwish", ["c2"], ["y"], name="hswish2"),
    ]
    path = tmp_path / "hswish.onnx"
    onnx.save(make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 16, 6, 6]}, inits), path)
    report = advise(path, options=AdviseOptions(runs=1, warmup=0, compare_onnxruntime=False))
    assert report["profile"]["unmapped_us"] == 0
    groups = {tuple(g["nodes"]): g for g in report["ub_fusion"]}
    assert set(groups) == {("conv1", "hswish1"), ("conv2", "hswish2")}
    kernels = [r for r in report["top_nodes"] if r["name"] not in ("conv1", "conv2")]
    if kernels:  # this onnxruntime inlines HardSwish: its kernels were placed by order
        assert any("inlined function bodies" in note for note in report["profile"]["notes"])
    for r in kernels:  # and they name the HardSwish node they run
        assert r["nodes"] in (["hswish1"], ["hswish2"]), r
    total = sum(g["duration_us"] for g in report["ub_fusion"])
    assert total == pytest.approx(report["profile"]["total_us"], abs=1e-2)


def test_user_target_file_sets_limits_alignment_and_l2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A dynamic batch of 4 and an L2 that holds one sample's tensors: the L2 chain gets a
    batch split; the alignment and UB limits of the file apply."""
    target = json.loads((FIXTURES.parents[2] / "src/opfuse/targets/ascend310.json").read_text())
    target.update(name="ascend-tiny", alignment=32, l2_bytes=16 * 8 * 8 * 4 * 2)
    target["ub_limits"]["conv_elementwise"] = 1
    target_path = write_json(tmp_path / "tiny.json", target)
    model = swish_net()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "swish_dyn.onnx"
    onnx.save(model, path)
    report = advise(
        path,
        options=AdviseOptions(
            target=str(target_path),
            runs=1,
            warmup=0,
            input_shapes={"x": [4, 3, 8, 8]},
            compare_onnxruntime=False,
        ),
    )
    assert report["target"]["name"] == "ascend-tiny" and report["target"]["l2_bytes"] == 8192
    types = {g["fusion_type"] for g in report["ub_fusion"]}
    # limit 1 follower: a written-out SiLU is one member, Relu after it would be a second
    assert "Conv+Relu" in types and "Conv+Sigmoid+Mul" in types
    assert any(
        h["kind"] == "alignment" and "16 not a multiple of 32" in h["message"]
        for h in report["hints"]
    )
    chain = report["l2_fusion"][0]
    assert chain["batch"] == 4 and chain["ratios_source"] == "estimate"
    assert chain["batch_split"] == {"batch": 4, "split_to": 2, "runs": 2}
    assert all(op["mte2_ratio"] is not None for op in chain["ops"])


def test_profile_of_onnxruntimes_fused_graph_maps_back(swish, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A profile taken at ORT_ENABLE_ALL names fused kernels (FusedConv, NCHWc Conv,
    QuickGelu, reorders); their time maps onto the original nodes with nothing lost."""
    from opfuse.advisor.profile_readers import run_onnxruntime

    raw = tmp_path / "ort_all.json"
    run_onnxruntime(swish, runs=2, warmup=1, graph_opt="all", profile_out=raw)
    report = advise(swish, profile_path=raw, options=AdviseOptions(warmup=1))
    prof = report["profile"]
    assert prof["unmapped_us"] == 0, prof["unmapped_nodes"]
    assert "(the graph that ran)" in report["graph"]["analysed"]
    # groups are of the kernels that ran: each group's time is the sum of its kernels'
    times = {r["name"]: r["duration_us"] for r in report["top_nodes"]}
    assert report["ub_fusion"], "the NCHWc Conv and the QuickGelu kernel make a group"
    for g in report["ub_fusion"]:
        assert g["duration_us"] == pytest.approx(sum(times[n] for n in g["nodes"]), abs=0.01)
        assert g["onnxruntime"] is None  # they are onnxruntime's kernels already
    assert any(n not in SWISH_TIMES for n in (r["name"] for r in report["top_nodes"]))
    # the fused kernels' names map back to the model's nodes, each node once (a layout
    # reorder names the node it converts)
    kernels = [r for r in report["top_nodes"] if "Reorder" not in r["op_type"]]
    covered = sorted(n for r in kernels for n in r["nodes"])
    assert covered == sorted(SWISH_TIMES)
    fused = [r["nodes"] for r in report["top_nodes"] if r["name"] not in SWISH_TIMES]
    assert any(len(nodes) > 1 for nodes in fused)


def test_a_pass_applies_it_only_where_it_changed_the_nodes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """PowToMulFusionPass fires on one Pow; another Pow has only constant inputs and is
    folded away by constant folding. Only the first is the pass's doing."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((8, 3, 1, 1)).astype(np.float32),
        "two": np.array(2.0, np.float32),
        "base": np.full((1, 8, 1, 1), 4.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        n("Conv", ["x", "W"], ["c"], name="conv"),
        n("Pow", ["c", "two"], ["p"], name="pow_square"),
        n("Pow", ["base", "half"], ["k"], name="pow_const"),
        n("Add", ["p", "k"], ["y"], name="add"),
    ]
    path = tmp_path / "pows.onnx"
    onnx.save(make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 8, 4, 4]}, inits), path)
    times = {"conv": ("Conv", 3.0), "pow_square": ("Pow", 2.0), "add": ("Add", 1.0)}
    prof = write_json(tmp_path / "p.json", ort_profile(times, runs=1))
    report = advise(path, profile_path=prof, options=AdviseOptions(warmup=0))
    verdicts = {h["node"]: h["opfuse"] for h in report["hints"] if h["kind"] == "replace"}
    assert verdicts["pow_square"]["pass"] == "PowToMulFusionPass"
    assert verdicts["pow_square"]["fires"] is True
    folded = verdicts["pow_const"]
    assert folded["pass"] == "PowToMulFusionPass" and folded["fires"] is False
    assert "other passes rewrite these nodes (pow_const)" in folded["reason"]


def test_l2_estimates_above_the_assumed_peak_are_kept_and_marked(swish, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An Ascend-style target file with peaks far below what was measured: the ratios are
    not capped at 1 and are marked as estimates above the assumed peak; no report says a
    built-in target is too low for the machine."""
    import html
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.l2 import ABOVE_PEAK
    from opfuse.advisor.render import render_html, render_text

    target = json.loads((FIXTURES.parents[2] / "src/opfuse/targets/cpu.json").read_text())
    target.update(name="ascend-slow", peak_flops=1e3, vector_flops=1e3, bandwidth_bytes_per_s=1e3)
    target_path = write_json(tmp_path / "slow.json", target)
    prof = write_json(tmp_path / "p.json", ort_profile(TIMES, runs=2))
    options = AdviseOptions(target=str(target_path), warmup=1, compare_onnxruntime=False)
    report = advise(swish, profile_path=prof, options=options)
    assert report["target"]["peaks"] == "file"  # a user's file is taken as it is
    ops = [op for c in report["l2_fusion"] for op in c["ops"]]
    conv1 = next(op for op in ops if op["name"] == "conv1")
    # 2 * 16*8*8 outputs * 27 MACs = 55296 FLOPs in 100 us at 1e3 FLOP/s
    assert conv1["mac_ratio"] == pytest.approx(55296 / 1e3 / 100e-6, rel=1e-6)
    buf = StringIO()
    render_text(report, Console(file=buf, width=400, color_system=None))
    text = buf.getvalue()
    assert f"mac_ratio: {conv1['mac_ratio']:.6f}*;" in text and f"* {ABOVE_PEAK}" in text
    page = html.unescape(render_html(report))
    assert f"{conv1['mac_ratio']:.6f}*" in page and ABOVE_PEAK in page
    assert "too low" not in text + page + json.dumps(report.to_json())


def text_of(report: dict) -> str:
    from io import StringIO

    from rich.console import Console

    from opfuse.advisor.render import render_text

    buf = StringIO()
    render_text(report, Console(file=buf, width=400, color_system=None))
    return buf.getvalue()


def test_text_report_says_the_shared_verdict_once(swish, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prof = write_json(tmp_path / "p.json", ort_profile(TIMES, runs=2))
    report = advise(swish, profile_path=prof, options=OPTS)
    assert len(report["ub_fusion"]) == 3
    text = text_of(report)
    ub = text[text.index("====UBModel====") : text.index("====AippFusionModel====")]
    assert ub.count("a UB fusion is the backend's") == 1
    assert "For every group below unless noted, opfuse: no pass (a UB fusion" in ub
    assert ub.count("Fusion Type: ") == 3


def test_graph_fusion_lists_a_refused_node_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The Conv after a Pad with a non-zero value is refused again each time the BatchNorm,
    Mul and Add after it fold into it; it is one node."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    c = 4
    inits = {
        "W": rng.standard_normal((c, c, 1, 1)).astype(np.float32),
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "one": np.array(1.0, np.float32),
        "s": rng.random(c).astype(np.float32) + 0.5,
        "b": rng.random(c).astype(np.float32),
        "mean": rng.random(c).astype(np.float32),
        "var": rng.random(c).astype(np.float32) + 0.5,
        "k": rng.random((1, c, 1, 1)).astype(np.float32) + 0.5,
        "k2": rng.random((1, c, 1, 1)).astype(np.float32),
    }
    nodes = [
        n("Pad", ["x", "pads", "one"], ["p"], name="pad", mode="constant"),
        n("Conv", ["p", "W"], ["c1"], name="conv"),
        n("BatchNormalization", ["c1", "s", "b", "mean", "var"], ["bn"], name="bn"),
        n("Mul", ["bn", "k"], ["m"], name="mul"),
        n("Add", ["m", "k2"], ["y"], name="add"),
    ]
    path = tmp_path / "refused_again.onnx"
    onnx.save(make_model(nodes, {"x": [1, c, 4, 4]}, {"y": [1, c, 6, 6]}, inits), path)
    prof = write_json(tmp_path / "p.json", ort_profile({"pad": ("Pad", 1.0)}, runs=1))
    report = advise(path, profile_path=prof, options=AdviseOptions(warmup=0))
    (row,) = [r for r in report["graph_fusion"] if r["pass"] == "PadConvFusionPass"]
    (reason,) = row["reasons"]
    assert reason["count"] == 3 and reason["nodes"] == ["conv"]  # refused 3 times, one node
    assert "not applied 3x: Pad value is not zero (conv)\n" in text_of(report)
