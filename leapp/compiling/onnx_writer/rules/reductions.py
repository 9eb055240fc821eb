"""Reductions (with keepdim, negative dims, dtype, reductions with indices),
cumulative sums, products, maxima and minima, sort and topk, argmax/argmin (first
index on ties, as eager)."""
from __future__ import annotations

from typing import Any

import torch

from ..emit import Call, Value, rule
from .common import (dims_arg, finish, float_work, nan_flags, nan_kept, norm_dim, operand,
                     opmath, rule_name)


def _dim_keep(call: Call, dim_index: int = 1) -> tuple[list[int] | None, bool]:
    x = call.args[0]
    dim = call.arg(dim_index, "dim")
    if dim is None:
        dim = call.kwargs.get("axis")
    keep = bool(call.arg(dim_index + 1, "keepdim", False))
    return dims_arg(dim, x.rank), keep


def extreme(call: Call, op_type: str, v: str, axes: list[int] | None, keep: bool,
            work: torch.dtype) -> str:
    """ReduceMax / ReduceMin with eager's NaN: onnxruntime's pass over a NaN, eager's
    extreme is NaN wherever the reduced values hold one."""
    e = call.e
    if not work.is_floating_point:
        return e.reduce(op_type, v, axes, keep)
    return nan_kept(call, v, work, lambda t: e.reduce(op_type, t, axes, keep),
                    lambda flags: e.reduce("ReduceMax", flags, axes, keep))


def extreme_index(call: Call, arg_op: str, v: str, axis: int, keep: bool,
                  work: torch.dtype) -> str:
    """ArgMax / ArgMin, first index on ties, with eager's NaN: the first NaN's index
    wherever the values hold one (onnxruntime's would skip it)."""
    e = call.e
    index = e.op(arg_op, [v], axis=axis, keepdims=int(keep), select_last_index=0)
    if not work.is_floating_point:
        return index
    nan = nan_flags(call, v, torch.int32)
    first_nan = e.op("ArgMax", [nan], axis=axis, keepdims=int(keep), select_last_index=0)
    seen = e.cast(e.reduce("ReduceMax", nan, [axis], keep), torch.int32, torch.bool)
    return e.op("Where", [seen, first_nan, index])


def _plain(op_type: str, integer_result: bool = False):  # noqa: ANN202
    def apply(call: Call) -> str:
        x = call.args[0]
        if isinstance(call.arg(1, "dim"), torch.dtype):  # x.sum(torch.float64)
            raise call.refuse("a dtype in the dim position")
        axes, keep = _dim_keep(call)
        work = opmath(call.out.dtype)
        v = operand(call, x, work)
        if x.rank == 0:
            return finish(call, call.e.op("Identity", [v]), work)
        if op_type in ("ReduceMax", "ReduceMin"):
            return finish(call, extreme(call, op_type, v, axes, keep, work), work)
        return finish(call, call.e.reduce(op_type, v, axes, keep), work)
    return apply


rule("sum")(_plain("ReduceSum"))
rule("mean")(_plain("ReduceMean"))
rule("prod")(_plain("ReduceProd"))
rule("amax")(_plain("ReduceMax"))
rule("amin")(_plain("ReduceMin"))
rule("logsumexp")(_plain("ReduceLogSumExp"))


def _nan_reduction(mean: bool):  # noqa: ANN202
    """nansum / nanmean: NaN counted as 0 and, for the mean, left out of the count
    (eager's NaN only where every reduced value is NaN)."""
    def apply(call: Call) -> str:
        e = call.e
        x = call.args[0]
        axes, keep = _dim_keep(call)
        work = opmath(call.out.dtype)
        v = operand(call, x, work)
        if not work.is_floating_point:
            if mean:
                raise call.refuse(f"nanmean of {x.dtype}")
            return finish(call, e.reduce("ReduceSum", v, axes, keep) if x.rank else v, work)
        nan = e.op("IsNaN", [v])
        clean = e.op("Where", [nan, e.const(0, work), v])
        if x.rank == 0:
            total = clean
        else:
            total = e.reduce("ReduceSum", clean, axes, keep)
        if not mean:
            return finish(call, total, work)
        present = e.cast(e.op("Not", [nan]), torch.bool, work)
        count = present if x.rank == 0 else e.reduce("ReduceSum", present, axes, keep)
        return finish(call, e.op("Div", [total, count]), work)
    return apply


rule("nansum")(_nan_reduction(False))
rule("nanmean")(_nan_reduction(True))


