"""The engine's evaluator: one node (or one default-domain op) on constant inputs, with
onnx's reference evaluator, falling back to onnxruntime: constant folding never carries its
own kernels, and a rule never opens a runtime (it calls ``evaluate``, ``evaluate_op`` and
``output_bytes`` here; the import-linter contracts forbid onnxruntime in ``opfuse.rules``).

Building an evaluator costs about a millisecond, running it a few microseconds; nodes
that differ only in their input values (the same Unsqueeze on a hundred shape scalars)
share one evaluator, cached by op type, attributes, input dtypes and opsets.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

ORT_MAX_IR_VERSION = 10
CACHE_LIMIT = 512
SHAPE_DATA_LIMIT = 1024  # elements: integer inputs up to this size reach shape inference

Runner = Callable[[dict[str, np.ndarray]], list[object]]
_cache: dict[tuple, tuple[Runner | None, Runner | None]] = {}


class EvaluationError(Exception):
    pass


def float_key(value: float) -> bytes:
    """A float attribute as a dict key: -0.0 and 0.0 differ; NaN equals the same NaN."""
    return struct.pack("<d", value)


def _elem_type(value: ir.Value) -> int:
    return int(value.dtype) if value.dtype is not None else onnx.TensorProto.UNDEFINED


def _one_node_model(
    node: ir.Node,
    arrays: Sequence[np.ndarray | None],
    model: ir.Model,
    outer: Mapping[str, np.ndarray],
) -> tuple[onnx.ModelProto, list[str]]:
    proto = ir.serde.serialize_node(node)
    proto.name = ""
    feed_names, graph_inputs = [], []
    for i, array in enumerate(arrays):
        if array is None or not proto.input[i]:
            proto.input[i] = ""
            continue
        proto.input[i] = name = f"i{i}"
        feed_names.append(name)
        graph_inputs.append(
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), None
            )
        )
    for name, array in outer.items():  # values the node's subgraphs read by name
        feed_names.append(name)
        graph_inputs.append(
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), None
            )
        )
    outputs = []
    for j, out in enumerate(node.outputs):
        proto.output[j] = f"o{j}"
        outputs.append(onnx.helper.make_tensor_value_info(f"o{j}", _elem_type(out), None))
    graph = onnx.helper.make_graph([proto], "fold", graph_inputs, outputs)
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    one = onnx.helper.make_model(graph, opset_imports=opsets)
    one.ir_version = min(model.ir_version or ORT_MAX_IR_VERSION, ORT_MAX_IR_VERSION)
    return one, feed_names


def _reference(proto: onnx.ModelProto) -> Runner:
    evaluator = ReferenceEvaluator(proto)
    return lambda feeds: list(evaluator.run(None, feeds))


def _onnxruntime(proto: onnx.ModelProto) -> Runner:
    from opfuse.model.sessions import open_session

    # a one-node model built here: a refusal is onnxruntime's exception, which the caller
    # records (the node stays as it is)
    session = open_session(proto, graph_opt="off", threads=0, errors="onnxruntime")
    return lambda feeds: list(session.run(None, feeds))


def _expected_ok(value: ir.Value, array: np.ndarray) -> bool:
    if value.dtype is not None:
        try:
            if array.dtype != value.dtype.numpy():
                return False
        except (TypeError, ValueError):  # a dtype numpy has no name for
            return False
    if value.shape is not None and all(isinstance(d, int) for d in value.shape):
        return tuple(array.shape) == tuple(value.shape)
    return True


def _results(outputs: Sequence[ir.Value], raw: list[object]) -> list[np.ndarray] | None:
    results = []
    for value, r in zip(outputs, raw, strict=False):
        if not isinstance(r, (np.ndarray, np.generic)):
            return None  # a sequence or an optional: not a tensor constant
        array = np.asarray(r)
        if array.dtype == object or not _expected_ok(value, array):
            return None
        results.append(array)
    return results if len(results) == len(outputs) else None


def _cache_key(node: ir.Node, arrays: Sequence[np.ndarray | None], model: ir.Model) -> tuple | None:
    """What decides the evaluator: op, attributes, input dtypes, output types, opsets."""
    attrs = []
    for name, a in sorted(node.attributes.items()):
        value = a.value
        if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) or a.is_ref():
            return None
        if a.type == ir.AttributeType.TENSOR:
            array = value.numpy()
            value = (str(array.dtype), array.shape, array.tobytes())
        elif a.type == ir.AttributeType.FLOAT:
            value = float_key(value)
        elif a.type == ir.AttributeType.FLOATS:
            value = tuple(map(float_key, value))
        elif isinstance(value, (list, tuple)):
            value = tuple(value)
        attrs.append((name, int(a.type), value))
    key = (
        node.op_type,
        node.domain,
        tuple(attrs),
        tuple(None if a is None else a.dtype for a in arrays),  # int4 and uint4 share .str
        tuple(_elem_type(out) for out in node.outputs),
        tuple(sorted(model.opset_imports.items())),
        model.ir_version,
    )
    try:
        hash(key)
    except TypeError:  # an attribute onnx-ir keeps as an object (a TYPE_PROTO): not cached
        return None
    return key


def _run(
    key: tuple | None,
    build: Callable[[], onnx.ModelProto],
    feeds: dict[str, np.ndarray],
    check: Callable[[list[object]], list[np.ndarray] | None],
) -> list[np.ndarray]:
    """Run the one-node model (built by ``build`` on a cache miss) with the reference
    evaluator, else onnxruntime; ``check`` turns raw outputs into results or None."""
    runners = _cache.get(key) if key is not None else None
    if runners is None:
        runners = (None, None)
        if key is not None:
            if len(_cache) >= CACHE_LIMIT:
                _cache.clear()
            _cache[key] = runners
    proto: onnx.ModelProto | None = None
    errors = []
    for slot, make in enumerate((_reference, _onnxruntime)):
        runner = runners[slot]
        try:
            if runner is None:
                if proto is None:
                    proto = build()
                runner = make(proto)
                runners = (runner, runners[1]) if slot == 0 else (runners[0], runner)
                if key is not None:
                    _cache[key] = runners
            results = check(runner(feeds))
        except Exception as exc:  # any evaluator failure: try the next one
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            errors.append(f"{make.__name__.lstrip('_')}: {first[:120]}")
            continue
        if results is not None:
            return results
        errors.append(f"{make.__name__.lstrip('_')}: result type or shape differs")
    raise EvaluationError("; ".join(errors))


def evaluate(
    node: ir.Node,
    arrays: Sequence[np.ndarray | None],
    model: ir.Model,
    outer: Mapping[str, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """The node's outputs on ``arrays`` (None for absent optional inputs); ``outer``:
    the enclosing graphs' values its subgraphs read, by name."""
    outer = outer or {}
    try:
        key = None if outer else _cache_key(node, arrays, model)
        feed_names = [f"i{i}" for i, a in enumerate(arrays) if a is not None] + list(outer)
        values = [a for a in arrays if a is not None] + list(outer.values())
        feeds = dict(zip(feed_names, values, strict=True))

        def check(raw: list[object]) -> list[np.ndarray] | None:
            return _results(node.outputs, raw)

        return _remembered(
            key,
            feeds,
            lambda: _run(key, lambda: _one_node_model(node, arrays, model, outer)[0], feeds, check),
            # a remembered result meets this node's declared types and shapes too
            recheck=check,
        )
    except EvaluationError:
        raise
    except Exception as exc:  # any failure outside the runners too: the node stays as it is
        raise EvaluationError(f"{type(exc).__name__}: {exc}"[:200]) from None


