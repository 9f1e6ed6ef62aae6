"""What kind of model this is, read from its graph and said once (issue 42, item 4): the
measures follow from it (a decoder's logits by next-token agreement and perplexity, not
as an embedding of a model with an attention mask; an encoder's hidden state by its
pooled cosine) and so does the recipe search (weight-only int4 tried on decoders only).

The kinds, first match wins:

- **decoder with past key values**: an ``input_ids`` input and past key/value inputs
  (``past_key_values.*``, ``past*``) or ``present*`` outputs, as optimum, torch.onnx and
  onnxruntime-genai name them;
- **decoder without past**: ``input_ids``, logits over the vocabulary (a rank-3 output
  named ``logits``, or whose last dim is the row count of the table the ids are gathered
  from) and a causal mask (a Trilu, or a constant lower-triangular square);
- **encoder with an attention mask**: an attention mask input (rank 2, "mask" in its
  name) and attention (a MatMul of two activations);
- **vision transformer**: attention and a patch embedding (a Conv whose stride is its
  kernel, 4 or more);
- **CNN**: convolutions and no attention;
- **other**: anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

DECODER_PAST = "decoder with past key values"
DECODER = "decoder without past"
ENCODER = "encoder with an attention mask"
VIT = "vision transformer"
CNN = "CNN"
OTHER = "other"

TOKEN_IDS = "input_ids"
PAST_PREFIXES = ("past_key_values", "past")  # inputs' name prefixes
PRESENT_PREFIXES = ("present",)  # outputs' name prefixes
LOGITS = "logits"
PATCH_MIN = 4  # a patch embedding's kernel (and stride): ViT's 16, Swin's 4


@dataclass(frozen=True)
class ModelKind:
    """``kind``: one of the kinds above; ``signs``: what in the graph says so; ``logits``:
    a decoder's outputs of next-token scores (judged by next-token agreement and
    perplexity); ``mask``: the attention mask input, if any."""

    kind: str
    signs: str = ""
    logits: tuple[str, ...] = ()
    mask: str | None = None

    @property
    def decoder(self) -> bool:
        return self.kind in (DECODER_PAST, DECODER)

    def describe(self) -> str:
        return f"{self.kind} ({self.signs})" if self.signs else self.kind

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "signs": self.signs, "logits": list(self.logits)}


def model_kind(model: onnx.ModelProto) -> ModelKind:
    """The kind of ``model`` (see the module's docstring)."""
    graph = model.graph
    inputs = [i.name for i in graph.input]
    mask = mask_input(model)
    if TOKEN_IDS in inputs:
        past = [n for n in inputs if n.startswith(PAST_PREFIXES)]
        present = [o.name for o in graph.output if o.name.startswith(PRESENT_PREFIXES)]
        logits = tuple(_logits(model, exclude=present))
        if past or present:
            said = [TOKEN_IDS]
            for what, names in (("past inputs", past), ("present outputs", present)):
                if names:
                    more = f" and {len(names) - 2} more" if len(names) > 2 else ""
                    said.append(f"{len(names)} {what} ({', '.join(names[:2])}{more})")
            return ModelKind(DECODER_PAST, ", ".join(said), logits, mask)
        causal = _causal(model)
        if logits and causal:
            return ModelKind(DECODER, f"{TOKEN_IDS}, {logits[0]}, {causal}", logits, mask)
    attends = attention(model)
    if mask is not None and attends:
        return ModelKind(ENCODER, f"{mask}, attention MatMuls", mask=mask)
    convs = [n for n in graph.node if n.op_type == "Conv"]
    if attends and any(_patch(model, n) for n in convs):
        return ModelKind(VIT, "a patch embedding Conv, attention MatMuls")
    if convs and not attends:
        return ModelKind(CNN, f"{len(convs)} Conv, no attention")
    return ModelKind(OTHER)


def mask_input(model: onnx.ModelProto) -> str | None:
    """The model's attention mask input (rank 2, its name holds "mask"), if any."""
    for inp in model.graph.input:
        tensor = inp.type.tensor_type
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else 0
        if "mask" in inp.name.lower() and rank == 2:
            return inp.name
    return None


def attention(model: onnx.ModelProto) -> bool:
    """Has the model a MatMul of two activations (attention's Q.K^T or P.V)."""
    constant = {t.name for t in model.graph.initializer}
    constant |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return any(
        n.op_type == "MatMul" and len(n.input) == 2 and not set(n.input) & constant
        for n in model.graph.node
    )


def _logits(model: onnx.ModelProto, exclude: list[str]) -> list[str]:
    """The rank-3 float outputs named ``logits`` or as wide as the vocabulary (the rows of
    the table ``input_ids`` is gathered from)."""
    tables = {t.name: t.dims[0] for t in model.graph.initializer if len(t.dims) == 2}
    vocab = {
        tables[n.input[0]]
        for n in model.graph.node
        if n.op_type == "Gather" and n.input[0] in tables and n.input[1:2] == [TOKEN_IDS]
    }
    found = []
    for out in model.graph.output:
        tensor = out.type.tensor_type
        dims = tensor.shape.dim if tensor.HasField("shape") else []
        if out.name in exclude or len(dims) != 3 or tensor.elem_type != onnx.TensorProto.FLOAT:
            continue
        wide = dims[2].HasField("dim_value") and dims[2].dim_value in vocab
        if out.name.lower().endswith(LOGITS) or wide:
            found.append(out.name)
    return found


def _causal(model: onnx.ModelProto) -> str:
    """What makes the attention causal ('' when nothing does): a Trilu, or a constant
    square (its last two dims) whose entries above the diagonal all differ from those on
    and below it (a 0/1 or 0/-inf mask, as GPT-2's exported ``bias`` buffer)."""
    if any(n.op_type == "Trilu" for n in model.graph.node):
        return "a Trilu (a causal mask)"
    for t in model.graph.initializer:
        if len(t.dims) >= 2 and t.dims[-1] == t.dims[-2] >= 2 and t.dims[-1] <= 8192:
            square = numpy_helper.to_array(t).reshape(-1, t.dims[-1], t.dims[-1])[0]
            upper = square[np.triu_indices(len(square), 1)]
            lower = square[np.tril_indices(len(square))]
            if len(np.unique(upper)) == 1 and upper[0] not in set(np.unique(lower).tolist()):
                return f"a causal mask ({t.name})"
    return ""


def _patch(model: onnx.ModelProto, conv: onnx.NodeProto) -> bool:
    """A patch embedding: a Conv whose strides equal its kernel, PATCH_MIN or more."""
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    kernel, strides = attrs.get("kernel_shape"), attrs.get("strides")
    if kernel is None and len(conv.input) > 1:
        weights = {t.name: list(t.dims[2:]) for t in model.graph.initializer}
        kernel = weights.get(conv.input[1])
    return bool(kernel) and kernel == strides and min(kernel or [0]) >= PATCH_MIN
