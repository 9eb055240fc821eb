"""Casts (kept where eager rounds: `(x.half() * 3.3).float()` computes in
float16), comparisons (in torch's promoted type, a Python number rounded to it
first), logical and bitwise ops, where, and the float tests (isnan, ...)."""
from __future__ import annotations

import torch

from ..emit import Call, Value, rule
from .common import choose, operand, opmath


@rule("to", "type", "type_as")
def to(call: Call) -> object:
    x = call.args[0]
    if not isinstance(x, Value):
        raise call.refuse("a non-tensor input")
    dtype = call.out.dtype
    if dtype == x.dtype:
        return x
    return call.e.cast(x.name, x.dtype, dtype)


for _name in ("float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte",
              "bool"):
    rule(_name)(to)


def _compare(op_type: str, negate: bool = False):  # noqa: ANN202
    def apply(call: Call) -> str:
        e = call.e
        a, b = call.args[0], call.arg(1, "other")
        common = torch.result_type(a.example if isinstance(a, Value) else a,
                                   b.example if isinstance(b, Value) else b)
        work = opmath(common)
        if work == torch.bool and op_type not in ("Equal",):
            work = torch.int32
        result = e.op(op_type, [operand(call, a, work, common), operand(call, b, work, common)])
        return e.op("Not", [result]) if negate else result
    return apply


rule("eq", "operator.eq")(_compare("Equal"))
rule("ne", "not_equal", "operator.ne")(_compare("Equal", negate=True))
rule("lt", "less", "operator.lt")(_compare("Less"))
rule("le", "less_equal", "operator.le")(_compare("LessOrEqual"))
rule("gt", "greater", "operator.gt")(_compare("Greater"))
rule("ge", "greater_equal", "operator.ge")(_compare("GreaterOrEqual"))


def _logical(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        e = call.e
        a, b = call.args[0], call.arg(1, "other")
        out = e.op(op_type, [operand(call, a, torch.bool), operand(call, b, torch.bool)])
        return e.cast(out, torch.bool, call.out.dtype)
    return apply


rule("logical_and")(_logical("And"))
rule("logical_or")(_logical("Or"))
rule("logical_xor")(_logical("Xor"))


@rule("logical_not")
def logical_not(call: Call) -> str:
    e = call.e
    return e.cast(e.op("Not", [operand(call, call.args[0], torch.bool)]), torch.bool,
                  call.out.dtype)


def _bitwise(bool_op: str, int_op: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        e = call.e
        a, b = call.args[0], call.arg(1, "other")
        dtype = call.out.dtype
        if dtype == torch.bool:
            return e.op(bool_op, [operand(call, a, dtype), operand(call, b, dtype)])
        if dtype.is_floating_point or call.opset < 18:
            raise call.refuse(f"bitwise ops on {dtype} at opset {call.opset}")
        return e.op(int_op, [operand(call, a, dtype), operand(call, b, dtype)])
    return apply


rule("bitwise_and", "operator.and_", "__and__")(_bitwise("And", "BitwiseAnd"))
rule("bitwise_or", "operator.or_", "__or__")(_bitwise("Or", "BitwiseOr"))
rule("bitwise_xor", "operator.xor", "__xor__")(_bitwise("Xor", "BitwiseXor"))


@rule("bitwise_not", "operator.invert", "__invert__")
def bitwise_not(call: Call) -> str:
    x = call.args[0]
    if x.dtype == torch.bool:
        return call.e.op("Not", [x.name])
    if x.dtype.is_floating_point or call.opset < 18:
        raise call.refuse(f"bitwise not on {x.dtype} at opset {call.opset}")
    return call.e.op("BitwiseNot", [x.name])


@rule("where")
def where(call: Call) -> str:
    cond = call.args[0]
    if len(call.args) < 3 and "input" not in call.kwargs:
        raise call.refuse("where(condition) (data-dependent shape)")
    a, b = call.arg(1, "input"), call.arg(2, "other")
    dtype = call.out.dtype
    c = operand(call, cond, torch.bool)
    # booleans and int16 through choose: onnxruntime has no Where kernel for them
    return choose(call, c, operand(call, a, dtype), operand(call, b, dtype), dtype)


@rule("isnan")
def isnan(call: Call) -> str:
    x = call.args[0]
    if not x.dtype.is_floating_point:
        return call.e.op("Expand", [call.e.const(False, torch.bool), call.e.shape_of(x.name)])
    return call.e.op("IsNaN", [operand(call, x, opmath(x.dtype))])


@rule("isinf")
def isinf(call: Call) -> str:
    x = call.args[0]
    if not x.dtype.is_floating_point:
        return call.e.op("Expand", [call.e.const(False, torch.bool), call.e.shape_of(x.name)])
    return call.e.op("IsInf", [operand(call, x, opmath(x.dtype))])


@rule("isfinite")
def isfinite(call: Call) -> str:
    e = call.e
    x = call.args[0]
    if not x.dtype.is_floating_point:
        return e.op("Expand", [e.const(True, torch.bool), e.shape_of(x.name)])
    v = operand(call, x, opmath(x.dtype))
    return e.op("Not", [e.op("Or", [e.op("IsNaN", [v]), e.op("IsInf", [v])])])