COMBINE_MIN_OPSET = 14  # numpy-style broadcasting, input-form Slice, bfloat16 arithmetic
MEMO_BYTES = 256  # results on inputs this small are remembered (shape vectors, scalars)
_memo: dict[tuple, list[np.ndarray]] = {}


def evaluate_op(
    op_type: str,
    arrays: Sequence[np.ndarray | None],
    opset: int = COMBINE_MIN_OPSET,
    **attributes: int | float | str | Sequence[int],
) -> np.ndarray:
    """``op_type`` (default domain, one output of the first input's dtype) on constant
    ``arrays`` (None for an absent optional input): how rules combine constants and
    slice shape vectors, with ONNX's own dtype and broadcast semantics, at the model's
    ``opset`` (at least 14). Raises EvaluationError."""
    opset = max(opset, COMBINE_MIN_OPSET)
    dtype = next(a for a in arrays if a is not None).dtype
    key = (
        "op",
        op_type,
        tuple(
            sorted(
                (k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in attributes.items()
            )
        ),
        tuple(None if a is None else a.dtype for a in arrays),  # int4 and uint4 share .str
        opset,
    )
    names = [f"i{i}" if a is not None else "" for i, a in enumerate(arrays)]

    def build() -> onnx.ModelProto:
        elem = onnx.helper.np_dtype_to_tensor_dtype(dtype)
        inputs = [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), None
            )
            for n, a in zip(names, arrays, strict=True)
            if a is not None
        ]
        node = onnx.helper.make_node(op_type, names, ["o0"], **cast(dict, attributes))
        output = onnx.helper.make_tensor_value_info("o0", elem, None)
        graph = onnx.helper.make_graph([node], "combine", inputs, [output])
        one = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        one.ir_version = ORT_MAX_IR_VERSION
        return one

    def check(raw: list[object]) -> list[np.ndarray] | None:
        if len(raw) != 1 or not isinstance(raw[0], (np.ndarray, np.generic)):
            return None
        array = np.asarray(raw[0])
        return [array] if array.dtype == dtype else None

    feeds = {n: a for n, a in zip(names, arrays, strict=True) if a is not None}
    return _remembered(key, feeds, lambda: _run(key, build, feeds, check))[0]


