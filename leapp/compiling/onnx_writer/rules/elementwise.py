"""Arithmetic and elementwise maths: torch's type promotion (the result type is
eager's; reduced floats compute in float32 and round once per op, as eager's CPU
kernels do), broadcasting (ONNX's is numpy's, as torch's), Python numbers kept
in the computation type."""
from __future__ import annotations

import math

import torch

from ..emit import Call, Value, rule
from .common import finish, operand, opmath, unary


def _binary(call: Call, op_type: str, a: object, b: object, **attrs: object) -> str:
    work = opmath(call.out.dtype)
    return finish(call, call.e.op(op_type, [operand(call, a, work), operand(call, b, work)],
                                  **attrs), work)


def _rounded(call: Call, x: object, work: torch.dtype) -> str:
    """An operand of add / sub / remainder / fmod / pow (and add's alpha): eager rounds a
    Python number to the result type first (float16 + 0.1 adds float16(0.1)); mul and
    div keep it in the computation type."""
    return operand(call, x, work, call.out.dtype)


def _scaled(call: Call, b: object, alpha: object, work: torch.dtype) -> str:
    name = _rounded(call, b, work)
    if alpha is None or alpha == 1:
        return name
    return call.e.op("Mul", [name, _rounded(call, alpha, work)])


@rule("add", "operator.add")
def add(call: Call) -> str:
    a, b = call.args[0], call.arg(1, "other")
    work = opmath(call.out.dtype)
    if work == torch.bool:
        return call.e.op("Or", [operand(call, a, work), operand(call, b, work)])
    total = call.e.op("Add", [_rounded(call, a, work), _scaled(call, b, call.kwargs.get("alpha"),
                                                               work)])
    return finish(call, total, work)


@rule("sub", "subtract", "operator.sub")
def sub(call: Call) -> str:
    a, b = call.args[0], call.arg(1, "other")
    work = opmath(call.out.dtype)
    diff = call.e.op("Sub", [_rounded(call, a, work), _scaled(call, b, call.kwargs.get("alpha"),
                                                              work)])
    return finish(call, diff, work)


@rule("rsub")
def rsub(call: Call) -> str:
    a, b = call.args[0], call.arg(1, "other")
    work = opmath(call.out.dtype)
    diff = call.e.op("Sub", [_rounded(call, b, work), _scaled(call, a, call.kwargs.get("alpha"),
                                                              work)])
    return finish(call, diff, work)


@rule("mul", "multiply", "operator.mul")
def mul(call: Call) -> str:
    work = opmath(call.out.dtype)
    if work == torch.bool:
        return call.e.op("And", [operand(call, call.args[0], work),
                                 operand(call, call.arg(1, "other"), work)])
    return _binary(call, "Mul", call.args[0], call.arg(1, "other"))


def _floor_divide(call: Call, a: object, b: object) -> str:
    """Floor division as eager: integers fix ONNX's truncation; floats follow eager's
    div_floor (fmod, corrected quotient, floor, round-up of a quotient off by half)."""
    e = call.e
    work = opmath(call.out.dtype)
    x, y = operand(call, a, work), operand(call, b, work)
    zero = e.const(0, work)
    if not work.is_floating_point:
        q = e.op("Div", [x, y])
        r = e.op("Mod", [x, y], fmod=1)
        fix = e.op("And", [e.op("Not", [e.op("Equal", [r, zero])]),
                           e.op("Xor", [e.op("Less", [r, zero]), e.op("Less", [y, zero])])])
        q = e.op("Sub", [q, e.cast(fix, torch.bool, work)])
        return finish(call, q, work)
    one = e.const(1, work)
    mod = e.op("Mod", [x, y], fmod=1)
    div = e.op("Div", [e.op("Sub", [x, mod]), y])
    fix = e.op("And", [e.op("Not", [e.op("Equal", [mod, zero])]),
                       e.op("Xor", [e.op("Less", [y, zero]), e.op("Less", [mod, zero])])])
    div = e.op("Where", [fix, e.op("Sub", [div, one]), div])
    floor = e.op("Floor", [div])
    up = e.op("Greater", [e.op("Sub", [div, floor]), e.const(0.5, work)])
    floor = e.op("Where", [up, e.op("Add", [floor, one]), floor])
    result = e.op("Where", [e.op("Equal", [div, zero]), e.op("Mul", [e.op("Div", [x, y]),
                                                                      zero]), floor])
    result = e.op("Where", [e.op("Equal", [y, zero]), e.op("Div", [x, y]), result])
    return finish(call, result, work)


