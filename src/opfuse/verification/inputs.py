"""Seeded inputs for the verifier, of every input type onnxruntime takes, and a line per
input saying how it was made.

- Dims: a symbolic dim gets one size wherever it appears (``batch`` in two inputs is the
  same batch; a size given with ``--input-shape`` for one input holds for the others);
  a free dim is 1 on the first axis and 32 elsewhere, but the free height and width of an
  image (a 4-D float input with 1 or 3 channels, NCHW or NHWC) get a size images have:
  224, or the size the model's metadata gives (``imgsz``, ``image_size``...).
- Other sizes (``Sizing``): when onnxruntime refuses the inputs, the verifier tries an
  image's free height and width at a text line's LINE_DIMS, then at DEFAULT_DIM (the
  PP-OCRv4 recognizer, free height declared, runs only below 96), then every size opfuse chose (not the batch, not a size
  given) grown (a reflect pad longer than the input, a reshape that does not divide:
  ``GROWTH``), then grown with a free middle dim at 1 (silero-vad's state [2, ?, 128],
  whose unnamed dim is the batch).
- Floats: standard normal. Strings: short random words. Sequences: one element.
  Optionals: present.
- Numbers that feed a position whose values must fit the model (a shape, axes, indices,
  repeats, pads, a divisor, scales, a ratio or threshold) get values valid there, derived
  from that use (USES); other integers are 0 or 1 (masks, indices into any non-empty axis).
- An input that decides a branch (compared with a constant, or an If's condition, in any
  graph, through data movement) is where generated values mislead most: a sample-rate input
  compared with 16000 selects the branch real audio takes only at 16000. Compared for
  equality with a constant, it gets that constant; otherwise (Less, Greater, a flag) the
  plan carries a warning naming the input and the node, and that ``--inputs`` fixes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import onnx

from opfuse.errors import OpfuseError
from opfuse.model.graphs import proto_graphs

T = TypeVar("T")
DEFAULT_BATCH = 1
DEFAULT_DIM = 32  # sequence length and other symbolic dims
IMAGE_DIM = 224  # the free height and width of an image input
# ... of an image input onnxruntime refuses at IMAGE_DIM, tried next: a text line's, as
# PP-OCR's recognizers take it (the PP-OCRv4 recognizer runs only below a height of 96)
LINE_DIMS = (48, 320)
IMAGE_CHANNELS = (1, 3)
# metadata keys that give an image model's input size (ultralytics writes imgsz "[640, 640]")
_IMAGE_SIZE_KEY = re.compile(r"(img|image|input)_?(size|sz|shape)", re.IGNORECASE)

ORT_DTYPES: dict[str, type] = {
    "float": np.float32,
    "double": np.float64,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint64": np.uint64,
    "uint32": np.uint32,
    "uint16": np.uint16,
    "uint8": np.uint8,
    "bool": np.bool_,
    "string": np.str_,
}

# (op type, input position) -> what values fit there
_ZEROS = "zeros"  # indices, starts, pads, an axis, k of Trilu
_ONES = "ones"  # a shape to expand to, repeats, counts, steps, a divisor
_RANGE = "0..n-1"  # a list of distinct axes
_RESHAPE = "0,...,0,-1"  # keep the leading dims, flatten the rest
_MAX = "the dtype's maximum"  # Slice ends: the whole axis
_PARTS = "parts summing to"  # Split sizes: the split axis cut in near-equal parts
_BATCH = "then ones after"  # AffineGrid size: theta's batch, then unit sizes
USES: dict[tuple[str, int], str] = {
    ("Reshape", 1): _RESHAPE,
    ("Expand", 1): _ONES,
    ("ConstantOfShape", 0): _ONES,
    ("Tile", 1): _ONES,
    ("Pad", 1): _ZEROS,
    ("Pad", 3): _RANGE,
    ("Slice", 1): _ZEROS,
    ("Slice", 2): _MAX,
    ("Slice", 3): _RANGE,
    ("Slice", 4): _ONES,
    ("Squeeze", 1): _RANGE,
    ("Unsqueeze", 1): _RANGE,
    ("Gather", 1): _ZEROS,
    ("GatherElements", 1): _ZEROS,
    ("GatherND", 1): _ZEROS,
    ("ScatterElements", 1): _ZEROS,
    ("ScatterND", 1): _ZEROS,
    ("OneHot", 0): _ZEROS,
    ("OneHot", 1): _ONES,
    ("TopK", 1): _ONES,
    ("CumSum", 1): _ZEROS,
    ("Trilu", 1): _ZEROS,
    ("Range", 0): _ZEROS,
    ("Range", 1): _ONES,
    ("Range", 2): _ONES,
    ("Div", 1): _ONES,
    ("Mod", 1): _ONES,
    ("CumProd", 1): _ZEROS,
    ("Resize", 2): _ONES,  # scales
    ("Resize", 3): _ONES,  # sizes
    ("Upsample", 1): _ONES,
    ("Dropout", 1): _ZEROS,  # ratio
    ("NonMaxSuppression", 2): _ONES,
    ("NonMaxSuppression", 3): _ZEROS,  # iou threshold
    ("NonMaxSuppression", 4): _ZEROS,  # score threshold
    ("Split", 1): _PARTS,
    ("SplitToSequence", 1): _PARTS,
    ("AffineGrid", 1): _BATCH,
}
_REDUCE = re.compile(r"Reduce[A-Za-z0-9]+")
_PASS_THROUGH = frozenset({"Cast", "Identity"})  # a use behind these is still the use
_COMPARISONS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
_LOGIC = frozenset({"Not", "And", "Or", "Xor"})  # a condition behind these is still one
# data movement: a value behind these is still the input's value
_CARRIES = _PASS_THROUGH | {"Reshape", "Squeeze", "Unsqueeze", "Flatten"}
BRANCH_HINT = "give real inputs with --inputs samples.npz"


@dataclass
class InputPlan:
    """How each input was generated, by name: what the summary and errors say."""

    how: dict[str, str]
    warnings: list[str] = field(default_factory=list)  # inputs that decide a branch
    free: bool = False  # some size was opfuse's choice (growing it may change the inputs)
    images: bool = False  # some image input's free height and width got an image's size
    middle: bool = False  # some other input has a free dim neither first nor last
    grown: str | None = None  # the sizes grown after onnxruntime refused the first ones
    refused: str | None = None  # onnxruntime's reason

    def lines(self) -> list[str]:
        return [f"{name}: {how}" for name, how in self.how.items()]


def _first_uses(
    graphs: Iterable[onnx.GraphProto],
    inputs: Iterable[onnx.ValueInfoProto],
    use_of: Callable[[onnx.NodeProto, int], T | None],
    carries: Callable[[onnx.NodeProto, int], bool],
) -> dict[str, T]:
    """For each graph input, the first ``use_of`` (node, input position) found by walking
    its readers in ``graphs``, and on through the outputs of readers that ``carries``."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for graph in graphs:
        for node in graph.node:
            for i, name in enumerate(node.input):
                consumers.setdefault(name, []).append((node, i))
    found: dict[str, T] = {}
    for value in inputs:
        todo, seen = [value.name], set()
        while todo and value.name not in found:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node, i in consumers.get(name, []):
                use = use_of(node, i)
                if use is not None:
                    found[value.name] = use
                    break
                if carries(node, i):
                    todo.extend(node.output)
    return found


