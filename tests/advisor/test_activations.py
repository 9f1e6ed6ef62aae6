"""Written-out activations are one elementwise member of a group; the squeeze-excite
multiply joins the group of its conv."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from advisor_models import make_model
from onnx import helper

from opfuse.advisor.graph import from_model
from opfuse.advisor.groups import grow_groups
from opfuse.advisor.written_activations import find_activations
from opfuse.runtime.targets import load_target

LIMITS = load_target("ascend310").ub_limits  # Conv + up to 3 elementwise
N = helper.make_node
SHAPE = {"x": [1, 4, 4, 4]}
OUT = {"y": [1, 4, 4, 4]}


def scalars(**values: float) -> dict[str, np.ndarray]:
    return {k: np.array(v, np.float32) for k, v in values.items()}


def conv_then(act_nodes: list, extra: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    """Conv(x) -> c, then the activation's nodes (reading c) ending in 'a', then Relu -> y."""
    inits = {"W": np.ones((4, 4, 1, 1), np.float32), **extra}
    nodes = [N("Conv", ["x", "W"], ["c"], name="conv"), *act_nodes]
    nodes.append(N("Relu", ["a"], ["y"], name="relu"))
    return from_model(ir.from_proto(make_model(nodes, SHAPE, OUT, inits)))


FORMS = {
    "HardSwish": (
        [
            N("Add", ["c", "three"], ["t"], name="add3"),
            N("Clip", ["t", "zero", "six"], ["cl"], name="clip"),
            N("Mul", ["c", "cl"], ["m"], name="mul"),
            N("Div", ["m", "six"], ["a"], name="div6"),
        ],
        scalars(three=3.0, zero=0.0, six=6.0),
    ),
    "HardSigmoid": (
        [
            N("Add", ["c", "three"], ["t"], name="add3"),
            N("Clip", ["t", "zero", "six"], ["cl"], name="clip"),
            N("Div", ["cl", "six"], ["a"], name="div6"),
        ],
        scalars(three=3.0, zero=0.0, six=6.0),
    ),
    "SiLU": (
        [N("Sigmoid", ["c"], ["s"], name="sig"), N("Mul", ["c", "s"], ["a"], name="mul")],
        {},
    ),
    "GELU": (
        [
            N("Div", ["c", "sqrt2"], ["d"], name="div"),
            N("Erf", ["d"], ["e"], name="erf"),
            N("Add", ["e", "one"], ["p"], name="add1"),
            N("Mul", ["c", "p"], ["m"], name="mul"),
            N("Mul", ["m", "half"], ["a"], name="half"),
        ],
        scalars(sqrt2=1.4142135, one=1.0, half=0.5),
    ),
    "Mish": (
        [
            N("Softplus", ["c"], ["sp"], name="softplus"),
            N("Tanh", ["sp"], ["th"], name="tanh"),
            N("Mul", ["c", "th"], ["a"], name="mul"),
        ],
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_written_out_activation_is_one_member(name: str) -> None:
    nodes, extra = FORMS[name]
    g = conv_then(nodes, extra)
    acts = find_activations(g)
    assert {a.name for a in acts.values()} == {name}
    assert sorted(g.nodes[i].name for i in next(iter(acts.values())).nodes) == sorted(
        n.name for n in nodes
    )
    (group,) = grow_groups(g, LIMITS)
    # Conv + the activation (one member, however many nodes) + Relu: within Conv + 3
    assert group.names == ["conv", *(n.name for n in nodes), "relu"]
    assert [a.name for a in group.activations] == [name]


def test_scaled_sigmoid_is_not_silu() -> None:
    """Sigmoid(c) * k reads c once: not x * Sigmoid(x)."""
    g = conv_then(
        [N("Sigmoid", ["c"], ["s"], name="sig"), N("Mul", ["s", "k"], ["a"], name="mul")],
        scalars(k=2.0),
    )
    assert find_activations(g) == {}


def test_activation_read_elsewhere_inside_is_not_one() -> None:
    """The Clip's output also feeds another consumer: more than one tensor leaves."""
    nodes, extra = FORMS["HardSwish"]
    inits = {"W": np.ones((4, 4, 1, 1), np.float32), **extra}
    graph = [
        N("Conv", ["x", "W"], ["c"], name="conv"),
        *nodes,
        N("Relu", ["a"], ["y"], name="relu"),
        N("Neg", ["cl"], ["z"], name="other"),
    ]
    g = from_model(ir.from_proto(make_model(graph, SHAPE, {**OUT, "z": [1, 4, 4, 4]}, inits)))
    assert all(a.name != "HardSwish" for a in find_activations(g).values())


def squeeze_excite() -> ir.Model:
    """EfficientNet's block: dwconv -> SiLU -> SE (GlobalAveragePool, Conv, Relu, Conv,
    Sigmoid) -> se_excite Mul(swish, gate) -> project Conv."""
    rng = np.random.default_rng(0)
    inits = {
        "Wd": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
        "Wr": rng.standard_normal((2, 8, 1, 1)).astype(np.float32),
        "We": rng.standard_normal((8, 2, 1, 1)).astype(np.float32),
        "Wp": rng.standard_normal((8, 8, 1, 1)).astype(np.float32),
    }
    nodes = [
        N("Conv", ["x", "Wd"], ["d"], name="dwconv", group=8, pads=[1, 1, 1, 1]),
        N("Sigmoid", ["d"], ["s"], name="act_sig"),
        N("Mul", ["d", "s"], ["sw"], name="act_mul"),
        N("GlobalAveragePool", ["sw"], ["p"], name="se_squeeze"),
        N("Conv", ["p", "Wr"], ["r"], name="se_reduce"),
        N("Relu", ["r"], ["rr"], name="se_relu"),
        N("Conv", ["rr", "We"], ["e"], name="se_expand"),
        N("Sigmoid", ["e"], ["gate"], name="se_sig"),
        N("Mul", ["sw", "gate"], ["ex"], name="se_excite"),
        N("Conv", ["ex", "Wp"], ["y"], name="project"),
    ]
    return ir.from_proto(make_model(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]}, inits))


def test_squeeze_excite_multiply_joins_its_conv() -> None:
    groups = grow_groups(from_model(squeeze_excite()), LIMITS)
    names = [grp.names for grp in groups]
    assert ["dwconv", "act_sig", "act_mul", "se_excite"] in names
    assert ["se_reduce", "se_relu"] in names
    group = next(grp for grp in groups if grp.names[0] == "dwconv")
    assert group.output == "ex"  # the one result; 'sw' also goes to the squeeze branch


def test_squeeze_excite_multiply_stays_out_beyond_the_limit() -> None:
    limits = {**LIMITS, "conv_elementwise": 1}  # room for the SiLU only
    groups = grow_groups(from_model(squeeze_excite()), limits)
    assert ["dwconv", "act_sig", "act_mul"] in [grp.names for grp in groups]
    assert all("se_excite" not in grp.names or grp.names[0] != "dwconv" for grp in groups)
