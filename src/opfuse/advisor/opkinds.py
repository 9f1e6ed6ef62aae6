"""Fusion classes of operators, after the Atlas tuning guide's UB fusion rules and TVM's op
patterns. ONNX op types and the TensorFlow/Ascend names msprof prints are both listed."""

from __future__ import annotations

from enum import Enum


class Kind(str, Enum):
    CONV = "conv"  # matrix unit: Conv, ConvTranspose, MatMul, Gemm
    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"
    SEGMENT = "segment"
    OPAQUE = "opaque"


CONV_LIKE = frozenset(
    [
        "Conv",
        "ConvTranspose",
        "MatMul",
        "Gemm",
        "FusedConv",
        "FusedGemm",
        "FusedMatMul",
        "QLinearConv",
        "ConvInteger",
        "MatMulInteger",
        "QLinearMatMul",
        "QGemm",
        "NhwcConv",
        "Conv2D",
        "Conv3D",
        "DepthwiseConv2D",
        "Conv2DBackpropInput",
        "Conv2DTranspose",
        "Deconvolution",
        "MatMulV2",
        "BatchMatMul",
        "BatchMatMulV2",
        "FullyConnection",
    ]
)

ELEMENTWISE = frozenset(
    [
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "And",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "BatchNormalization",
        "BitShift",
        "Cast",
        "CastLike",
        "Ceil",
        "Celu",
        "Clip",
        "Cos",
        "Cosh",
        "DequantizeLinear",
        "Div",
        "Elu",
        "Equal",
        "Erf",
        "Exp",
        "Floor",
        "Gelu",
        "Greater",
        "GreaterOrEqual",
        "HardSigmoid",
        "HardSwish",
        "IsInf",
        "IsNaN",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "Max",
        "Mean",
        "Min",
        "Mish",
        "Mod",
        "Mul",
        "Neg",
        "Not",
        "Or",
        "PRelu",
        "Pow",
        "QuantizeLinear",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "Reciprocal",
        "Relu",
        "Round",
        "Selu",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Sub",
        "Sum",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
        "Where",
        "Xor",
        "QuickGelu",
        "BiasGelu",
        "FastGelu",
        "AddN",
        "BiasAdd",
        "Maximum",
        "Minimum",
        "RealDiv",
        "FloorDiv",
        "FloorMod",
        "Relu6",
        "Swish",
        "Square",
        "Rsqrt",
        "SquaredDifference",
        "LeakyReluV2",
        "Power",
        "Muls",
        "Adds",
        "Axpy",
        "ClipByValue",
        "Elementwise",
        "Eltwise",
    ]
)

REDUCE = frozenset(
    [
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "ArgMax",
        "ArgMin",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "GlobalLpPool",
        "QLinearGlobalAveragePool",
        "QLinearReduceMean",
        "ReduceMeanD",
        "ReduceSumD",
        "ReduceMaxD",
        "ReduceMinD",
        "ReduceProdD",
    ]
)

SEGMENT = frozenset(
    [
        "SegmentSum",
        "SegmentMax",
        "SegmentMin",
        "SegmentMean",
        "SegmentProd",
        "UnsortedSegmentSum",
        "UnsortedSegmentMax",
        "UnsortedSegmentMin",
        "UnsortedSegmentProd",
    ]
)


def classify(op_type: str) -> Kind:
    if op_type in CONV_LIKE:
        return Kind.CONV
    if op_type in ELEMENTWISE:
        return Kind.ELEMENTWISE
    if op_type in REDUCE:
        return Kind.REDUCE
    if op_type in SEGMENT:
        return Kind.SEGMENT
    return Kind.OPAQUE


# the group a node of each kind starts, and the target's limit on its elementwise followers
ANCHOR_LIMIT = {
    Kind.CONV: "conv_elementwise",
    Kind.REDUCE: "reduce_elementwise",
    Kind.SEGMENT: "segment_elementwise",
    Kind.ELEMENTWISE: "elementwise_chain",
}
GROUP_KIND_NAME = {
    Kind.CONV: "Conv+ElementWise",
    Kind.REDUCE: "Reduce+ElementWise",
    Kind.SEGMENT: "Segment+ElementWise",
    Kind.ELEMENTWISE: "ElementWise+ElementWise",
}
