"""Small models and synthetic onnxruntime profiles for the advisor tests (a plain module,
not a conftest: ``import conftest`` would shadow the root one)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

FIXTURES = Path(__file__).parent / "fixtures"


def make_model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    """A checked model from helper nodes; ``inputs``/``outputs``: name -> shape (float)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [onnx.numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def swish_net(channels: int = 16) -> onnx.ModelProto:
    """conv1 -> Sigmoid/Mul (swish) -> conv2 -> Relu -> GlobalAveragePool -> Add(bias) -> Relu."""
    rng = np.random.default_rng(0)
    inits = {
        "W1": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
        "B1": np.zeros(channels, np.float32),
        "W2": rng.standard_normal((channels, channels, 1, 1)).astype(np.float32),
        "bias": np.ones((1, channels, 1, 1), np.float32),
    }
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        n("Sigmoid", ["c1"], ["s1"], name="sig1"),
        n("Mul", ["c1", "s1"], ["m1"], name="mul1"),
        n("Conv", ["m1", "W2"], ["c2"], name="conv2"),
        n("Relu", ["c2"], ["r2"], name="relu2"),
        n("GlobalAveragePool", ["r2"], ["p"], name="gap"),
        n("Add", ["p", "bias"], ["a"], name="add"),
        n("Relu", ["a"], ["y"], name="relu3"),
    ]
    return make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, channels, 1, 1]}, inits)


# per-node (op type, us per run) of swish_net for synthetic profiles
SWISH_TIMES = {
    "conv1": ("Conv", 100.0),
    "sig1": ("Sigmoid", 10.0),
    "mul1": ("Mul", 12.0),
    "conv2": ("Conv", 50.0),
    "relu2": ("Relu", 5.0),
    "gap": ("GlobalAveragePool", 7.0),
    "add": ("Add", 3.0),
    "relu3": ("Relu", 2.0),
}


def ort_profile(
    times: dict[str, tuple[str, float]], runs: int, warmup_factor: float = 100.0
) -> list[dict]:
    """An onnxruntime-shaped profile: ``runs`` model_run windows; the first run's node
    times are ``warmup_factor`` times larger (a warm-up run that must be dropped)."""
    events: list[dict] = []
    ts = 1000
    for run in range(runs):
        start = ts
        for name, (op_type, us) in times.items():
            dur = us * (warmup_factor if run == 0 else 1.0)
            events.append(
                {
                    "cat": "Node",
                    "name": f"{name}_kernel_time",
                    "ts": ts,
                    "dur": dur,
                    "ph": "X",
                    "args": {"op_name": op_type, "provider": "CPUExecutionProvider"},
                }
            )
            ts += int(dur) + 1
        events.append({"cat": "Session", "name": "model_run", "ts": start, "dur": ts - start})
        ts += 10
    return events


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


# a chain of elementwise ops with long type names, for the drawings of long groups
LONG_CHAIN_OPS = (
    "HardSigmoid",
    "Softplus",
    "ThresholdedRelu",
    "Softsign",
    "Sigmoid",
    "Abs",
    "Neg",
    "Tanh",
    "HardSigmoid",
    "Softplus",
    "Exp",
)


def long_chain_net(length: int = len(LONG_CHAIN_OPS)) -> onnx.ModelProto:
    """conv (with a long exporter-style name) -> ``length`` elementwise ops -> Mul(x, conv)
    -> Relu: one group of length + 3 nodes under a target whose limits allow it."""
    inits = {"W": np.ones((8, 8, 1, 1), np.float32)}
    n = helper.make_node
    prefix = "/backbone/stage3/block.12/expand/activation"
    nodes = [n("Conv", ["x", "W"], ["c"], name=f"{prefix}/Conv_output_0_conv")]
    x = "c"
    for i, op in enumerate(LONG_CHAIN_OPS[:length]):
        nodes.append(n(op, [x], [f"e{i}"], name=f"{prefix}/{op}_output_{i}"))
        x = f"e{i}"
    nodes += [
        n("Mul", [x, "c"], ["m"], name=f"{prefix}/gate/Mul_output_0"),
        n("Relu", ["m"], ["y"], name=f"{prefix}/Relu_output_0_final"),
    ]
    return make_model(nodes, {"x": [1, 8, 4, 4]}, {"y": [1, 8, 4, 4]}, inits)


def long_chain_target(path: Path) -> Path:
    """The cpu target with UB limits that let ``long_chain_net`` be one group."""
    target = json.loads((FIXTURES.parents[2] / "src/opfuse/targets/cpu.json").read_text())
    target["name"] = "wide"
    target["ub_limits"] = {k: 32 for k in target["ub_limits"]}
    path.write_text(json.dumps(target))
    return path