@rule("div", "divide", "true_divide", "operator.truediv")
def div(call: Call) -> str:
    a, b = call.args[0], call.arg(1, "other")
    mode = call.kwargs.get("rounding_mode", call.args[2] if len(call.args) > 2 else None)
    work = opmath(call.out.dtype)
    if mode is None:
        return _binary(call, "Div", a, b)
    if mode == "floor":
        return _floor_divide(call, a, b)
    if mode == "trunc":
        q = call.e.op("Div", [operand(call, a, work), operand(call, b, work)])
        if work.is_floating_point:
            q = _trunc(call, q, work)
        return finish(call, q, work)
    raise call.refuse(f"rounding_mode={mode!r}")


@rule("floor_divide", "operator.floordiv")
def floor_divide(call: Call) -> str:
    return _floor_divide(call, call.args[0], call.arg(1, "other"))


def _trunc(call: Call, x: str, work: torch.dtype) -> str:
    e = call.e
    return e.op("Where", [e.op("Less", [x, e.const(0, work)]), e.op("Ceil", [x]),
                          e.op("Floor", [x])])


@rule("remainder", "operator.mod")
def remainder(call: Call) -> str:
    e = call.e
    a, b = call.args[0], call.arg(1, "other")
    work = opmath(call.out.dtype)
    x, y = _rounded(call, a, work), _rounded(call, b, work)
    if not work.is_floating_point:
        return finish(call, e.op("Mod", [x, y], fmod=0), work)
    zero = e.const(0, work)
    mod = e.op("Mod", [x, y], fmod=1)
    fix = e.op("And", [e.op("Not", [e.op("Equal", [mod, zero])]),
                       e.op("Xor", [e.op("Less", [y, zero]), e.op("Less", [mod, zero])])])
    return finish(call, e.op("Where", [fix, e.op("Add", [mod, y]), mod]), work)


@rule("fmod")
def fmod(call: Call) -> str:
    work = opmath(call.out.dtype)
    x, y = _rounded(call, call.args[0], work), _rounded(call, call.arg(1, "other"), work)
    return finish(call, call.e.op("Mod", [x, y], fmod=1), work)


def _power(call: Call, base: object, exponent: object) -> str:
    e = call.e
    work = opmath(call.out.dtype)
    if isinstance(base, Value) and isinstance(exponent, (int, float)) \
            and not isinstance(exponent, bool):
        x = operand(call, base, work)
        if exponent == 1:
            return finish(call, e.op("Identity", [x]), work)
        if exponent == 2:
            return finish(call, e.op("Mul", [x, x]), work)
        if exponent == 3:
            return finish(call, e.op("Mul", [e.op("Mul", [x, x]), x]), work)
        # float16: eager takes pow, not these shortcuts (pow(-inf, 0.5) = inf, pow(-0, -0.5)
        # = inf where sqrt gives NaN and -inf)
        if work.is_floating_point and call.out.dtype != torch.float16:
            if exponent == 0.5:
                return finish(call, e.op("Sqrt", [x]), work)
            if exponent == -0.5:
                return finish(call, e.op("Reciprocal", [e.op("Sqrt", [x])]), work)
            if exponent == -1:
                return finish(call, e.op("Reciprocal", [x]), work)
            if exponent == -2:
                return finish(call, e.op("Reciprocal", [e.op("Mul", [x, x])]), work)
        if exponent == 0:  # ones, NaN and inf included, as eager's
            return finish(call, e.op("Expand", [e.const(1, work), e.op("Shape", [x])]), work)
    work = opmath(call.out.dtype)
    if not work.is_floating_point:
        return finish(call, _integer_power(call, base, exponent, work), work)
    return finish(call, e.op("Pow", [_rounded(call, base, work), _rounded(call, exponent, work)]),
                  work)


