"""A tuned result deploys as measured, and the interface stays the user's: the deployment
file (OUTPUT.session.json, schema 2) records the graph settings tune chose;
opfuse.InferenceSession runs the tuned model as written (the graph onnxruntime runs is
the tuned file's) and rebuilds it from the original; tune tries a layout change only when
asked and says when it keeps one. Fake runtime (deterministic timings)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import opfuse
from helpers import model_from_text
from opfuse import api
from opfuse.errors import OpfuseError
from opfuse.runtime.fake import FakeRuntime
from opfuse.runtime.ort import session_options
from opfuse.tuning import search as tuning
from opfuse.tuning.deployment import read_deployment

rng = np.random.default_rng(0)
GEMM = "MatMulBiasAddFusionPass"
HARDSWISH = "HardSwishFusionPass"


def hardswish_then_linear(path: Path) -> Path:
    """x * Clip(x + 3, 0, 6) / 6 (HardSwish needs opset 14; the model is at 13), then a
    2-D MatMul + bias (MatMulBiasAddFusionPass makes a Gemm of it)."""
    model = model_from_text(
        """
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1,8] x) => (float[1,4] y) {
          a = Add(x, three)
          c = Clip(a, zero, six)
          m = Mul(x, c)
          h = Div(m, six)
          p = MatMul(h, w)
          y = Add(p, b)
        }""",
        {
            "three": np.array(3.0, np.float32),
            "zero": np.array(0.0, np.float32),
            "six": np.array(6.0, np.float32),
            "w": rng.standard_normal((8, 4)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32),
        },
    )
    ir.save(model, str(path))
    return path


# a Gemm is slow on this "runtime", a HardSwish fast: tune must choose both flips
COSTS = {"Gemm": 0.05, "HardSwish": 0.0001}


def op_counts(path: str | Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def tune_to(model: Path, tmp_path: Path, runtime: FakeRuntime, **settings):
    out = tmp_path / "tuned.onnx"
    switch, session, report = (
        tmp_path / "tuned.cfg",
        tmp_path / "tuned.onnx.session.json",
        tmp_path / "tune.json",
    )
    tune_settings = tuning.SearchSettings(budget_s=600, bench_seconds=0.05, **settings)

    def keep(result, built):
        tuning.write_outputs(
            result, built, model, out, switch, report, tune_settings.input_shapes, session
        )

    result = tuning.tune(model, runtime, tune_settings, keep=keep)
    return result, out, session, report


@pytest.fixture
def tuned(tmp_path):
    model = hardswish_then_linear(tmp_path / "m.onnx")
    result, out, session, _ = tune_to(model, tmp_path, FakeRuntime(COSTS, default=0.001))
    return model, result, out, session


def ort_graph(monkeypatch, tmp_path: Path, name: str):
    """Make opfuse.InferenceSession save the graph onnxruntime runs; return its path."""
    saved = tmp_path / name
    real = api.ort_session_options

    def saving(settings):
        opts, providers = real(settings)
        opts.optimized_model_filepath = str(saved)
        return opts, providers

    monkeypatch.setattr(api, "ort_session_options", saving)
    return saved


def plain_ort_graph(model: Path, tmp_path: Path, name: str) -> Counter[str]:
    """The graph onnxruntime runs for a file at the default session settings."""
    opts = session_options("all", 1)
    opts.optimized_model_filepath = str(tmp_path / name)
    ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return op_counts(tmp_path / name)


def test_tune_chooses_the_opset_and_the_disabled_pass(tuned):
    _, result, out, session = tuned
    assert result.best.target_opset == 14 and result.best.switches == ((GEMM, False),)
    assert op_counts(out) == Counter({"HardSwish": 1, "MatMul": 1, "Add": 1})
    # the chosen variant fuses HardSwish: the "would fire at a higher opset" note is not news
    assert HARDSWISH in result.probe.upgrades and result.open_upgrades() == {}
    data = json.loads(session.read_text())
    assert data["schema"] == "opfuse.session/2"
    graph = data["graph"]
    assert graph["disable"] == [GEMM] and graph["enable"] == [] and graph["target_opset"] == 14
    assert graph["fusion_switch"] == {"Switch": {"GraphFusion": {GEMM: "off"}}}
    assert graph["layout"] == "keep" and not graph["static_shapes"] and not graph["original"]
    assert "--target-opset 14" in graph["command"]
    assert data["intra_op_num_threads"] == 1  # the session settings it was measured at
    assert data["measured"]["graph"]["latency_ratio"] < 1


def test_inference_session_runs_the_tuned_model_as_written(tuned, tmp_path, monkeypatch):
    model, _, out, session = tuned
    saved = ort_graph(monkeypatch, tmp_path, "session_graph.onnx")
    sess = opfuse.InferenceSession(str(out), session_file=session)
    assert sess.deployed == "as written"
    with pytest.raises(OpfuseError, match="runs the model as written"):
        sess.optimize_result  # noqa: B018
    runs = op_counts(saved)
    assert runs == plain_ort_graph(out, tmp_path, "tuned_graph.onnx")
    # what the old session file gave: the default optimize of the same file, another graph
    default = tmp_path / "default.onnx"
    opfuse.optimize(str(model), output=default)
    assert runs != plain_ort_graph(default, tmp_path, "default_graph.onnx")
    feeds = {"x": rng.standard_normal((1, 8)).astype(np.float32)}
    want = ort.InferenceSession(str(model)).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_inference_session_rebuilds_the_tuned_model_from_the_original(tuned, tmp_path, monkeypatch):
    model, _, out, session = tuned
    saved = ort_graph(monkeypatch, tmp_path, "session_graph.onnx")
    sess = opfuse.InferenceSession(str(model), session_file=session)
    assert sess.deployed == "rebuilt"
    rebuilt = ir.to_proto(sess.optimize_result.model)
    assert Counter(n.op_type for n in rebuilt.graph.node) == op_counts(out)
    assert rebuilt.opset_import[0].version == 14
    assert op_counts(saved) == plain_ort_graph(out, tmp_path, "tuned_graph.onnx")
    # in memory too: the tuned model as a ModelProto runs as written
    proto = onnx.load(str(out))
    assert opfuse.InferenceSession(proto, session_file=session).deployed == "as written"


@pytest.mark.parametrize("which", ["original", "tuned"])
@pytest.mark.parametrize(
    "keyword", [{"target_opset": 17}, {"disable": ["ConvAddFusionPass"]}, {"layout": "nchw"}]
)
def test_the_graph_settings_of_the_file_cannot_be_contradicted(tuned, which, keyword):
    """Refused whether the file rebuilds the original or runs the tuned model as written
    (there a graph keyword was silently ignored)."""
    model, _, out, session = tuned
    given = model if which == "original" else out
    with pytest.raises(OpfuseError, match=f"drop {next(iter(keyword))}=") as info:
        opfuse.InferenceSession(str(given), session_file=session, **keyword)
    assert "\n" not in str(info.value)


def test_an_original_kept_runs_as_is(tmp_path):
    """Nothing beats the original: the file says so, and the original is not optimized."""
    model = hardswish_then_linear(tmp_path / "m.onnx")
    slow = {"HardSwish": 0.05, "Gemm": 0.05}  # every rewrite is slower here
    result, out, session, _ = tune_to(model, tmp_path, FakeRuntime(slow, default=0.001))
    assert result.best.original
    deployment = read_deployment(session)
    assert deployment.graph is not None and deployment.graph.original
    sess = opfuse.InferenceSession(str(model), session_file=session)
    assert sess.deployed == "as written"


def test_a_schema_1_file_keeps_its_meaning(tmp_path):
    """A file an older tune wrote (session settings only) still applies them."""
    model = hardswish_then_linear(tmp_path / "m.onnx")
    old = tmp_path / "old.session.json"
    old.write_text(json.dumps({"schema": "opfuse.session/1", "intra_op_num_threads": 2}))
    sess = opfuse.InferenceSession(str(model), session_file=old, verify=False)
    assert sess.deployed == "optimized"
    assert sess.get_session_options().intra_op_num_threads == 2


@pytest.mark.parametrize(
    "graph, message",
    [
        ({"disable": "X"}, "disable is not a list of pass names"),
        ({"target_opset": "14"}, "target_opset '14' is not an opset"),
        ({"layout": "hwcn"}, "layout 'hwcn'"),
    ],
)
def test_a_bad_graph_section_is_a_one_line_error(tmp_path, graph, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"schema": "opfuse.session/2", "graph": graph}))
    with pytest.raises(OpfuseError, match=message) as info:
        read_deployment(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


# --- the interface is the user's ---------------------------------------------------------

NHWC = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N,5,6,4] x) => (float[N,4,5,6] y) {
      a = Mul(x, k)
      b = Add(a, m)
      t = Transpose<perm=[0,3,1,2]>(b)
      y = Conv<pads=[1,1,1,1]>(t, w)
    }"""


