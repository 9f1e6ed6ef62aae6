"""Small facts about values and nodes that many rules ask, and the folding policy two
passes share: the one general helper module of the pass modules (a pass module imports no
other pass module). What builds or evaluates is the engine's: ``opfuse.rewrite.builder``
(``forward``, ``needs_identity``, ``drop_pages``) and ``opfuse.rewrite.evaluate``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from opfuse.model.graphs import DEFAULT_DOMAINS as DEFAULT_DOMAINS  # re-exported for the passes
from opfuse.rewrite.pattern import const_array

FOLD_GROWTH_ALLOWANCE = 4096  # bytes one fold may add to the model (shape-sized results)


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dim is a known integer, else None."""
    if value is None or value.shape is None:
        return None
    dims = tuple(d for d in value.shape if isinstance(d, int))
    return dims if len(dims) == len(value.shape) else None


def rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def producer(value: ir.Value | None, *op_types: str) -> ir.Node | None:
    """The default-domain node of one of ``op_types`` that makes ``value``, else None."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type not in op_types or node.domain not in DEFAULT_DOMAINS:
        return None
    return node


def perm_of(node: ir.Node, rank_: int | None = None) -> tuple[int, ...] | None:
    """A Transpose's permutation; without a ``perm`` attribute the reversed dims of
    ``rank_`` (default: its input's rank), None when that rank is unknown, and None for a
    ``perm`` that is not a permutation of a known rank (an invalid model, which
    onnxruntime refuses with one line: no rule reads it)."""
    perm = attr(node, "perm")
    n = rank(node.inputs[0]) if rank_ is None else rank_
    if perm is not None:
        found = tuple(int(p) for p in perm)
        valid = sorted(found) == list(range(len(found))) and n in (None, len(found))
        return found if valid else None
    return None if n is None else tuple(reversed(range(n)))


def axes_of(node: ir.Node, absent: list[int] | None = None) -> list[int] | None:
    """A node's constant axes: its ``axes`` attribute (older opsets), else its constant
    second input; ``absent`` when it has neither (a Reduce* then reduces all dims: []),
    None when the input is not constant."""
    axes = attr(node, "axes")
    if axes is not None:
        return [int(a) for a in axes]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        array = const_array(node.inputs[1])
        return None if array is None else [int(a) for a in array.reshape(-1)]
    return None if absent is None else list(absent)


def reduce_axes(node: ir.Node) -> list[int] | None:
    """A Reduce* node's axes; [] reduces all dims (or none, with noop_with_empty_axes);
    None when the axes input is not constant."""
    return axes_of(node, absent=[])


# ops whose every run draws new random values: never folded, never merged by CSE
NONDETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


def nondeterministic(node: ir.Node, opset: int) -> str | None:
    """Why two runs of ``node`` on the same inputs may differ, or None when they cannot:
    a random op (a custom op whose name says random or dropout), or Dropout that may be
    in training mode (a training_mode input that is not a constant false; before opset 7,
    is_test=0, the default)."""
    if node.domain not in DEFAULT_DOMAINS:  # a custom op: judged by its name
        random = ("Random", "Dropout", "Multinomial", "Bernoulli")
        if any(word in node.op_type for word in random):
            return f"{node.domain}.{node.op_type} may be nondeterministic"
        return None
    if node.op_type in NONDETERMINISTIC:
        return f"{node.op_type} is nondeterministic"
    if node.op_type != "Dropout":
        return None
    if opset < 7:
        is_test = node.attributes.get("is_test")
        return None if is_test is not None and is_test.value else "Dropout is in training mode"
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        training = const_array(node.inputs[2])
        if training is None or training.size == 0 or bool(training.reshape(-1)[0]):
            return "Dropout may be in training mode"
    return None


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    a = node.attributes.get(name)
    return default if a is None else a.value


def scalar_value(array: np.ndarray) -> float | None:
    """The single value of an array whose elements are all equal, else None."""
    if array.size == 0:
        return None
    flat = array.reshape(-1)
    first = flat[0]
    return float(first) if np.all(flat == first) else None


def _producer_op(value: ir.Value | None) -> ir.Node | None:
    return None if value is None else value.producer()


def _times_act_sum(node: ir.Node) -> bool:
    """``Mul(x, Add(Erf|Tanh(...), c))``: the product at the heart of a GELU."""
    if node.op_type != "Mul":
        return False
    for value in node.inputs:
        add = _producer_op(value)
        if add is not None and add.op_type == "Add":
            for term in add.inputs:
                act = _producer_op(term)
                if act is not None and act.op_type in ("Erf", "Tanh"):
                    return True
    return False


def gelu_product(mul: ir.Node) -> bool:
    """Whether ``mul`` is one of the Muls of ``0.5 * x * (1 + Erf|Tanh(...))``, which
    onnxruntime fuses into one Gelu kernel: folding its constant into a neighbour (a
    MatMul's weight) would break that fusion."""
    if _times_act_sum(mul):
        return True
    return any((p := _producer_op(v)) is not None and _times_act_sum(p) for v in mul.inputs)


GELU_CUBE_COEFFICIENT = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654  # math.sqrt(2 / math.pi)
_CONST_RTOL = 1e-5  # a float32 constant carries ~1e-7 relative error


def _is_about(value: ir.Value | None, target: float) -> bool:
    """Whether ``value`` is a constant whose elements all equal ``target`` (to float32)."""
    array = const_array(value)
    found = None if array is None else scalar_value(array)
    return found is not None and abs(found - target) <= _CONST_RTOL * abs(target)


def _consumers(value: ir.Value | None, op_type: str) -> list[ir.Node]:
    if value is None:
        return []
    return [node for node in value.consumers() if node.op_type == op_type]


def _times(node: ir.Node, value: ir.Value, target: float) -> bool:
    """``node`` is Mul(value, c) or Mul(c, value) with c about ``target``."""
    a, b = node.inputs[0], node.inputs[1]
    return (a is value and _is_about(b, target)) or (b is value and _is_about(a, target))


def _plus(node: ir.Node, value: ir.Value, other: ir.Value | None = None, c: float = 0.0) -> bool:
    """``node`` is Add(value, other) in either order (``other`` None: a constant about c)."""
    a, b = node.inputs[0], node.inputs[1]
    for mine, theirs in ((a, b), (b, a)):
        if mine is value and (theirs is other if other is not None else _is_about(theirs, c)):
            return True
    return False


def _halves_product(mul: ir.Node, x: ir.Value, act_sum: ir.Value) -> bool:
    """``mul`` reads ``act_sum`` and makes ``0.5 * x * act_sum``: Mul(Mul(x, 0.5), act_sum),
    or Mul(x, act_sum) then times 0.5."""
    other = mul.inputs[1] if mul.inputs[0] is act_sum else mul.inputs[0]
    if other is x:
        return any(_times(m, mul.outputs[0], 0.5) for m in _consumers(mul.outputs[0], "Mul"))
    half = _producer_op(other)
    return half is not None and half.op_type == "Mul" and _times(half, x, 0.5)


def _then(
    values: Sequence[ir.Value], op_type: str, test: Callable[[ir.Node, ir.Value], bool]
) -> list[ir.Value]:
    """The outputs of the ``op_type`` nodes reading one of ``values`` that pass ``test``."""
    return [n.outputs[0] for v in values for n in _consumers(v, op_type) if test(n, v)]


def tanh_gelu_cube(pow_node: ir.Node) -> bool:
    """Whether ``pow_node`` is the ``x^3`` of GPT-2's tanh GELU,
    ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, which onnxruntime fuses
    into one FastGelu only while x^3 is a Pow (its session's fusion at ORT_ENABLE_ALL and
    its transformers optimizer both match the Pow, not Mul(Mul(x, x), x))."""
    x = pow_node.inputs[0]
    if x is None:
        return False
    values = _then(pow_node.outputs, "Mul", lambda n, v: _times(n, v, GELU_CUBE_COEFFICIENT))
    values = _then(values, "Add", lambda n, v: _plus(n, v, x))
    values = _then(values, "Mul", lambda n, v: _times(n, v, SQRT_2_OVER_PI))
    values = _then(values, "Tanh", lambda n, v: True)
    values = _then(values, "Add", lambda n, v: _plus(n, v, c=1.0))
    return any(_halves_product(m, x, v) for v in values for m in _consumers(v, "Mul"))