def _integer_power(call: Call, base: object, exponent: object, work: torch.dtype) -> str:
    """An integer power as eager computes it: repeated squaring in the integer type, so
    an overflow wraps as eager's does (ONNX's Pow goes through a double: off by 1e9);
    a constant exponent unrolls, a tensor one loops over its bits.  A negative
    constant exponent is refused (eager raises); a negative tensor one gives eager's
    1 / ±1 / 0 by the base."""
    e = call.e
    if isinstance(exponent, bool):
        exponent = int(exponent)
    if isinstance(exponent, int):
        if exponent < 0:
            raise call.refuse("an integer power with a negative exponent")
        x = _rounded(call, base, work)
        result = None
        square = x
        while exponent:
            if exponent & 1:
                result = square if result is None else e.op("Mul", [result, square])
            exponent >>= 1
            if exponent:
                square = e.op("Mul", [square, square])
        if result is None:
            return e.op("Expand", [e.const(1, work), e.op("Shape", [x])])
        return result if result != x else e.op("Identity", [x])
    x = _rounded(call, base, work)
    n = _rounded(call, exponent, work)
    one, zero = e.const(1, work), e.const(0, work)
    shape = e.op("Shape", [e.op("Add", [e.op("Mul", [x, zero]), e.op("Mul", [n, zero])])])
    result = e.op("Expand", [one, shape])
    square = e.op("Expand", [x, shape])
    bits = 8 * torch.tensor([], dtype=work).element_size()
    for bit in range(bits - 1):  # a non-negative exponent has bits - 1 value bits
        mask = e.op("BitwiseAnd", [n, e.const(1 << bit, work)])
        taken = e.op("Equal", [mask, zero])
        result = e.op("Where", [taken, result, e.op("Mul", [result, square])])
        if bit < bits - 2:
            square = e.op("Mul", [square, square])
    # a negative exponent: 1 for a base of 1, ±1 by parity for -1, else 0 (eager's kernel)
    minus_one = e.const(-1, work)
    odd = e.op("Not", [e.op("Equal", [e.op("BitwiseAnd", [n, one]), zero])])
    of_minus_one = e.op("Where", [odd, minus_one, one])
    negative = e.op("Where", [e.op("Equal", [x, one]), one,
                              e.op("Where", [e.op("Equal", [x, minus_one]), of_minus_one,
                                             zero])])
    return e.op("Where", [e.op("Less", [n, zero]), negative, result])


@rule("pow", "operator.pow")
def pow_(call: Call) -> str:
    return _power(call, call.args[0], call.arg(1, "exponent"))


@rule("float_power")
def float_power(call: Call) -> str:
    return _power(call, call.args[0], call.arg(1, "exponent"))


@rule("square")
def square(call: Call) -> str:
    work = opmath(call.out.dtype)
    x = operand(call, call.args[0], work)
    return finish(call, call.e.op("Mul", [x, x]), work)


@rule("neg", "negative", "operator.neg")
def neg(call: Call) -> str:
    return unary(call, "Neg", call.args[0])


@rule("operator.pos", "positive")
def pos(call: Call) -> Value:
    return call.args[0]


@rule("abs", "absolute", "operator.abs")
def abs_(call: Call) -> str:
    if call.out.dtype == torch.bool:
        return call.args[0]
    return unary(call, "Abs", call.args[0])


_UNARY = {"exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sin": "Sin", "cos": "Cos", "tan": "Tan",
          "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh",
          "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "erf": "Erf",
          "reciprocal": "Reciprocal", "arcsin": "Asin", "arccos": "Acos", "arctan": "Atan"}


