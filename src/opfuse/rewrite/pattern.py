"""Value patterns matched upward from a root node along producer edges.

    Op("BatchNormalization",
       Op("Conv", Var("x"), Const("w"), Optional(Const("b")), name="conv"),
       Const("scale"), Const("bias"), Const("mean"), Const("var"), name="bn")

``Var`` binds any value, ``Const`` a value with a constant tensor (an initializer or a
Constant node's output), ``Op`` the output of a node of one of the given op types, whose
inputs match in order; ``Optional`` also matches an absent input; ``Or`` the first of its
alternatives that matches.

Patterns are DAGs, not only trees: a name bound once is a reference the second time. The
same ``Var`` name must bind the same value, and the same named ``Op`` object used twice must
meet the same node (``exp`` below is one node read by the Div and by the ReduceSum):

    exp = Op("Exp", Var("x"), name="exp")
    Op("Div", exp, Op("ReduceSum", exp, variadic=True))

Predicates: ``Const(value=0.5)`` (every element equal to it), ``Const(where=f)``,
``Var("x", constant=False)`` (not a constant), ``Op(..., attrs={"axis": -1})`` (an
attribute's value, or a callable given the value or None), ``Op(..., where=f)`` (a test of
the node, for what no input pattern says: a variadic op's inputs, its outputs). A rule's
root may be an ``Or`` of ``Op``s. A two-input op commutes when declared (``commute=True``) and by default for the ops
in ``COMMUTATIVE``. Matching is greedy: once an input has matched, a later failure retries
only the other operand order of a commuting op, not the alternatives inside that input.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from opfuse.model.graphs import DEFAULT_DOMAINS

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"})
# DataType.is_floating_point() as a set: the driver asks it of every match's root
FLOATING = frozenset(t for t in ir.DataType if t.is_floating_point())


def use_count(value: ir.Value) -> int:
    """How many node inputs read ``value``, without building ``uses()``'s tuple (a
    constant shared by thousands of nodes would make asking it at each of them quadratic)."""
    uses = getattr(value, "_uses", None)  # onnx-ir's own record of them
    return len(uses) if isinstance(uses, dict) else len(value.uses())


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind a value (initializer or Constant node), as numpy, else None.

    Graph inputs that are also initializers are not constants: callers may override them.
    """
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is None or producer.op_type != "Constant":
            return None  # the common case, answered without get_const_tensor's checks
        attr = producer.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR and producer.domain == "":
            tensor = attr.value  # skips as_tensor's slow isinstance on a Protocol
        else:
            tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    if type(tensor) is ir.serde.TensorProtoTensor:
        cached = _decoded.get(tensor)
        if cached is not None:
            return cached
        # counted on the protobuf: the tensor's own nbytes builds a Shape on every call
        if math.prod(tensor.raw.dims) <= DECODED_CACHE_ELEMENTS:
            try:
                cached = tensor.numpy()
            except Exception:  # an unsupported dtype
                return None
            cached.flags.writeable = False  # shared by every caller
            _decoded[tensor] = cached
            return cached
    try:
        return tensor.numpy()
    except Exception:  # an external tensor whose file vanished, an unsupported dtype
        return None


# A small constant read from the file is decoded from its protobuf on every .numpy();
# rules ask for the same shape vectors and scalars many times, so those are decoded once.
DECODED_CACHE_ELEMENTS = 512
_decoded: weakref.WeakKeyDictionary[ir.TensorProtocol, np.ndarray] = weakref.WeakKeyDictionary()