def nhwc_model(path: Path) -> Path:
    model = model_from_text(
        NHWC,
        {
            "k": np.array(1 / 127.5, np.float32),
            "m": rng.standard_normal(4).astype(np.float32),
            "w": rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        },
    )
    ir.save(model, str(path))
    return path


def input_dims(path: Path) -> list[list[object]]:
    graph = onnx.load(str(path)).graph
    return [
        [
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in v.type.tensor_type.shape.dim
        ]
        for v in graph.input
    ]


# the input Transpose is what costs: a re-declared NCHW input would be fastest
TRANSPOSE_COSTS = {"Transpose": 0.05}


def test_tune_keeps_the_inputs_unless_asked(tmp_path):
    model = nhwc_model(tmp_path / "nhwc.onnx")
    result, out, _, report = tune_to(model, tmp_path, FakeRuntime(TRANSPOSE_COSTS, default=0.001))
    assert not any(t.variant.layout != "keep" for t in result.trials)
    assert input_dims(out) == input_dims(model) == [["N", 5, 6, 4]]
    assert (
        result.interface_changed == [] and json.loads(report.read_text())["interface_changed"] == []
    )
    feeds = {"x": rng.standard_normal((1, 5, 6, 4)).astype(np.float32)}
    ort.InferenceSession(str(out)).run(None, feeds)  # the original's inputs run