def _min_max(op_type: str, arg_op: str, binary_op: str):  # noqa: ANN202
    def apply(call: Call) -> object:
        x = call.args[0]
        other = call.arg(1, "dim")
        if isinstance(other, Value) or isinstance(call.kwargs.get("other"), Value):
            other = other if isinstance(other, Value) else call.kwargs["other"]
            work = opmath(call.out.dtype)
            return finish(call, call.e.op(binary_op, [operand(call, x, work),
                                                      operand(call, other, work)]), work)
        e = call.e
        if other is None:  # the whole tensor
            work = opmath(call.out.dtype)
            v = operand(call, x, work)
            return finish(call, extreme(call, op_type, v, None, False, work), work)
        dim = norm_dim(int(other), x.rank)
        keep = bool(call.arg(2, "keepdim", False))
        work = opmath(x.dtype)
        v = operand(call, x, work)
        if x.rank == 0:
            return [e.cast(v, work, x.dtype), e.const(0, torch.int64)]
        values = e.cast(extreme(call, op_type, v, [dim], keep, work), work, x.dtype)
        return [values, extreme_index(call, arg_op, v, dim, keep, work)]
    return apply


rule("max")(_min_max("ReduceMax", "ArgMax", "Max"))
rule("min")(_min_max("ReduceMin", "ArgMin", "Min"))