def integer_uses(proto: onnx.ModelProto | None) -> dict[str, str]:
    """For graph inputs feeding a value-sensitive position (through Cast/Identity), what
    values fit: the first such use found in the main graph."""
    if proto is None:
        return {}

    def use_of(node: onnx.NodeProto, i: int) -> str | None:
        use = USES.get((node.op_type, i))
        if use is None and _REDUCE.fullmatch(node.op_type) and i == 1:
            use = _RANGE
        if use in (_PARTS, _BATCH):
            use = _sized(use, node, proto)
        return None if use is None else f"{use} ({node.op_type} input {i})"

    return _first_uses(
        [proto.graph], proto.graph.input, use_of, lambda node, _: node.op_type in _PASS_THROUGH
    )


@dataclass(frozen=True)
class BranchUse:
    """An input that decides a branch: where, and the value that takes the branch an
    equality names (None when no value can be derived)."""

    where: str
    value: np.ndarray | None = None


def _constant_arrays(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant outputs of every graph, as arrays (small ones only)."""
    found: dict[str, np.ndarray] = {}
    for graph in proto_graphs(proto.graph):
        for init in graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL and np.prod(init.dims) <= 64:
                found[init.name] = onnx.numpy_helper.to_array(init)
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value" and np.prod(attr.t.dims) <= 64:
                        found[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
    return found


def branch_uses(proto: onnx.ModelProto | None) -> dict[str, BranchUse]:
    """Graph inputs that decide a branch, found through data movement in every graph
    (subgraphs read the outer graph's values by name): compared with a constant, or
    reaching an If's condition (through Not/And/Or/Xor too)."""
    if proto is None:
        return {}
    constants = _constant_arrays(proto)
    return _first_uses(
        proto_graphs(proto.graph),
        proto.graph.input,
        lambda node, i: _branch_use(node, i, constants),
        lambda node, i: (node.op_type in _CARRIES and i == 0) or node.op_type in _LOGIC,
    )


def _branch_use(
    node: onnx.NodeProto, i: int, constants: Mapping[str, np.ndarray]
) -> BranchUse | None:
    where = f"{node.op_type} {node.name or node.output[0]!r}"
    if node.op_type == "If" and i == 0:
        return BranchUse(f"the condition of If {node.name or node.output[0]!r}")
    if node.op_type not in _COMPARISONS or len(node.input) != 2:
        return None
    other = constants.get(node.input[1 - i])
    if other is None:
        return None
    text = f"compared with {_values_text(other)} by {where}"
    if node.op_type == "Equal" and other.size >= 1 and np.all(other == other.reshape(-1)[0]):
        return BranchUse(text, other.reshape(-1)[:1])
    return BranchUse(text)


def _values_text(array: np.ndarray) -> str:
    flat = array.reshape(-1)
    return str(flat[0].item()) if flat.size == 1 else f"[{', '.join(str(v) for v in flat[:4])}...]"


def _sized(use: str, node: onnx.NodeProto, proto: onnx.ModelProto) -> str | None:
    """``use`` with the size it needs from the node's first input: the split axis's
    size (Split), the batch (AffineGrid); None when that dim is not a known number."""
    axis = 0
    for attr in node.attribute:
        if attr.name == "axis" and use == _PARTS:
            axis = attr.i
    for value in (*proto.graph.input, *proto.graph.value_info):
        if value.name != node.input[0] or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if (
            -len(dims) <= axis < len(dims)
            and dims[axis].HasField("dim_value")
            and dims[axis].dim_value >= 0  # -1 is a dynamic dim
        ):
            return f"{use} {dims[axis].dim_value}"
    return None


def _derived(use: str, dtype: type, shape: list[int]) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    values: list[int] | list[float]
    if use.startswith(_RESHAPE):
        values = [0] * (n - 1) + [-1] if n else []
    elif use.startswith(_RANGE):
        values = list(range(n))
    elif use.startswith(_MAX):
        values = [int(np.iinfo(dtype).max) if np.issubdtype(dtype, np.integer) else np.inf] * n
    elif use.startswith(_ONES):
        values = [1] * n
    elif use.startswith(_PARTS):
        total = int(use.split()[3])
        values = [total // n + (1 if i < total % n else 0) for i in range(n)] if n else []
        if not shape:  # a scalar split is a chunk size
            values = [1]
    elif use.startswith(_BATCH):
        values = [int(use.split()[3])] + [1] * (n - 1) if n else []
    else:
        values = [0] * n
    return np.array(values, dtype=dtype).reshape(shape)


def _parse_type(text: str) -> tuple[list[str], str]:
    """``optional(seq(tensor(float)))`` -> (["optional", "seq"], "float")."""
    wrappers = []
    while True:
        m = re.fullmatch(r"(optional|seq)\((.*)\)", text)
        if not m:
            break
        wrappers.append(m.group(1))
        text = m.group(2)
    m = re.fullmatch(r"tensor\((.*)\)", text)
    return wrappers, (m.group(1) if m else text)


def _fixed(d: object) -> bool:
    return isinstance(d, int) and d >= 0


def image_axes(declared: Sequence[object] | None, elem: str) -> tuple[int, int] | None:
    """The (height, width) axes of an image input (4-D float with 1 or 3 channels, NCHW or
    NHWC) whose height or width is free; None for any other input."""
    dims = list(declared or [])
    if elem not in ("float", "float16", "double") or len(dims) != 4:
        return None
    for channels, axes in ((1, (2, 3)), (3, (1, 2))):
        if dims[channels] in IMAGE_CHANNELS and not all(_fixed(dims[a]) for a in axes):
            return axes
    return None


def image_size(proto: onnx.ModelProto | None) -> tuple[tuple[int, int], str] | None:
    """The input size the model's metadata gives (``imgsz: [640, 640]``, ``image_size:
    224``...) and its key; None when it gives none."""
    for prop in proto.metadata_props if proto is not None else []:
        if not _IMAGE_SIZE_KEY.fullmatch(prop.key.strip()):
            continue
        sizes = [int(n) for n in re.findall(r"\d+", prop.value) if 4 < int(n) <= 16384]
        if sizes:
            return ((sizes[-2], sizes[-1]) if len(sizes) > 1 else (sizes[0], sizes[0])), prop.key
    return None


@dataclass(frozen=True)
class Sizing:
    """How ``generate`` sizes the dims opfuse chooses: ``grow`` multiplies them (not the
    first axis's); ``image_sizes``: an image's free height and width get an image's size
    (else DEFAULT_DIM); ``middle_ones``: a free dim neither first nor last of any other
    input is 1, never grown (the batch of a recurrent state [layers, batch, hidden] whose
    dim has no name to share with the input's batch)."""

    grow: int = 1
    image_sizes: bool = True
    middle_ones: bool = False
    text_line: bool = False  # an image's free height and width at LINE_DIMS

    def text(self) -> str:
        """What differs from the first sizes: ``free dims grown x8, middle free dims at 1``."""
        height, width = LINE_DIMS
        parts = [] if self.image_sizes else [f"image height and width at {DEFAULT_DIM}"]
        parts += [f"image height and width at a text line's {height}x{width}"] * self.text_line
        parts += [f"free dims grown x{self.grow}"] if self.grow != 1 else []
        return ", ".join(parts + (["middle free dims at 1"] if self.middle_ones else []))


FIRST_SIZING = Sizing()  # the sizes tried first


class Dims:
    """Sizes for declared dims: a symbol keeps the first size it gets; the sizes opfuse
    chooses as ``sizing`` says."""

    def __init__(self, sizing: Sizing = FIRST_SIZING) -> None:
        self.symbols: dict[str, int] = {}
        self.sizing = sizing
        self.chosen = False  # some non-batch size was chosen here, not given
        self.middle = False  # some free dim neither first nor last, outside an image

    def bind(self, declared: Sequence[object], given: Sequence[int]) -> None:
        for d, g in zip(declared, given, strict=False):
            if isinstance(d, str) and d:
                self.symbols.setdefault(d, g)

    def sizes(
        self, declared: Sequence[object] | None, defaults: Mapping[int, int] | None = None
    ) -> list[int]:
        """``declared`` with its free dims sized: ``defaults`` by axis (an image's height
        and width), else 1 on the first axis and DEFAULT_DIM elsewhere."""
        shape = []
        for i, d in enumerate(declared or []):
            if _fixed(d):
                assert isinstance(d, int)
                shape.append(d)
                continue
            default = DEFAULT_BATCH if i == 0 else (defaults or {}).get(i, DEFAULT_DIM)
            middle = not defaults and 0 < i < len(declared or []) - 1
            self.middle = self.middle or middle
            if middle and self.sizing.middle_ones:
                default = 1
            elif i > 0:
                default *= self.sizing.grow
            if isinstance(d, str) and d:
                if d not in self.symbols and i > 0:
                    self.chosen = True
                shape.append(self.symbols.setdefault(d, default))
            else:
                self.chosen = self.chosen or i > 0
                shape.append(default)
        return shape


def _random(rng: np.random.Generator, dtype: type, shape: list[int]) -> np.ndarray:
    if dtype is np.str_:
        words = rng.integers(0, 26, (*shape, 3))
        return np.array(
            ["".join(chr(97 + int(c)) for c in w) for w in words.reshape(-1, 3)], dtype=object
        ).reshape(shape)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype in (np.uint8, np.int8):
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)  # indices and masks stay in range


def _element_shape(proto: onnx.ModelProto | None, name: str) -> list[object] | None:
    """The declared dims of a sequence's or optional's innermost tensor, if any."""
    if proto is None:
        return None
    for value in proto.graph.input:
        if value.name != name:
            continue
        t = value.type
        while t.WhichOneof("value") in ("sequence_type", "optional_type"):
            t = getattr(t, t.WhichOneof("value")).elem_type
        if t.WhichOneof("value") == "tensor_type" and t.tensor_type.HasField("shape"):
            return [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in t.tensor_type.shape.dim
            ]
    return None


class InputSpec(Protocol):
    """What generate reads of an onnxruntime NodeArg."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def shape(self) -> Any: ...


def _image_defaults(
    specs: Sequence[InputSpec],
    given: Mapping[str, list[int]],
    proto: onnx.ModelProto | None,
    text_line: bool = False,
) -> tuple[dict[str, dict[int, int]], str]:
    """The height and width each image input's free dims get, by input name, and how that
    size was chosen (said in the plan); ``text_line``: a text line's (LINE_DIMS)."""
    from_metadata = image_size(proto)
    (height, width), why = (
        (LINE_DIMS, "a text line's size")
        if text_line
        else (from_metadata[0], f"the model's metadata {from_metadata[1]!r}")
        if from_metadata is not None
        else ((IMAGE_DIM, IMAGE_DIM), "a size images have")
    )
    found = {}
    for spec in specs:
        axes = image_axes(spec.shape, _parse_type(spec.type)[1])
        if axes is not None and spec.name not in given and not _parse_type(spec.type)[0]:
            found[spec.name] = {axes[0]: height, axes[1]: width}
    return found, f"image: free height and width from {why}"


def generate(
    specs: Sequence[InputSpec],
    input_shapes: Mapping[str, list[int]] | None,
    proto: onnx.ModelProto | None,
    seed: int = 0,
    sizing: Sizing = FIRST_SIZING,
) -> tuple[dict[str, object], InputPlan]:
    """Inputs for onnxruntime ``specs`` (NodeArgs); ``proto``: the model (its graph's
    uses of integer inputs, the element shapes of sequences, its metadata's image size);
    ``sizing``: how the sizes opfuse chooses are chosen. Raises OpfuseError naming an
    input whose type it cannot make."""
    rng = np.random.default_rng(seed)
    dims = Dims(sizing)
    given = input_shapes or {}
    for spec in specs:
        if spec.name in given:
            dims.bind(spec.shape or [], given[spec.name])
    images, image_note = (
        _image_defaults(specs, given, proto, sizing.text_line) if sizing.image_sizes else ({}, "")
    )
    for spec in specs:  # an image's height and width hold for the inputs sharing them
        if spec.name in images:
            dims.sizes(spec.shape, images[spec.name])
    uses = integer_uses(proto)
    branches = branch_uses(proto)
    feeds: dict[str, object] = {}
    how: dict[str, str] = {}
    warnings: list[str] = []
    for spec in specs:
        name, type_text = spec.name, spec.type
        wrappers, elem = _parse_type(type_text)
        dtype = ORT_DTYPES.get(elem)
        if dtype is None:
            raise OpfuseError(
                f"input {name!r} has type {type_text}, which verify cannot generate; "
                "give the inputs with --inputs samples.npz"
            )
        declared = _element_shape(proto, name) if wrappers else spec.shape
        shape = list(given[name]) if name in given else dims.sizes(declared, images.get(name))
        numeric = dtype not in (np.str_, np.bool_)
        use = uses.get(name) if numeric and not wrappers else None
        branch = branches.get(name) if not wrappers else None
        if branch is not None and branch.value is not None and dtype is not np.str_:
            value: object = np.full(shape, branch.value[0], dtype=dtype)
            text = f"{_values_text(branch.value)} ({branch.where}: the branch it names)"
        elif use is not None:
            value = _derived(use, dtype, shape)
            text = f"{use}"
        else:
            value = _random(rng, dtype, shape)
            text = "0 or 1" if np.issubdtype(dtype, np.integer) else "random"
        if branch is not None and branch.value is None:
            warnings.append(
                f"input {name!r} decides a branch ({branch.where}); its generated value may "
                f"take a branch real inputs never take: {BRANCH_HINT}"
            )
        shape_text = "x".join(map(str, shape)) or "scalar"
        if "seq" in wrappers:
            value = [value]
            text = f"a one-element sequence of {shape_text} {elem}, {text}"
        else:
            text = f"{shape_text} {elem}, {text}"
        if "optional" in wrappers:
            text = f"present, {text}"
        if name in images:
            text += f" ({image_note})"
        feeds[name] = value
        how[name] = text
    return feeds, InputPlan(how, warnings, dims.chosen, bool(images), dims.middle)
