"""Activations and softmax: ONNX's ops where their attributes say what torch's
defaults say, compositions where ONNX has no op (SiLU) or not at this opset
(Gelu before 20, Mish before 18) or the arguments differ (Softplus's beta and
threshold)."""
from __future__ import annotations

import math

import torch

from ..emit import Call, rule
from .common import finish, norm_dim, operand, opmath, unary


def _work(call: Call) -> tuple[str, torch.dtype]:
    work = opmath(call.out.dtype)
    if not work.is_floating_point:
        raise call.refuse(f"an input of dtype {call.out.dtype}")
    return operand(call, call.args[0], work), work


@rule("relu")
def relu(call: Call) -> str:
    return unary(call, "Relu", call.args[0])


@rule("sigmoid")
def sigmoid(call: Call) -> str:
    return unary(call, "Sigmoid", call.args[0])


@rule("tanh")
def tanh(call: Call) -> str:
    return unary(call, "Tanh", call.args[0])


@rule("elu")
def elu(call: Call) -> str:
    x, work = _work(call)
    alpha = float(call.arg(1, "alpha", 1.0))
    if call.kwargs.get("scale", 1.0) != 1.0 or call.kwargs.get("input_scale", 1.0) != 1.0:
        raise call.refuse("elu with scale")
    return finish(call, call.e.op("Elu", [x], alpha=alpha), work)


@rule("selu")
def selu(call: Call) -> str:
    x, work = _work(call)
    return finish(call, call.e.op("Selu", [x]), work)


@rule("celu")
def celu(call: Call) -> str:
    x, work = _work(call)
    if work != torch.float32:
        raise call.refuse(f"celu on {work}")
    return finish(call, call.e.op("Celu", [x], alpha=float(call.arg(1, "alpha", 1.0))), work)


@rule("leaky_relu")
def leaky_relu(call: Call) -> str:
    x, work = _work(call)
    slope = float(call.arg(1, "negative_slope", 0.01))
    return finish(call, call.e.op("LeakyRelu", [x], alpha=slope), work)


@rule("gelu")
def gelu(call: Call) -> str:
    e = call.e
    x, work = _work(call)
    approximate = call.arg(1, "approximate", "none")
    if approximate not in ("none", "tanh"):
        raise call.refuse(f"approximate={approximate!r}")
    if call.opset >= 20:
        return finish(call, e.op("Gelu", [x], approximate=approximate), work)
    half = e.const(0.5, work)
    one = e.const(1.0, work)
    if approximate == "none":
        inner = e.op("Erf", [e.op("Mul", [x, e.const(1 / math.sqrt(2), work)])])
    else:
        cube = e.op("Mul", [e.op("Mul", [x, x]), x])
        poly = e.op("Add", [x, e.op("Mul", [e.const(0.044715, work), cube])])
        inner = e.op("Tanh", [e.op("Mul", [e.const(math.sqrt(2 / math.pi), work), poly])])
    return finish(call, e.op("Mul", [e.op("Mul", [half, x]), e.op("Add", [one, inner])]), work)


@rule("silu")
def silu(call: Call) -> str:
    x, work = _work(call)
    return finish(call, call.e.op("Mul", [x, call.e.op("Sigmoid", [x])]), work)


def _softplus(call: Call, x: str, work: torch.dtype, beta: float, threshold: float) -> str:
    """log(1 + exp(beta·x)) / beta, x itself where beta·x > threshold (eager's switch)."""
    e = call.e
    scaled = x if beta == 1 else e.op("Mul", [x, e.const(beta, work)])
    soft = e.op("Softplus", [scaled])
    if beta != 1:
        soft = e.op("Div", [soft, e.const(beta, work)])
    return e.op("Where", [e.op("Greater", [scaled, e.const(threshold, work)]), x, soft])


@rule("softplus")
def softplus(call: Call) -> str:
    x, work = _work(call)
    beta = float(call.arg(1, "beta", 1.0))
    threshold = float(call.arg(2, "threshold", 20.0))
    return finish(call, _softplus(call, x, work, beta, threshold), work)


@rule("mish")
def mish(call: Call) -> str:
    e = call.e
    x, work = _work(call)
    if call.opset >= 18:
        return finish(call, e.op("Mish", [x]), work)
    return finish(call, e.op("Mul", [x, e.op("Tanh", [_softplus(call, x, work, 1.0, 20.0)])]),
                  work)


@rule("softsign")
def softsign(call: Call) -> str:
    """x / (|x| + 1), rounded after each step as eager's composite does in float16."""
    e = call.e
    x, work = _work(call)
    if work == call.out.dtype:
        return finish(call, e.op("Softsign", [x]), work)
    below = _rounded_to_result(call, e.op("Add", [e.op("Abs", [x]), e.const(1, work)]), work)
    return finish(call, e.op("Div", [x, below]), work)


@rule("logsigmoid", "log_sigmoid")
def logsigmoid(call: Call) -> str:
    e = call.e
    x, work = _work(call)
    return finish(call, e.op("Neg", [_softplus(call, e.op("Neg", [x]), work, 1.0, 20.0)]),
                  work)