def _simple_unary(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        return unary(call, op_type, call.args[0])
    return apply


for _name, _op in _UNARY.items():
    rule(_name)(_simple_unary(_op))


@rule("rsqrt")
def rsqrt(call: Call) -> str:
    work = opmath(call.out.dtype)
    x = operand(call, call.args[0], work)
    return finish(call, call.e.op("Reciprocal", [call.e.op("Sqrt", [x])]), work)


def _log_base(base: float):  # noqa: ANN202
    def apply(call: Call) -> str:
        work = opmath(call.out.dtype)
        x = operand(call, call.args[0], work)
        return finish(call, call.e.op("Div", [call.e.op("Log", [x]),
                                              call.e.const(math.log(base), work)]), work)
    return apply


rule("log2")(_log_base(2.0))
rule("log10")(_log_base(10.0))


@rule("log1p")
def log1p(call: Call) -> str:
    work = opmath(call.out.dtype)
    return finish(call, _log1p(call, operand(call, call.args[0], work), work), work)


@rule("expm1")
def expm1(call: Call) -> str:
    work = opmath(call.out.dtype)
    x = operand(call, call.args[0], work)
    return finish(call, call.e.op("Sub", [call.e.op("Exp", [x]), call.e.const(1, work)]), work)


@rule("exp2")
def exp2(call: Call) -> str:
    work = opmath(call.out.dtype)
    x = operand(call, call.args[0], work)
    return finish(call, call.e.op("Pow", [call.e.const(2, work), x]), work)


def _rounding(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> object:
        x = call.args[0]
        if not call.out.dtype.is_floating_point:
            return x  # integers are their own floor, ceil, round and trunc
        if op_type == "Round" and call.kwargs.get("decimals", 0) != 0:
            raise call.refuse("round(decimals != 0)")
        work = opmath(call.out.dtype)
        v = operand(call, x, work)
        if op_type == "Trunc":
            return finish(call, _trunc(call, v, work), work)
        if op_type == "Frac":
            return finish(call, call.e.op("Sub", [v, _trunc(call, v, work)]), work)
        return finish(call, call.e.op(op_type, [v]), work)
    return apply


rule("floor")(_rounding("Floor"))
rule("ceil")(_rounding("Ceil"))
rule("round")(_rounding("Round"))
rule("trunc", "fix")(_rounding("Trunc"))
rule("frac")(_rounding("Frac"))


@rule("sign", "sgn")
def sign(call: Call) -> object:
    if call.out.dtype == torch.bool:
        return call.args[0]
    if not call.out.dtype.is_floating_point:
        return unary(call, "Sign", call.args[0])
    e = call.e
    work = opmath(call.out.dtype)
    x = operand(call, call.args[0], work)
    signed = e.op("Where", [e.op("IsNaN", [x]), e.const(0, work), e.op("Sign", [x])])
    return finish(call, signed, work)  # eager's sign of NaN is 0


@rule("atan2", "arctan2")
def atan2(call: Call) -> str:
    """atan(y / x) moved to the right quadrant, with eager's signed zeros (the sign of
    a zero read as the sign of its reciprocal: 1 / -0 = -inf) and infinities."""
    e = call.e
    work = opmath(call.out.dtype)
    y = operand(call, call.args[0], work)
    x = operand(call, call.arg(1, "other"), work)
    zero = e.const(0, work)
    pi = e.const(math.pi, work)
    base = e.op("Atan", [e.op("Div", [y, x])])
    y_neg = e.op("Or", [e.op("Less", [y, zero]), e.op("Less", [e.op("Reciprocal", [y]), zero])])
    x_neg = e.op("Or", [e.op("Less", [x, zero]), e.op("Less", [e.op("Reciprocal", [x]), zero])])
    shifted = e.op("Where", [y_neg, e.op("Sub", [base, pi]), e.op("Add", [base, pi])])
    off_axis = e.op("Where", [e.op("Less", [x, zero]), shifted, base])
    origin = e.op("Where", [x_neg, e.op("Where", [y_neg, e.op("Neg", [pi]), pi]), y])
    vertical = e.op("Where", [y_neg, e.const(-math.pi / 2, work), e.const(math.pi / 2, work)])
    on_axis = e.op("Where", [e.op("Equal", [y, zero]), origin, vertical])
    result = e.op("Where", [e.op("Equal", [x, zero]), on_axis, off_axis])
    corner = e.op("Where", [x_neg, e.const(3 * math.pi / 4, work), e.const(math.pi / 4, work)])
    corner = e.op("Where", [y_neg, e.op("Neg", [corner]), corner])  # both infinite: inf / inf
    both_infinite = e.op("And", [e.op("IsInf", [y]), e.op("IsInf", [x])])
    result = e.op("Where", [both_infinite, corner, result])
    nan = e.op("Or", [e.op("IsNaN", [y]), e.op("IsNaN", [x])])  # (the branches test y == 0)
    return finish(call, e.op("Where", [nan, e.const(float("nan"), work), result]), work)


def _bound_operand(call: Call, bound: object, work: torch.dtype) -> str:
    """A clamp bound: a Python number wraps to an integer result's type first, as eager's
    (uint8.clamp(-2, 3) clamps between 254 and 3)."""
    integer = not call.out.dtype.is_floating_point and call.out.dtype != torch.bool
    return operand(call, bound, work, call.out.dtype if integer else None)


def _bound(call: Call, x: str, bound: object, op_type: str, work: torch.dtype) -> str:
    return call.e.op(op_type, [x, _bound_operand(call, bound, work)])


@rule("clamp", "clip")
def clamp(call: Call) -> str:
    work = opmath(call.out.dtype)
    low, high = call.arg(1, "min"), call.arg(2, "max")
    x = operand(call, call.args[0], work)
    if low is None and high is None:
        raise call.refuse("clamp without bounds")
    # Clip with one bound left out clips at the type's largest finite value (inf -> max)
    scalar = all(isinstance(b, (int, float)) for b in (low, high))
    if scalar and work in (torch.float32, torch.float64, torch.int32, torch.int64):
        inputs = [x, _bound_operand(call, low, work), _bound_operand(call, high, work)]
        return finish(call, call.e.op("Clip", inputs), work)
    if low is not None:
        x = _bound(call, x, low, "Max", work)
    if high is not None:
        x = _bound(call, x, high, "Min", work)
    return finish(call, x, work)


@rule("clamp_min")
def clamp_min(call: Call) -> str:
    work = opmath(call.out.dtype)
    return finish(call, _bound(call, operand(call, call.args[0], work), call.arg(1, "min"),
                               "Max", work), work)


@rule("clamp_max")
def clamp_max(call: Call) -> str:
    work = opmath(call.out.dtype)
    return finish(call, _bound(call, operand(call, call.args[0], work), call.arg(1, "max"),
                               "Min", work), work)


@rule("maximum")
def maximum(call: Call) -> str:
    return _binary(call, "Max", call.args[0], call.arg(1, "other"))


@rule("minimum")
def minimum(call: Call) -> str:
    return _binary(call, "Min", call.args[0], call.arg(1, "other"))


def _nan_ignoring(call: Call, op_type: str) -> str:
    """fmax / fmin: the other operand where one is NaN (NaN only where both are);
    ONNX's Max / Min give NaN as eager's maximum / minimum do."""
    e = call.e
    work = opmath(call.out.dtype)
    a = operand(call, call.args[0], work)
    b = operand(call, call.arg(1, "other"), work)
    extreme = e.op(op_type, [a, b])
    if work.is_floating_point:
        extreme = e.op("Where", [e.op("IsNaN", [b]), e.op(op_type, [a, a]), extreme])
        extreme = e.op("Where", [e.op("IsNaN", [a]), e.op(op_type, [b, b]), extreme])
    return finish(call, extreme, work)


@rule("fmax")
def fmax(call: Call) -> str:
    return _nan_ignoring(call, "Max")


@rule("fmin")
def fmin(call: Call) -> str:
    return _nan_ignoring(call, "Min")


@rule("lerp")
def lerp(call: Call) -> str:
    """Eager's two-sided form: start + w·(end - start) below w = 0.5, end - (end - start)·(1 - w)
    from it."""
    e = call.e
    work = opmath(call.out.dtype)
    a = operand(call, call.args[0], work)
    b = operand(call, call.arg(1, "end"), work)
    weight = call.arg(2, "weight")
    w = operand(call, weight, work)
    diff = e.op("Sub", [b, a])
    one = e.const(1, work)
    low = e.op("Add", [a, e.op("Mul", [w, diff])])
    high = e.op("Sub", [b, e.op("Mul", [diff, e.op("Sub", [one, w])])])
    if isinstance(weight, (int, float)):
        return finish(call, low if abs(weight) < 0.5 else high, work)
    small = e.op("Less", [e.op("Abs", [w]), e.const(0.5, work)])
    return finish(call, e.op("Where", [small, low, high]), work)


def _addc(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        e = call.e
        work = opmath(call.out.dtype)
        x = operand(call, call.args[0], work)
        t1 = operand(call, call.arg(1, "tensor1"), work)
        t2 = operand(call, call.arg(2, "tensor2"), work)
        value = call.kwargs.get("value", call.args[3] if len(call.args) > 3 else 1)
        scaled = t1 if value == 1 else e.op("Mul", [operand(call, value, work), t1])
        return finish(call, e.op("Add", [x, e.op(op_type, [scaled, t2])]), work)
    return apply


rule("addcmul")(_addc("Mul"))
rule("addcdiv")(_addc("Div"))


@rule("hypot")
def hypot(call: Call) -> str:
    e = call.e
    work = opmath(call.out.dtype)
    a = operand(call, call.args[0], work)
    b = operand(call, call.arg(1, "other"), work)
    if work == torch.float64:  # m * sqrt((a/m)² + (b/m)²), m = max(|a|, |b|): no overflow
        m = e.op("Max", [e.op("Abs", [a]), e.op("Abs", [b])])
        ra, rb = e.op("Div", [a, m]), e.op("Div", [b, m])
        root = e.op("Mul", [m, e.op("Sqrt", [e.op("Add", [e.op("Mul", [ra, ra]),
                                                          e.op("Mul", [rb, rb])])])])
        root = e.op("Where", [e.op("Equal", [m, e.const(0.0, work)]), e.const(0.0, work), root])
    else:  # squares of float32 overflow from 1.8e19; in float64 they are exact and cannot
        wide = torch.float64
        a2, b2 = e.cast(a, work, wide), e.cast(b, work, wide)
        root = e.cast(e.op("Sqrt", [e.op("Add", [e.op("Mul", [a2, a2]), e.op("Mul", [b2, b2])])]),
                      wide, work)
    infinite = e.op("Or", [e.op("IsInf", [a]), e.op("IsInf", [b])])  # hypot(inf, NaN) = inf
    return finish(call, e.op("Where", [infinite, e.const(float("inf"), work), root]), work)


@rule("copysign")
def copysign(call: Call) -> str:
    e = call.e
    work = opmath(call.out.dtype)
    a = e.op("Abs", [operand(call, call.args[0], work)])
    b = operand(call, call.arg(1, "other"), work)
    zero = e.const(0, work)  # b's sign, -0.0 read as negative through 1 / -0.0 = -inf
    negative = e.op("Or", [e.op("Less", [b, zero]),
                           e.op("Less", [e.op("Reciprocal", [b]), zero])])
    # |a| times -1 or 1: a Where choosing -|a| would turn -0.0 into 0.0 (onnxruntime's
    # Where drops the sign of a zero it takes from its first branch)
    factor = e.op("Where", [negative, e.const(-1, work), e.const(1, work)])
    return finish(call, e.op("Mul", [a, factor]), work)


@rule("nan_to_num")
def nan_to_num(call: Call) -> object:
    e = call.e
    x = call.args[0]
    dtype = call.out.dtype
    if not dtype.is_floating_point:
        return x
    work = opmath(dtype)
    info = torch.finfo(dtype)
    nan = call.arg(1, "nan", 0.0)
    posinf = call.arg(2, "posinf")
    neginf = call.arg(3, "neginf")
    v = operand(call, x, work)
    v = e.op("Where", [e.op("IsNaN", [v]), e.const(0.0 if nan is None else nan, work), v])
    v = e.op("Where", [e.op("IsInf", [v], detect_negative=0),
                       e.const(info.max if posinf is None else posinf, work), v])
    v = e.op("Where", [e.op("IsInf", [v], detect_positive=0),
                       e.const(info.min if neginf is None else neginf, work), v])
    return finish(call, v, work)


def _log1p(call: Call, y: str, work: torch.dtype) -> str:
    """log(1 + y) accurate for small y (ONNX has no Log1p): with u = 1 + y rounded,
    log(u) * y / (u - 1), and y itself where u rounds to 1 (and keeps y's sign of zero)
    or is +inf (where the ratio is inf / inf)."""
    e = call.e
    one = e.const(1, work)
    u = e.op("Add", [y, one])
    # log(u) * (y / (u - 1)): the quotient stays near 1, where log(u) * y would overflow
    # for y above about 4e36 (float32) before the division
    ratio = e.op("Mul", [e.op("Log", [u]), e.op("Div", [y, e.op("Sub", [u, one])])])
    keep = e.op("Or", [e.op("Equal", [u, one]), e.op("Equal", [u, e.const(math.inf, work)])])
    return e.op("Where", [keep, y, ratio])


def _log_add_exp(base2: bool):  # noqa: ANN202
    def apply(call: Call) -> str:
        """Eager's stable form: max(a, b) + log1p(exp(-|a - b|)) (exp2 and a factor
        1 / ln 2 for base 2); two equal infinities give themselves (inf - inf is NaN)."""
        e = call.e
        work = opmath(call.out.dtype)
        if not work.is_floating_point:
            raise call.refuse(f"a {call.out.dtype} result")
        a = operand(call, call.args[0], work)
        b = operand(call, call.arg(1, "other"), work)
        gap = e.op("Neg", [e.op("Abs", [e.op("Sub", [a, b])])])
        if base2:
            small = e.op("Pow", [e.const(2, work), gap])
            tail = e.op("Mul", [_log1p(call, small, work), e.const(1.0 / math.log(2.0), work)])
        else:
            tail = _log1p(call, e.op("Exp", [gap]), work)
        total = e.op("Add", [e.op("Max", [a, b]), tail])
        same_infinity = e.op("And", [e.op("IsInf", [a]), e.op("Equal", [a, b])])
        return finish(call, e.op("Where", [same_infinity, a, total]), work)
    return apply


rule("logaddexp")(_log_add_exp(False))
rule("logaddexp2")(_log_add_exp(True))