def _remembered(
    key: tuple | None,
    feeds: Mapping[str, np.ndarray],
    compute: Callable[[], list[np.ndarray]],
    recheck: Callable[[list[object]], list[np.ndarray] | None] | None = None,
) -> list[np.ndarray]:
    """``compute()``, remembered by ``key`` and the feeds' bytes when they are small
    (shape vectors and scalars: a stack of identical blocks folds the same ones again);
    a remembered result must pass ``recheck`` (EvaluationError otherwise)."""
    memo = None
    small = sum(a.nbytes for a in feeds.values()) <= MEMO_BYTES
    if key is not None and small and all(a.dtype != object for a in feeds.values()):
        memo = (key, *((name, a.shape, a.tobytes()) for name, a in feeds.items()))
        if memo in _memo:
            results = [r.copy() for r in _memo[memo]]
            if recheck is not None and recheck(list(results)) is None:
                raise EvaluationError("result type or shape differs from the declared one")
            return results
    results = compute()
    if memo is not None:
        if len(_memo) >= CACHE_LIMIT:
            _memo.clear()
        _memo[memo] = [r.copy() for r in results]
    return results


def output_bytes(node: ir.Node, arrays: Sequence[np.ndarray | None], model: ir.Model) -> int | None:
    """The node's output bytes on ``arrays`` by onnx's shape inference, before any
    evaluation (small integer inputs are given as values, so Expand, Tile, Range and
    ConstantOfShape are sized by them); None when a dim stays unknown."""
    try:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = model.opset_imports.get(domain, model.opset_imports.get("ai.onnx", 1))
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
        proto = ir.serde.serialize_node(node)
        types, data = {}, {}
        for i, array in enumerate(arrays):
            if array is None or not proto.input[i]:
                proto.input[i] = ""
                continue
            proto.input[i] = name = f"i{i}"
            elem = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
            types[name] = onnx.helper.make_tensor_type_proto(elem, array.shape)
            if array.dtype.kind in "iu" and array.size <= SHAPE_DATA_LIMIT:
                data[name] = onnx.numpy_helper.from_array(array, name)
        for j, out in enumerate(proto.output):
            if out:
                proto.output[j] = f"o{j}"
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, proto, types, input_data=data, opset_imports=opsets
        )
    except Exception:  # no schema, an inference error, a dtype onnx cannot name
        return None
    total = 0.0
    for out in proto.output:
        if not out:
            continue
        t = inferred.get(out)
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        dims = t.tensor_type.shape.dim
        if not all(d.HasField("dim_value") for d in dims):
            return None
        try:
            itemsize = ir.DataType(t.tensor_type.elem_type).itemsize
        except ValueError:
            return None
        total += int(np.prod([d.dim_value for d in dims], dtype=np.int64)) * itemsize
    return int(np.ceil(total))