class Match:
    """The bindings of one pattern match: nodes, values and constant arrays by name."""

    def __init__(self, root: ir.Node) -> None:
        self.root = root
        self.nodes: list[ir.Node] = []
        self.node_names: dict[str, ir.Node] = {}
        self.values: dict[str, ir.Value] = {}
        self.consts: dict[str, np.ndarray] = {}
        # what a rule's check found and its rewrite uses (a plan), by the rule's own names
        self.notes: dict[str, Any] = {}

    def _state(self) -> tuple[int, dict[str, ir.Node], dict[str, ir.Value], dict[str, Any]]:
        return len(self.nodes), dict(self.node_names), dict(self.values), dict(self.consts)

    def _restore(self, state: tuple[int, dict[str, ir.Node], dict[str, ir.Value], dict]) -> None:
        n, self.node_names, self.values, self.consts = state
        del self.nodes[n:]

    def __getitem__(self, name: str) -> Any:
        """A constant as numpy, else a bound node, else a bound value."""
        if name in self.consts:
            return self.consts[name]
        if name in self.node_names:
            return self.node_names[name]
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.consts or name in self.node_names or name in self.values

    def node(self, name: str) -> ir.Node:
        return self.node_names[name]

    def value(self, name: str) -> ir.Value:
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default  # noqa: SIM401  (not a dict)

    def attr(self, node_name: str, attr: str, default: Any = None) -> Any:
        """An attribute of a bound node as a plain Python value."""
        a = self.node_names[node_name].attributes.get(attr)
        return default if a is None else a.value

    def covered(self) -> list[ir.Node]:
        """Every node the match concerns, root first: the nodes it would replace and the
        ones it names. A subclass adds what its state points at (the layer an affine
        chain would fold into), so a refusal can be placed on all of them."""
        return list(dict.fromkeys([self.root, *self.nodes, *self.node_names.values()]))


class Pattern:
    def match(self, value: ir.Value | None, m: Match) -> bool:
        raise NotImplementedError


class Var(Pattern):
    """Any present value; the same name twice must bind the same value.
    ``constant=False``: a value with no constant tensor."""

    def __init__(self, name: str, *, constant: bool | None = None) -> None:
        self.name = name
        self.constant = constant

    def match(self, value: ir.Value | None, m: Match) -> bool:
        if value is None:
            return False
        bound = m.values.get(self.name)
        if bound is not None:
            return bound is value
        if self.constant is not None and (const_array(value) is not None) != self.constant:
            return False
        m.values[self.name] = value
        return True


class Const(Pattern):
    """A value with a constant tensor; ``m[name]`` is its numpy array (unnamed: nothing is
    bound). ``value``: every element equals it (within ``rtol`` when given); ``where``: a
    test of the array."""

    def __init__(
        self,
        name: str | None = None,
        *,
        value: float | None = None,
        rtol: float | None = None,
        where: Callable[[np.ndarray], bool] | None = None,
    ) -> None:
        self.name = name
        self.value = value
        self.rtol = rtol
        self.where = where

    def match(self, value: ir.Value | None, m: Match) -> bool:
        if value is None:
            return False
        if self.name is not None and self.name in m.values:
            return m.values[self.name] is value
        array = const_array(value)
        if array is None or not self.accepts(array):
            return False
        if self.name is not None:
            m.values[self.name] = value
            m.consts[self.name] = array
        return True

    def accepts(self, array: np.ndarray) -> bool:
        if self.value is not None:
            if array.size == 0 or array.dtype.kind not in "biufc":
                return False
            if self.rtol is None:
                if not np.all(array == self.value):
                    return False
            elif not np.allclose(array, self.value, rtol=self.rtol, atol=0.0):
                return False
        return self.where is None or bool(self.where(array))


class Or(Pattern):
    """The first alternative that matches (its bindings only)."""

    def __init__(self, *alternatives: Pattern) -> None:
        self.alternatives = alternatives

    def match(self, value: ir.Value | None, m: Match) -> bool:
        for alternative in self.alternatives:
            state = m._state()
            if alternative.match(value, m):
                return True
            m._restore(state)
        return False

    @property
    def op_types(self) -> tuple[str, ...]:
        """The root op types of alternatives that are all ``Op``s (a rule's root)."""
        types: list[str] = []
        for alternative in self.alternatives:
            assert isinstance(alternative, (Op, Or)), "a root Or holds Op patterns"
            types += alternative.op_types
        return tuple(dict.fromkeys(types))

    def could_match(self, node: ir.Node) -> bool:
        return any(a.could_match(node) for a in self.alternatives if isinstance(a, (Op, Or)))

    def match_node(self, node: ir.Node, m: Match) -> bool:
        for alternative in self.alternatives:
            assert isinstance(alternative, (Op, Or)), "a root Or holds Op patterns"
            state = m._state()
            if alternative.match_node(node, m):
                return True
            m._restore(state)
        return False