def _arg(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        e = call.e
        x = call.args[0]
        dim = call.arg(1, "dim")
        keep = bool(call.arg(2, "keepdim", False))
        work = opmath(x.dtype)
        if work == torch.bool:
            work = torch.int32
        v = operand(call, x, work)
        if dim is None:
            index = extreme_index(call, op_type, e.reshape(v, (-1,)), 0, False, work)
            if keep:
                index = e.reshape(index, (1,) * x.rank)
            return index
        return extreme_index(call, op_type, v, norm_dim(int(dim), x.rank), keep, work)
    return apply


rule("argmax")(_arg("ArgMax"))
rule("argmin")(_arg("ArgMin"))


def _any_all(op_type: str):  # noqa: ANN202
    def apply(call: Call) -> str:
        e = call.e
        x = call.args[0]
        axes, keep = _dim_keep(call)
        flags = e.cast(operand(call, x, torch.bool), torch.bool, torch.int32) \
            if x.dtype != torch.bool else e.cast(x.name, torch.bool, torch.int32)
        if x.rank == 0:
            reduced = flags
        else:
            reduced = e.reduce(op_type, flags, axes, keep)
        return e.cast(reduced, torch.int32, call.out.dtype)
    return apply


rule("any")(_any_all("ReduceMax"))
rule("all")(_any_all("ReduceMin"))


@rule("count_nonzero")
def count_nonzero(call: Call) -> str:
    e = call.e
    x = call.args[0]
    axes = dims_arg(call.arg(1, "dim"), x.rank)
    flags = e.cast(operand(call, x, torch.bool), torch.bool, torch.int64)
    return e.reduce("ReduceSum", flags, axes, False)


def _variance_form(call: Call) -> tuple[Any, float, bool]:
    """(dim, correction, keepdim) of a normalized var / std / var_mean / std_mean call:
    (x, unbiased), (x, dim, unbiased, keepdim) or (x, dim, *, correction, keepdim)."""
    args = call.args
    if len(args) == 2 and isinstance(args[1], bool):
        return None, 1.0 if args[1] else 0.0, False
    dim = args[1] if len(args) > 1 else None
    if len(args) > 2:  # the dim overload: unbiased and keepdim positional
        return dim, 1.0 if args[2] else 0.0, bool(args[3]) if len(args) > 3 else False
    correction = call.kwargs.get("correction")
    return (dim, 1.0 if correction is None else float(correction),
            bool(call.kwargs.get("keepdim", False)))


def _variance(call: Call) -> tuple[str, torch.dtype]:
    e = call.e
    x = call.args[0]
    dim, correction, keep = _variance_form(call)
    axes = dims_arg(dim, x.rank)
    work = opmath(call.out.dtype if not isinstance(call.out, tuple) else call.out[0].dtype)
    # eager's CPU kernel accumulates float32 in float64: the same digits, and squares of
    # values above 1.8e19 that do not overflow
    work = torch.float64 if work == torch.float32 else work
    v = operand(call, x, work)
    mean = e.reduce("ReduceMean", v, axes, True)
    centred = e.op("Sub", [v, mean])
    total = e.reduce("ReduceSum", e.op("Mul", [centred, centred]), axes, keep)
    count = 1
    for axis in (axes if axes is not None else range(x.rank)):
        count *= x.shape[axis]
    denominator = max(count - correction, 0)
    return e.op("Div", [total, e.const(float(denominator), work)]), work


@rule("var")
def var(call: Call) -> str:
    value, work = _variance(call)
    return finish(call, value, work)


@rule("std")
def std(call: Call) -> str:
    value, work = _variance(call)
    return finish(call, call.e.op("Sqrt", [value]), work)


def vector_norm(call: Call, x: Value, order: float, axes: list[int] | None, keep: bool,
                work: torch.dtype) -> str:
    e = call.e
    v = operand(call, x, work)
    if order == 2:
        return e.reduce("ReduceL2", v, axes, keep)
    if order == 1:
        return e.reduce("ReduceL1", v, axes, keep)
    if order == float("inf"):
        return extreme(call, "ReduceMax", e.op("Abs", [v]), axes, keep, work)
    if order == float("-inf"):
        return extreme(call, "ReduceMin", e.op("Abs", [v]), axes, keep, work)
    if order == 0:
        nonzero = e.cast(e.op("Not", [e.op("Equal", [v, e.const(0, work)])]), torch.bool, work)
        return e.reduce("ReduceSum", nonzero, axes, keep)
    powered = e.op("Pow", [e.op("Abs", [v]), e.const(order, work)])
    return e.op("Pow", [e.reduce("ReduceSum", powered, axes, keep), e.const(1.0 / order, work)])


@rule("vector_norm")
def linalg_vector_norm(call: Call) -> str:
    x = call.args[0]
    order = float(call.arg(1, "ord", 2))
    axes = dims_arg(call.arg(2, "dim"), x.rank)
    keep = bool(call.arg(3, "keepdim", False))
    work = opmath(call.out.dtype)
    if x.rank == 0:
        return finish(call, call.e.op("Abs", [operand(call, x, work)]), work)
    return finish(call, vector_norm(call, x, order, axes, keep, work), work)


#: The type eager's CPU kernels accumulate a cumulative sum or product in
#: (at::acc_type): float32 in float64, reduced floats in float32, integers in int64.
_CUM_ACC = {torch.float32: torch.float64, torch.float64: torch.float64,
            torch.float16: torch.float32, torch.bfloat16: torch.float32}


@rule("cumsum")
def cumsum(call: Call) -> str:
    """CumSum in eager's accumulator type (a float32 sum in float64, as the CPU kernel),
    rounded once at the end: the same sums as eager."""
    x = call.args[0]
    dim = norm_dim(int(call.arg(1, "dim")), x.rank)
    out = call.out.dtype
    if x.rank == 0:  # a 0-d input is its own sum (ONNX's CumSum needs an axis)
        return call.e.cast(operand(call, x, x.dtype), x.dtype, out)
    work = _CUM_ACC.get(out, opmath(out))
    if work == torch.bool:
        work = torch.int64
    # dtype= converts the input first (float32 to float16 rounds), then accumulates
    if out in _CUM_ACC:
        v = call.e.cast(operand(call, x, out), out, work)
    else:
        v = operand(call, x, work)
    return finish(call, call.e.op("CumSum", [v, call.e.scalar_int(dim)]), work)
@rule("logcumsumexp")
def logcumsumexp(call: Call) -> str:
    """log of the running sum of exp along dim, stable at every position: each prefix
    reduced with its own maximum (positions after it masked to -inf), so neither a
    large value overflows nor a small one underflows (torch's exporter's
    log(cumsum(exp)) gives inf above about 88)."""
    e = call.e
    x = call.args[0]
    work = float_work(call)
    v = operand(call, x, work)
    if x.rank == 0:
        return finish(call, e.op("Identity", [v]), work)
    dim = norm_dim(int(call.arg(1, "dim")), x.rank)
    n = x.shape[dim]
    if n > CUM_MAX_LENGTH:
        raise call.refuse(f"a dim of {n} (at most {CUM_MAX_LENGTH})")
    # rows[i, j] = x[j] for j <= i, -inf after: axis dim + 1 holds j
    later = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    shape = [1] * (x.rank + 1)
    shape[dim], shape[dim + 1] = n, n
    mask = e.tensor_const(later.reshape(shape))
    rows = e.op("Where", [mask, e.const(float("-inf"), work), e.unsqueeze(v, [dim])])
    top = e.reduce("ReduceMax", rows, [dim + 1], True)
    # an infinite maximum (all -inf, or a +inf) shifts by 0: exp keeps the infinities
    top = e.op("Where", [e.op("IsInf", [top]), e.const(0, work), top])
    total = e.reduce("ReduceSum", e.op("Exp", [e.op("Sub", [rows, top])]), [dim + 1], False)
    return finish(call, e.op("Add", [e.op("Log", [total]), e.squeeze(top, [dim + 1])]), work)


#: Longest dim a cumulative product / max / min is written for (the product is unrolled,
#: the max and min compare every pair of positions); longer ones go to torch's exporter.
CUM_MAX_LENGTH = 1024


@rule("cumprod")
def cumprod(call: Call) -> str:
    """Eager's sequential product, unrolled along the (static) dim: Split, one Mul per
    position, Concat, in eager's accumulator type (float32 in float64, as the CPU
    kernel).  Exact: the same multiplications in the same order and precision.  ONNX
    has no CumProd, and exp(cumsum(log|x|)) is not exact; a Loop / Scan is avoided for
    TensorRT."""
    e = call.e
    x = call.args[0]
    dim = call.arg(1, "dim")
    if not isinstance(x, Value) or dim is None:
        raise call.refuse("cumprod without a tensor and a dim")
    out = call.out.dtype
    if out == torch.bool:
        raise call.refuse("a boolean result")
    acc = _CUM_ACC.get(out, torch.int64)
    # dtype= converts the input first (a float to an integer truncates), then accumulates
    v = e.cast(operand(call, x, out), out, acc)
    if x.rank == 0:
        return finish(call, e.op("Identity", [v]), acc)
    axis = norm_dim(int(dim), x.rank)
    n = x.shape[axis]
    if n > CUM_MAX_LENGTH:
        raise call.refuse(f"a dim of {n} (the product is unrolled up to {CUM_MAX_LENGTH})")
    if n <= 1:
        return finish(call, e.op("Identity", [v]), acc)
    parts = e.op("Split", [v, e.ints([1] * n)], outputs=n, axis=axis)
    running = parts[0]
    products = [running]
    for part in parts[1:]:
        running = e.op("Mul", [running, part])
        products.append(running)
    return finish(call, e.op("Concat", products, axis=axis), acc)


def _cumulative_extreme(largest: bool):  # noqa: ANN202
    """cummax / cummin as eager's CPU kernel: a position takes the element when it is
    >= (<=) the running value, so the index is the LAST position holding the prefix
    extreme; a NaN sticks (index: the last NaN so far).  Written for the static dim as
    a comparison of every pair (i, j <= i): the prefix extreme M[i] (ReduceMax / Min of
    the NaN-free prefix), the last j <= i with x[j] == M[i] (or, once a NaN was seen,
    the last NaN), and the values gathered at those indices (signed zeros as eager)."""
    def apply(call: Call) -> list[str]:
        e = call.e
        x = call.args[0]
        dim = call.arg(1, "dim")
        if not isinstance(x, Value) or dim is None:
            raise call.refuse("without a tensor and a dim")
        if x.rank == 0:
            return [e.op("Identity", [x.name]), e.const(0, torch.int64)]
        axis = norm_dim(int(dim), x.rank)
        n = x.shape[axis]
        if n > CUM_MAX_LENGTH or x.example.numel() * n > 2 ** 24:
            raise call.refuse(f"a dim of {n} over {x.example.numel()} elements (every pair "
                              f"of positions is compared)")
        work = opmath(x.dtype)
        if work == torch.bool:
            work = torch.int32
        v = operand(call, x, work)
        trailing = [1] * (x.rank - 1 - axis)
        # pair (i, j) on axes (axis, axis + 1): i the output position, j <= i its prefix
        steps = torch.arange(n)
        tri = e.const((steps[None, :] <= steps[:, None]).tolist(), torch.bool,
                      (n, n, *trailing))
        if work.is_floating_point:
            fill = float("-inf") if largest else float("inf")
        else:
            info = torch.iinfo(work)
            fill = info.min if largest else info.max
        fill_name = e.const(fill, work)
        nan = e.op("IsNaN", [v]) if work.is_floating_point else None
        clean = e.op("Where", [nan, fill_name, v]) if nan is not None else v
        pairs = e.op("Where", [tri, e.unsqueeze(clean, [axis]), fill_name])
        extreme = e.reduce("ReduceMax" if largest else "ReduceMin", pairs, [axis + 1], True)
        hits = e.op("And", [tri, e.op("Equal", [e.unsqueeze(v, [axis]), extreme])])
        if nan is not None:
            nan_hits = e.op("And", [tri, e.unsqueeze(nan, [axis])])
            seen = e.reduce("ReduceMax", e.cast(nan_hits, torch.bool, torch.int32),
                            [axis + 1], True)
            seen = e.cast(seen, torch.int32, torch.bool)  # (onnxruntime has no boolean Where)
            hits = e.op("Or", [e.op("And", [seen, nan_hits]),
                               e.op("And", [e.op("Not", [seen]), hits])])
        positions = e.const(list(range(n)), torch.int32, (n, *trailing))
        last = e.reduce("ReduceMax", e.op("Where", [hits, positions, e.const(-1, torch.int32)]),
                        [axis + 1], False)
        indices = e.cast(last, torch.int32, torch.int64)
        values = e.op("GatherElements", [x.name, indices], axis=axis)
        return [values, indices]
    return apply


rule("cummax")(_cumulative_extreme(True))
rule("cummin")(_cumulative_extreme(False))


def _topk(call: Call, x: Value, k: int, dim: int, largest: bool) -> list[str]:
    """TopK, equal values in index order (a stable sort's).  Floats place NaN as eager
    does, above +inf (last ascending, first descending): a second, stable TopK of
    the NaN flags in the first one's order moves them, as onnxruntime orders NaN
    arbitrarily."""
    e = call.e
    work = opmath(x.dtype)
    if work == torch.bool:
        raise call.refuse("sorting booleans")
    v = operand(call, x, work)
    if not work.is_floating_point:
        values, indices = e.op("TopK", [v, e.ints([k])], outputs=2, axis=dim,
                               largest=int(largest), sorted=1)
        return [e.cast(values, work, x.dtype), indices]
    n = x.shape[dim] if x.rank else 1
    nan = e.op("IsNaN", [v])
    plain = e.op("Where", [nan, e.const(float("inf"), work), v])
    _, first = e.op("TopK", [plain, e.ints([n])], outputs=2, axis=dim, largest=int(largest),
                    sorted=1)
    flags = e.op("GatherElements", [e.cast(nan, torch.bool, torch.int32), first], axis=dim)
    _, moved = e.op("TopK", [flags, e.ints([n])], outputs=2, axis=dim, largest=int(largest),
                    sorted=1)
    indices = e.op("GatherElements", [first, moved], axis=dim)
    if k < n:
        indices = e.slice(indices, [0], [k], [dim])
    values = e.op("GatherElements", [v, indices], axis=dim)
    return [e.cast(values, work, x.dtype), indices]


@rule("topk")
def topk(call: Call) -> list[str]:
    x = call.args[0]
    k = int(call.arg(1, "k"))
    dim = norm_dim(int(call.arg(2, "dim", -1)), x.rank)
    largest = bool(call.arg(3, "largest", True))
    return _topk(call, x, k, dim, largest)


@rule("sort")
def sort(call: Call) -> list[str]:
    x = call.args[0]
    dim = call.arg(1, "dim", -1)
    descending = call.arg(2, "descending", False)
    if isinstance(dim, bool):  # sort(x, descending) is not a form torch has; be safe
        raise call.refuse("sort(dim=bool)")
    dim = norm_dim(int(dim), x.rank)
    return _topk(call, x, x.shape[dim], dim, bool(descending))


@rule("argsort")
def argsort(call: Call) -> str:
    x = call.args[0]
    dim = norm_dim(int(call.arg(1, "dim", -1)), x.rank)
    descending = bool(call.arg(2, "descending", False))
    return _topk(call, x, x.shape[dim], dim, descending)[1]


@rule("var_mean", "std_mean")
def var_mean(call: Call) -> list[str]:
    value, work = _variance(call)
    if rule_name(call) == "std_mean":
        value = call.e.op("Sqrt", [value])
    x = call.args[0]
    dim, _, keep = _variance_form(call)
    axes = dims_arg(dim, x.rank)
    mean = call.e.reduce("ReduceMean", operand(call, x, work), axes, keep)
    dtype = call.out[0].dtype
    return [call.e.cast(value, work, dtype), call.e.cast(mean, work, dtype)]


@rule("norm")
def norm(call: Call) -> str:
    """torch.linalg.norm: vector norms over one dim; over two dims (or all) only the
    Frobenius norm (ord=None or 'fro'), which is the 2-norm of the elements."""
    x = call.args[0]
    order = call.arg(1, "ord")
    dim = call.arg(2, "dim")
    keep = bool(call.arg(3, "keepdim", False))
    axes = dims_arg(dim, x.rank)
    work = opmath(call.out.dtype)
    matrix = (axes is None and x.rank == 2 and order is not None) or \
        (axes is not None and len(axes) == 2)
    if matrix and order not in (None, "fro"):
        raise call.refuse(f"matrix norm ord={order!r}")
    p = 2.0 if order in (None, "fro") else float(order)
    return finish(call, vector_norm(call, x, p, axes, keep, work), work)