@rule("hardtanh")
def hardtanh(call: Call) -> str:
    x, work = _work(call)
    low = float(call.arg(1, "min_val", -1.0))
    high = float(call.arg(2, "max_val", 1.0))
    return finish(call, call.e.op("Clip", [x, call.e.const(low, work),
                                           call.e.const(high, work)]), work)


@rule("relu6")
def relu6(call: Call) -> str:
    x, work = _work(call)
    return finish(call, call.e.op("Clip", [x, call.e.const(0.0, work),
                                           call.e.const(6.0, work)]), work)


@rule("hardsigmoid")
def hardsigmoid(call: Call) -> str:
    x, work = _work(call)
    return finish(call, call.e.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5), work)


@rule("hardswish")
def hardswish(call: Call) -> str:
    x, work = _work(call)
    return finish(call, call.e.op("HardSwish", [x]), work)


@rule("tanhshrink")
def tanhshrink(call: Call) -> str:
    """x - tanh(x), tanh rounded first as eager's composite does in float16."""
    x, work = _work(call)
    tanh = _rounded_to_result(call, call.e.op("Tanh", [x]), work)
    return finish(call, call.e.op("Sub", [x, tanh]), work)


def _rounded_to_result(call: Call, name: str, work: torch.dtype) -> str:
    """name rounded to the result's type and back (a step eager takes in that type)."""
    return call.e.cast(call.e.cast(name, work, call.out.dtype), call.out.dtype, work)


@rule("prelu")
def prelu(call: Call) -> str:
    e = call.e
    x, work = _work(call)
    weight = call.arg(1, "weight")
    w = operand(call, weight, work)
    rank = call.args[0].rank
    if weight.rank == 1 and weight.shape[0] > 1 and rank >= 2:
        w = e.reshape(w, (weight.shape[0],) + (1,) * (rank - 2))
    # eager's x > 0 ? x : w * x (ONNX's PRelu keeps a zero where w * 0 is NaN, w NaN or inf)
    positive = e.op("Greater", [x, e.const(0, work)])
    return finish(call, e.op("Where", [positive, x, e.op("Mul", [w, x])]), work)


def _softmax(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        x = call.args[0]
        dim = call.arg(1, "dim")
        if dim is None:
            raise call.refuse("softmax without dim")
        work = opmath(call.out.dtype)
        v = operand(call, x, work)
        axis = norm_dim(int(dim), x.rank)
        if op_type == "LogSoftmax" and work == torch.float64:
            return finish(call, _log_softmax(call, v, axis, work), work)
        return finish(call, call.e.op(op_type, [v], axis=axis), work)
    return apply


def _log_softmax(call: Call, v: str, axis: int, work: torch.dtype) -> str:
    """x - max - log(sum(exp(x - max))): onnxruntime's float64 LogSoftmax gives numbers
    beside a NaN (eager's row is NaN throughout)."""
    e = call.e
    top = e.reduce("ReduceMax", v, [axis], True)
    shifted = e.op("Sub", [v, top])
    total = e.reduce("ReduceSum", e.op("Exp", [shifted]), [axis], True)
    return e.op("Sub", [shifted, e.op("Log", [total])])


rule("softmax")(_softmax("Softmax"))
rule("log_softmax")(_softmax("LogSoftmax"))


@rule("softmin")
def softmin(call: Call) -> str:
    x = call.args[0]
    work = opmath(call.out.dtype)
    v = call.e.op("Neg", [operand(call, x, work)])
    axis = norm_dim(int(call.arg(1, "dim")), x.rank)
    return finish(call, call.e.op("Softmax", [v], axis=axis), work)


@rule("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
def dropout(call: Call) -> object:
    """The input as it is in eval mode, or with p = 0 (every value kept)."""
    training = call.kwargs.get("training", call.args[2] if len(call.args) > 2 else False)
    p = call.kwargs.get("p", call.args[1] if len(call.args) > 1 else 0.5)
    if training and p != 0:
        raise call.refuse("dropout in training mode")
    return call.args[0]


rule("special_expit", "expit")(sigmoid)


@rule("glu")
def glu(call: Call) -> str:
    e = call.e
    x, work = _work(call)
    axis = norm_dim(int(call.arg(1, "dim", -1)), call.args[0].rank)
    half = call.args[0].shape[axis] // 2
    a, b = e.op("Split", [x, e.ints([half, half])], outputs=2, axis=axis)
    return finish(call, e.op("Mul", [a, e.op("Sigmoid", [b])]), work)


@rule("one_hot")
def one_hot(call: Call) -> str:
    e = call.e
    x = call.args[0]
    classes = int(call.out.shape[-1])
    index = e.unsqueeze(e.cast(x.name, x.dtype, torch.int64), [x.rank])
    hits = e.op("Equal", [index, e.tensor_const(torch.arange(classes))])
    return e.cast(hits, torch.bool, call.out.dtype)
