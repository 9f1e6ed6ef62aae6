"""Common subexpressions and duplicate constants.

Identical initializers (same dtype and shape, then the same bytes: a small weight's bytes
are its key, a large one is sampled and hashed first) become one;
then nodes with the same op, attributes and inputs become one: one hash-keyed sweep per
graph in topological order, so chains of duplicates merge in the same sweep. The main
graph goes first, then the If/Loop/Scan bodies (outermost first); a body's nodes merge
only with nodes of the same body, and a value of an enclosing scope is one input like any
other. Random ops and Dropout that may be in training mode are never merged (two draws
stay two draws); nodes with subgraphs are not compared. Linear in the size of the graph.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator

import onnx_ir as ir

from opfuse.rewrite import PassContext
from opfuse.rewrite.edit import replace_value
from opfuse.rewrite.evaluate import float_key
from opfuse.rewrite.pattern import const_array
from opfuse.rewrite.registry import PassInfo, register
from opfuse.rules._util import nondeterministic

CSE_CONSTANT_NODE_LIMIT = 64  # elements: Constant nodes up to this size are merged too
CHUNK = 1 << 24  # bytes hashed or compared at a time: large weights are never copied whole
SMALL_BYTES = 1 << 16  # weights up to this size are compared by their bytes as dict keys
SAMPLE = 16  # elements compared at the start, middle and end before hashing a whole weight
DUPLICATE_INITIALIZERS = "duplicate_initializers"  # the pattern name (the loader's merges too)


def _chunks(value: ir.Value):
    """The constant's bytes in bounded chunks (a memory-mapped weight is not copied)."""
    array = const_array(value)
    if array is None or array.dtype == object:
        return None
    flat = array.reshape(-1)
    step = max(1, CHUNK // max(1, array.itemsize))
    return (flat[i : i + step].tobytes() for i in range(0, max(1, flat.size), step))


_IN_MEMORY = (ir.Tensor, ir.serde.TensorProtoTensor)  # nothing to unmap (the common case)


def _release(value: ir.Value) -> None:
    """Unmap an external weight once read, so its pages leave the process's memory."""
    tensor = value.const_value
    if type(tensor) in _IN_MEMORY:
        return  # answered without isinstance's protocol machinery
    if isinstance(tensor, ir.ExternalTensor):
        with contextlib.suppress(BufferError):
            tensor.release()


def _digest(value: ir.Value) -> str | None:
    chunks = _chunks(value)
    if chunks is None:
        return None
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    del chunks
    _release(value)
    return h.hexdigest()


def _same_bytes(a: ir.Value, b: ir.Value) -> bool:
    ca, cb = _chunks(a), _chunks(b)
    same = ca is not None and cb is not None and all(x == y for x, y in zip(ca, cb, strict=True))
    del ca, cb
    _release(a)
    _release(b)
    return same


def _sample(value: ir.Value) -> bytes | None:
    """A few elements from the start, middle and end: different weights almost always
    differ there, so only real duplicate candidates are hashed whole."""
    array = const_array(value)
    if array is None or array.dtype == object:
        return None
    flat = array.reshape(-1)
    mid = flat.size // 2
    sample = b"".join(
        part.tobytes() for part in (flat[:SAMPLE], flat[mid : mid + SAMPLE], flat[-SAMPLE:])
    )
    del array, flat  # the views hold the mapping: drop them before unmapping
    _release(value)
    return sample


def _split_by_sample(groups: Iterable[list[ir.Value]]) -> list[list[ir.Value]]:
    """The groups of two or more values that also agree on their samples."""
    split: list[list[ir.Value]] = []
    for values in groups:
        if len(values) < 2:
            continue
        by_sample: dict[bytes | None, list[ir.Value]] = defaultdict(list)
        for value in values:
            by_sample[_sample(value)].append(value)
        split.extend(v for key, v in by_sample.items() if key is not None and len(v) > 1)
    return split


def dedupe_initializers(graph: ir.Graph) -> int:
    """Make every reader of a duplicate initializer read the first copy; return how many
    duplicates were dropped. Only same-dtype same-shape groups are hashed."""
    groups: dict[tuple[object, tuple[object, ...]], list[ir.Value]] = defaultdict(list)
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is None or value.is_graph_input() or value.is_graph_output():
            continue
        groups[(tensor.dtype, _dims(tensor))].append(value)
    small = [v for v in groups.values() if len(v) > 1 and _nbytes(v[0]) <= SMALL_BYTES]
    large = [v for v in groups.values() if len(v) > 1 and _nbytes(v[0]) > SMALL_BYTES]
    duplicates = [
        *_duplicates_by_bytes(small),
        *_duplicates(_split_by_sample(large), _digest),
    ]
    for value, same in duplicates:
        value.replace_all_uses_with(same)
        assert value.name is not None
        graph.initializers.pop(value.name)
    return len(duplicates)


def _dims(tensor: ir.TensorProtocol) -> tuple[object, ...]:
    if type(tensor) is ir.serde.TensorProtoTensor:
        return tuple(tensor.raw.dims)  # read on the protobuf: .shape builds a Shape a call
    return tuple(tensor.shape)


def _nbytes(value: ir.Value) -> int:
    tensor = value.const_value
    return tensor.nbytes if tensor is not None else 0


def _duplicates_by_bytes(groups: list[list[ir.Value]]) -> Iterator[tuple[ir.Value, ir.Value]]:
    """(duplicate, first copy) pairs among small weights of one dtype and shape: their
    bytes are the key (no hash and no second comparison)."""
    for values in groups:
        kept: dict[bytes, ir.Value] = {}
        for value in values:
            array = const_array(value)
            if array is None or array.dtype == object:
                continue
            same = kept.setdefault(array.tobytes(), value)
            del array
            _release(value)
            if same is not value:
                yield value, same


def _duplicates(
    groups: list[list[ir.Value]], digest: Callable[[ir.Value], Hashable | None]
) -> Iterator[tuple[ir.Value, ir.Value]]:
    """(duplicate, first copy) pairs: ``digest`` first, then the bytes compared a chunk at
    a time (a memory-mapped weight is never copied whole); only digests are kept."""
    for values in groups:
        kept: dict[Hashable, list[ir.Value]] = defaultdict(list)
        for value in values:
            key = digest(value)
            if key is None:
                continue
            same = next((k for k in kept[key] if _same_bytes(k, value)), None)
            if same is None:
                kept[key].append(value)
            else:
                yield value, same


def _attribute_key(a: ir.Attr) -> Hashable | None:
    """A hashable stand-in for the attribute's value; None: do not compare the node."""
    if a.is_ref():
        return ("ref", a.ref_attr_name)
    value = a.value
    t = a.type
    if t == ir.AttributeType.FLOAT:
        return float_key(value)
    if t == ir.AttributeType.FLOATS:
        return tuple(map(float_key, value))
    if t in (ir.AttributeType.INT, ir.AttributeType.STRING):
        return value
    if t in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        return tuple(value)
    if t in (ir.AttributeType.TENSOR, ir.AttributeType.TENSORS):
        tensors = [value] if t == ir.AttributeType.TENSOR else list(value)
        if sum(x.size for x in tensors) > CSE_CONSTANT_NODE_LIMIT:
            return None  # weights: dedupe_initializers compares them once they are initializers
        # ONNX's dtype, not numpy's: int4/uint4 and the float8 variants share a numpy dtype
        return tuple((tuple(x.shape), x.dtype, x.numpy().tobytes()) for x in tensors)
    if t in (ir.AttributeType.TYPE_PROTO, ir.AttributeType.TYPE_PROTOS):
        return repr(value)
    return None  # graphs, sparse tensors: not compared


def _node_key(node: ir.Node, opset: int) -> Hashable | None:
    if nondeterministic(node, opset):
        return None
    attributes = []
    for name, a in node.attributes.items():
        key = _attribute_key(a)
        if key is None:
            return None
        attributes.append((name, int(a.type), key))
    return (
        node.op_identifier(),
        len(node.outputs),
        tuple(id(v) if v is not None else None for v in node.inputs),
        tuple(sorted(attributes)),
    )


def _merge(graph: ir.Graph, node: ir.Node, kept: ir.Node) -> None:
    """Make ``node``'s readers read ``kept``'s outputs, then remove ``node``."""
    for old, new in zip(node.outputs, kept.outputs, strict=True):
        if old.is_graph_output() and (new.is_graph_output() or new.is_graph_input()):
            # one value cannot be two graph outputs: an Identity keeps the name
            identity = ir.node("Identity", [new])
            out = identity.outputs[0]
            out.type, out.shape = old.type, old.shape
            name, old.name = old.name, None
            graph.insert_before(node, identity)
            old.replace_all_uses_with(out, replace_graph_outputs=True)
            out.name = name
            continue
        replace_value(old, new)
    graph.remove(node, safe=True)


def merge_common_subexpressions(graph: ir.Graph, opset: int) -> int:
    """Merge the duplicate nodes of one graph (not its subgraphs); return how many went."""
    seen: dict[Hashable, ir.Node] = {}
    merged = 0
    for node in list(graph):
        key = _node_key(node, opset)
        if key is None:
            continue
        kept = seen.get(key)
        if kept is None:
            seen[key] = node
            continue
        _merge(graph, node, kept)
        merged += 1
    return merged


def eliminate_common_subexpressions(ctx: PassContext) -> None:
    dropped = sum(dedupe_initializers(g) for g in ctx.graphs())
    ctx.record(DUPLICATE_INITIALIZERS, dropped, dropped)  # a log line, zero or not
    merged = sum(merge_common_subexpressions(g, ctx.opset) for g in list(ctx.graphs()))
    ctx.record("common_subexpression", merged, merged)


register(
    PassInfo(
        "CommonSubexpressionFusionPass",
        "Merge nodes with the same op, attributes and inputs; deduplicate identical "
        "initializers (hash first, bytes compared after)",
        run=eliminate_common_subexpressions,
        # the keys hold no shapes; dead-code removal can make two nodes alike (it trims a
        # node's unused optional outputs and trailing empty inputs), so removals count
        reads=frozenset({"rewrites", "removals"}),
        # not complete: a merge of two graph outputs inserts an Identity a second run merges
    )
)
