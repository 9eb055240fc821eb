"""Helpers the rule families share: eager's computation types, operands as ONNX
values of a given dtype, dims."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..emit import Call, Value

#: The type eager computes in: reduced floats in float32 (each op rounds its result
#: back), small integers in int32 (results wrap back on the cast).
_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
           torch.int8: torch.int32, torch.int16: torch.int32, torch.uint8: torch.int32}


def opmath(dtype: torch.dtype) -> torch.dtype:
    return _OPMATH.get(dtype, dtype)


def is_value(x: Any) -> bool:
    return isinstance(x, Value)


def operand(call: Call, x: Any, dtype: torch.dtype, scalar_dtype: torch.dtype | None = None
            ) -> str:
    """x (a Value or a Python number) as an ONNX value of dtype.

    A Python number becomes a constant of dtype, first rounded to scalar_dtype
    where eager rounds it (a comparison with a float16 tensor rounds the number
    to float16)."""
    if isinstance(x, Value):
        return call.e.cast(x.name, x.dtype, dtype)
    if isinstance(x, torch.Tensor):  # a tensor argument the walk left as it is
        return call.e.cast(call.e.tensor_const(x), x.dtype, dtype)
    if isinstance(x, (bool, int, float)):
        value = torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else None)
        if scalar_dtype is not None:
            value = value.to(scalar_dtype)
        return call.e.const(value.item() if value.dtype != torch.bool else bool(value), dtype)
    raise call.refuse(f"an operand of type {type(x).__name__}")


def rule_name(call: Call) -> str:
    """The name of the torch call a rule is writing (``squeeze``, ``zeros_like``, ...)."""
    target = call.node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def one_value(t: torch.Tensor) -> torch.Tensor | None:
    """t's one value (a 0-d tensor) when every element is the same bit for bit (0.0
    and -0.0 differ, a NaN is never the same), else None (also for an empty t)."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0 or t.is_complex():
        return None
    first = flat[:1]
    if t.is_floating_point():
        if bool(torch.isnan(first).any()):
            return None
        bits = _BITS[t.element_size()]
        same = bool((flat.view(bits) == first.view(bits)).all())
    else:
        same = bool((flat == first).all())
    return first.reshape(()) if same else None


def sized_like(call: Call, x: Value, dtype: torch.dtype, data: str | None,
               axes: list[int]) -> str:
    """x as an operand of dtype.  A constant of one value throughout that the node made
    from no input (the zeros nn.GRU starts from, a torch.zeros(x.shape[0], k) padding)
    is an Expand whose axes take data's sizes at run time: the same for the traced
    shapes, and the batched fused model stacks robots on it as on data."""
    e = call.e
    first = one_value(x.example) if x.const and data is not None else None
    if first is None:
        return operand(call, x, dtype)
    sizes = e.shape_of(data)
    parts: list[str] = []
    fixed: list[int] = []
    for axis, size in enumerate(x.shape):
        if axis not in axes:
            fixed.append(size)
            continue
        if fixed:
            parts.append(e.ints(fixed))
            fixed = []
        parts.append(e.slice(sizes, [axis], [axis + 1], [0]))
    if fixed:
        parts.append(e.ints(fixed))
    shape = parts[0] if len(parts) == 1 else e.op("Concat", parts, axis=0)
    return e.op("Expand", [e.cast(e.tensor_const(first), x.dtype, dtype), shape])


def dtype_of(x: Any) -> torch.dtype | None:
    return x.dtype if isinstance(x, (Value, torch.Tensor)) else None


def example(x: Any) -> Any:
    """The eager example of an operand (a Python number stays a number)."""
    return x.example if isinstance(x, Value) else x


def norm_dim(d: int, rank: int) -> int:
    return d + max(rank, 1) if d < 0 else d


def dims_arg(d: Any, rank: int) -> list[int] | None:
    """A dim / dims argument as a sorted list of non-negative axes (None: all)."""
    if d is None:
        return None
    if isinstance(d, (list, tuple)):
        if len(d) == 0:
            return None
        return sorted({norm_dim(int(x), rank) for x in d})
    return [norm_dim(int(d), rank)]


def float_work(call: Call) -> torch.dtype:
    """Eager's computation type of a floating result (a call with any other is refused)."""
    work = opmath(call.out.dtype)
    if not work.is_floating_point:
        raise call.refuse(f"a result of dtype {call.out.dtype}")
    return work


def finish(call: Call, name: str, computed: torch.dtype) -> str:
    """name (computed in `computed`) cast to eager's result type."""
    return call.e.cast(name, computed, call.out.dtype)


def unary(call: Call, op_type: str, x: Value, **attrs: Any) -> str:
    """op_type applied in eager's computation type of the result."""
    out = call.out.dtype
    work = opmath(out)
    return finish(call, call.e.op(op_type, [operand(call, x, work)], **attrs), work)


def choose(call: Call, cond: str, a: str, b: str, dtype: torch.dtype) -> str:
    """Where(cond, a, b) on dtype (reduced floats through float32, int16 through int32:
    exact both ways; booleans as And / Or: onnxruntime has no Where kernel for them)."""
    e = call.e
    if dtype == torch.bool:
        return e.op("Or", [e.op("And", [cond, a]), e.op("And", [e.op("Not", [cond]), b])])
    wider = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
             torch.int16: torch.int32}.get(dtype)
    if wider is not None:
        picked = e.op("Where", [cond, e.cast(a, dtype, wider), e.cast(b, dtype, wider)])
        return e.cast(picked, wider, dtype)
    return e.op("Where", [cond, a, b])


def nan_flags(call: Call, x: str, work: torch.dtype) -> str:
    """1 where x is NaN, 0 elsewhere, in work: reduced the way x is, it says where a
    NaN reached each result."""
    return call.e.cast(call.e.op("IsNaN", [x]), torch.bool, work)


def nan_kept(call: Call, x: str, work: torch.dtype, reduce: Callable[[str], str],
             reduce_flags: Callable[[str], str] | None = None) -> str:
    """reduce(x), NaN wherever reduce_flags (reduce itself by default) of x's NaN flags is
    nonzero: onnxruntime's ReduceMax / ReduceMin / MaxPool pass over a NaN (MaxPool keeps
    one only first in its window), eager's extreme is NaN wherever a NaN reaches it."""
    e = call.e
    seen = (reduce_flags or reduce)(nan_flags(call, x, work))
    return e.op("Where", [e.cast(seen, work, torch.bool), e.const(float("nan"), work),
                          reduce(x)])