@pytest.mark.parametrize("ask", [{"allow_interface_change": True}, {"layouts": ("nchw",)}])
def test_tune_changes_the_inputs_when_asked_and_says_so(tmp_path, ask, capsys):
    model = nhwc_model(tmp_path / "nhwc.onnx")
    result, out, session, report = tune_to(
        model, tmp_path, FakeRuntime(TRANSPOSE_COSTS, default=0.001), **ask
    )
    assert result.best.layout == "nchw"
    assert input_dims(out) == [["N", 4, 5, 6]]
    [change] = result.interface_changed
    assert change == "input 'x' is float32[?,4,5,6], was float32[?,5,6,4]"
    assert json.loads(report.read_text())["interface_changed"] == [change]
    data = json.loads(session.read_text())
    assert data["graph"]["layout"] == "nchw"
    assert data["measured"]["graph"]["interface_changed"] == [change]
    from opfuse.cli.tune import _print_tune

    _print_tune(result, "opfuse optimize m.onnx -o out.onnx", tmp_path / "s.cfg")
    summary = " ".join(capsys.readouterr().out.split())
    assert (
        f"interface changed (asked for): callers must feed the output differently: {change}"
        in summary
    )


def test_the_readme_snippets_run_the_tuned_graph(tuned, tmp_path, monkeypatch, capsys):
    """The README's deployment snippets (```py blocks of its tune section), run on a tuned
    model: opfuse's session runs it as written and rebuilds it from the original; plain
    onnxruntime loads the tuned file with the file's settings."""
    import re
    import shutil

    model, _, out, session = tuned
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    blocks = re.findall(r"```py\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 2 and "session_file=" in blocks[0] and "ort.SessionOptions" in blocks[1]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shutil.copy(model, scratch / "model.onnx")
    shutil.copy(out, scratch / "model.tuned.onnx")
    shutil.copy(session, scratch / "model.tuned.onnx.session.json")
    monkeypatch.chdir(scratch)
    scope: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert capsys.readouterr().out.split() == ["as", "written", "rebuilt"]
    exec(compile(blocks[1], "README.md", "exec"), scope)
    plain = scope["sess"]
    assert isinstance(plain, ort.InferenceSession)
    feeds = {"x": rng.standard_normal((1, 8)).astype(np.float32)}
    want = ort.InferenceSession(str(model)).run(None, feeds)[0]
    np.testing.assert_allclose(plain.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