class Optional(Pattern):
    """An input that may be absent; when present it must match ``inner``."""

    def __init__(self, inner: Pattern) -> None:
        self.inner = inner

    def match(self, value: ir.Value | None, m: Match) -> bool:
        return value is None or self.inner.match(value, m)


def _op_types(pattern: Pattern) -> tuple[str, ...]:
    """The op types a value matching ``pattern`` must be made by; () when any value may
    match (a variable, a constant, an optional input, an alternative that is not an op)."""
    if isinstance(pattern, Op):
        return pattern.op_types
    if isinstance(pattern, Or) and all(isinstance(a, (Op, Or)) for a in pattern.alternatives):
        types = [_op_types(a) for a in pattern.alternatives]
        return () if any(not t for t in types) else tuple(t for ts in types for t in ts)
    return ()


class Op(Pattern):
    """The ``output``-th output of a default-domain node of one of ``op_types``."""

    def __init__(
        self,
        op_types: str | Sequence[str],
        *inputs: Pattern,
        name: str | None = None,
        output: int = 0,
        variadic: bool = False,
        attrs: Mapping[str, Any] | None = None,
        commute: bool | None = None,
        where: Callable[[ir.Node], bool] | None = None,
    ) -> None:
        self.op_types = (op_types,) if isinstance(op_types, str) else tuple(op_types)
        self.inputs = inputs
        self.name = name
        self.output = output
        self.variadic = variadic  # extra trailing inputs are allowed and ignored
        self.attrs = dict(attrs or {})
        self.commute = commute  # None: the ops in COMMUTATIVE
        self.where = where
        self._made_by: list[frozenset[str]] | None = None  # could_match's input op types

    def match(self, value: ir.Value | None, m: Match) -> bool:
        if value is None:
            return False
        node = value.producer()
        if node is None or node.outputs[self.output] is not value:
            return False
        if self.name is not None and self.name in m.node_names:
            return m.node_names[self.name] is node  # a reference to a node bound earlier
        return self.match_node(node, m)

    def could_match(self, node: ir.Node) -> bool:
        """A cheap necessary condition for ``match_node``: the op type, and for each input
        pattern that is an op, some input made by a node of its op types (most nodes a
        rule is tried at fail here, before any binding is built)."""
        if node.op_type not in self.op_types:
            return False
        if self._made_by is None:
            self._made_by = [frozenset(_op_types(p)) for p in self.inputs if _op_types(p)]
        for types in self._made_by:
            for v in node.inputs:
                if v is not None and (p := v.producer()) is not None and p.op_type in types:
                    break
            else:
                return False
        return True

    def match_node(self, node: ir.Node, m: Match) -> bool:
        if node.op_type not in self.op_types or node.domain not in DEFAULT_DOMAINS:
            return False
        if node in m.nodes:  # the same node reached twice by unnamed patterns
            return False
        for key, wanted in self.attrs.items():
            a = node.attributes.get(key)
            actual_value = None if a is None else a.value
            if not (wanted(actual_value) if callable(wanted) else actual_value == wanted):
                return False
        if self.where is not None and not self.where(node):
            return False
        actual = list(node.inputs)
        extra = actual[len(self.inputs) :]
        if extra and not self.variadic and any(v is not None for v in extra):
            return False
        orders = [list(range(len(self.inputs)))]
        commute = node.op_type in COMMUTATIVE if self.commute is None else self.commute
        if commute and len(self.inputs) == 2 and len(actual) == 2:
            orders.append([1, 0])
        for order in orders:
            state = m._state()
            m.nodes.append(node)
            if self.name:
                m.node_names[self.name] = node
            if all(
                pat.match(actual[j] if j < len(actual) else None, m)
                for pat, j in zip(self.inputs, order, strict=True)
            ):
                return True
            m._restore(state)
        return False
