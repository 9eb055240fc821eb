"""TensorRT's documented ONNX operator set, and the ops of an ONNX model outside it.

The table is the operator support matrix of onnx-tensorrt (the parser TensorRT uses for
ONNX models, ``docs/operators.md``) for TensorRT 10.0: the operators it marks as supported,
for opsets 9 to 20.  An op missing from the table (marked unsupported there, newer than the
table, or in a domain other than the default ONNX one, such as ``com.microsoft``) is one a
TensorRT deployment may refuse; ``leapp check --deploy`` lists them per model file.  The
matrix's per-op restrictions (types, attributes) are not checked.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

#: The TensorRT release and opset range the table describes.
TENSORRT_VERSION = "10.0"
TENSORRT_OPSETS = (9, 20)

#: ONNX operators (default domain) TensorRT's ONNX parser documents as supported.
TENSORRT_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh
CumSum DeformConv DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand
EyeLike Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool
GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization HardSigmoid
HardSwish Hardmax Identity If ImageScaler InstanceNormalization IsInf IsNaN LRN LSTM
LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization LpPool
MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression
NonZero Not OneHot Or PRelu Pad ParametricSoftplus Pow QuantizeLinear RNN RandomNormal
RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2
ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign Round ScaledTanh Scan Scatter
ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus
Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose
Trilu Unsqueeze Upsample Where Xor
""".split())

_DEFAULT_DOMAINS = ("", "ai.onnx")


def op_counts(proto: Any) -> Counter:
    """How often each op runs in an ONNX ``ModelProto``: ``"Op"`` for the default domain,
    ``"domain::Op"`` otherwise.  Subgraphs (``If``, ``Loop``, ``Scan`` bodies) are walked,
    and a call of one of the model's local functions counts the function's ops instead."""
    functions = {(f.domain, f.name): f for f in proto.functions}
    counts: Counter = Counter()
    expanding: list[tuple[str, str]] = []  # the functions being expanded (no recursion)

    def walk(nodes: Any) -> None:
        for node in nodes:
            key = (node.domain, node.op_type)
            if key in functions and key not in expanding:
                expanding.append(key)
                walk(functions[key].node)
                expanding.pop()
            else:
                name = node.op_type if node.domain in _DEFAULT_DOMAINS \
                    else f"{node.domain}::{node.op_type}"
                counts[name] += 1
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    walk(attribute.g.node)
                for graph in attribute.graphs:
                    walk(graph.node)

    walk(proto.graph.node)
    return counts


def outside(counts: Counter) -> dict[str, int]:
    """The ops of ``counts`` outside TensorRT's documented set, by name."""
    return {op: n for op, n in sorted(counts.items()) if op not in TENSORRT_OPS}


def default_opset(proto: Any) -> int | None:
    """The model's opset of the default ONNX domain (None: not imported)."""
    for entry in proto.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return int(entry.version)
    return None


def read(path: str) -> Any:
    """The model at ``path`` without its external weights (only the graph is read)."""
    import onnx

    return onnx.load(path, load_external_data=False)
