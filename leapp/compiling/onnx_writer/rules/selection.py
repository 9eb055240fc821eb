"""Values chosen by index tensors and masks, and the functional rewrites of in-place
writes the tracer records: index_select / gather / take_along_dim as Gather /
GatherElements (after eager's broadcasting), scatter as ScatterElements,
masked_fill / masked_write as Where, masked_scatter (dest[mask] = vector) as a
running count into the source, index_write / copy_write / the flat-position writes
as ScatterElements / Expand, and a tensor the node makes of one value (zeros, a
fill) sized from the data it meets."""
from __future__ import annotations

from typing import Any

import torch

from ..emit import Call, Value, rule
from .common import choose, norm_dim, one_value, operand, rule_name


def index_operand(call: Call, index: Value) -> str:
    if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise call.refuse(f"an index of dtype {index.dtype}")
    return call.e.cast(index.name, index.dtype, torch.int64)


@rule("index_select")
def index_select(call: Call) -> str:
    x = call.args[0]
    dim = norm_dim(int(call.arg(1, "dim")), x.rank)
    index = call.arg(2, "index")
    if x.rank == 0:
        return call.e.reshape(x.name, tuple(call.out.shape))
    return call.e.op("Gather", [x.name, index_operand(call, index)], axis=dim)


@rule("gather")
def gather(call: Call) -> str:
    x = call.args[0]
    dim, index = call.arg(1, "dim"), call.arg(2, "index")
    return call.e.op("GatherElements", [x.name, index_operand(call, index)],
                     axis=norm_dim(int(dim), x.rank))


@rule("take_along_dim")
def take_along_dim(call: Call) -> str:
    """GatherElements after eager's broadcasting: x and the indices broadcast against each
    other on every axis but dim (x keeps its size there, the indices theirs); without a
    dim, both flattened."""
    e = call.e
    x = call.args[0]
    index, dim = call.arg(1, "indices"), call.arg(2, "dim")
    if not isinstance(index, Value):
        raise call.refuse("constant indices")
    if dim is None:
        flat_x = e.reshape(x.name, (-1,))
        flat_i = e.reshape(index_operand(call, index), (-1,))
        return e.op("GatherElements", [flat_x, flat_i], axis=0)
    if index.rank != x.rank or x.rank == 0:
        raise call.refuse("take_along_dim with indices of another rank")
    axis = norm_dim(int(dim), x.rank)
    out = list(call.out.shape)
    data, idx = x.name, index_operand(call, index)
    if list(x.shape[:axis]) + list(x.shape[axis + 1:]) != out[:axis] + out[axis + 1:]:
        data = e.op("Expand", [data, e.ints(out[:axis] + [x.shape[axis]] + out[axis + 1:])])
    if list(index.shape) != out:
        idx = e.op("Expand", [idx, e.ints(out)])
    return e.op("GatherElements", [data, idx], axis=axis)


@rule("scatter", "scatter_add")
def scatter(call: Call) -> str:
    e = call.e
    x = call.args[0]
    dim = norm_dim(int(call.arg(1, "dim")), x.rank)
    index = call.arg(2, "index")
    src = call.arg(3, "src", call.kwargs.get("value"))
    if call.kwargs.get("reduce") is not None:
        raise call.refuse("scatter with reduce")
    reduction = "add" if rule_name(call) == "scatter_add" else None
    if not isinstance(src, Value):
        updates = e.op("Expand", [e.const(src, x.dtype), e.ints(index.shape)])
    else:
        updates = operand(call, src, x.dtype)
        if src.shape != index.shape:
            updates = e.slice(updates, [0] * index.rank, list(index.shape),
                              list(range(index.rank)))
    return e.op("ScatterElements", [x.name, index_operand(call, index), updates], axis=dim,
                reduction=reduction)


@rule("masked_fill", "masked_write")  # dest[mask] = value, recorded functionally
def masked_fill(call: Call) -> str:
    e = call.e
    x = call.args[0]
    mask = call.arg(1, "mask")
    value = call.arg(2, "value")
    filler = operand(call, value, x.dtype)
    return choose(call, e.cast(mask.name, mask.dtype, torch.bool), filler, x.name, x.dtype)


@rule("masked_scatter")
def masked_scatter(call: Call) -> str:
    """x with its True positions (the mask broadcast to x's shape) filled from source's
    elements in row-major order, as eager: each True position's rank among them (a
    running count) indexes the flattened source."""
    e = call.e
    x, mask, source = call.args[0], call.arg(1, "mask"), call.arg(2, "source")
    if not isinstance(mask, Value) or not isinstance(source, Value) or x.rank == 0:
        raise call.refuse("a constant mask or source, or a 0-d destination")
    flags = e.cast(mask.name, mask.dtype, torch.bool)
    if tuple(mask.shape) != tuple(x.shape):
        flags = e.op("Expand", [flags, e.shape_of(x.name)])
    flat = e.reshape(e.cast(flags, torch.bool, torch.int64), (-1,))
    rank = e.op("Sub", [e.op("CumSum", [flat, e.scalar_int(0)]), e.const(1, torch.int64)])
    rank = e.op("Max", [rank, e.const(0, torch.int64)])  # False positions read element 0
    if source.example.numel() == 0:
        return e.op("Identity", [x.name])
    picked = e.op("Gather", [e.reshape(operand(call, source, x.dtype), (-1,)), rank], axis=0)
    picked = e.op("Reshape", [picked, e.shape_of(x.name)])
    return choose(call, flags, picked, x.name, x.dtype)



@rule("index_write")
def index_write(call: Call) -> str:
    """dest with value at the flat positions idx (a constant): ScatterElements on the
    flat tensor."""
    e = call.e
    dest, idx, value = call.args[:3]
    if not isinstance(idx, Value):
        raise call.refuse("positions that are not a tensor")
    updates = operand(call, value, dest.dtype)
    if not isinstance(value, Value) or value.shape != idx.shape:
        updates = e.op("Expand", [updates, e.ints(idx.shape)])
    flat = e.reshape(dest.name, (-1,))
    written = e.op("ScatterElements", [flat, e.reshape(index_operand(call, idx), (-1,)),
                                       e.reshape(updates, (-1,))], axis=0)
    return e.reshape(written, dest.shape)


@rule("copy_write")
def copy_write(call: Call) -> str:
    e = call.e
    dest, src = call.args[:2]
    name = operand(call, src, dest.dtype)
    extra = src.rank - dest.rank if isinstance(src, Value) else 0
    if extra > 0:  # dest[:] = src drops src's leading 1s (leapp.tracing.ops.setitem_value)
        name = e.squeeze(name, list(range(extra)))
    if isinstance(src, Value) and src.shape[max(extra, 0):] == dest.shape:
        return e.op("Identity", [name])
    return e.op("Expand", [name, e.shape_of(dest.name)])


@rule("gather_positions")
def gather_positions(call: Call) -> str:
    e = call.e
    src, positions = call.args[:2]
    return e.op("Gather", [e.reshape(src.name, (-1,)), index_operand(call, positions)], axis=0)


@rule("scatter_positions")
def scatter_positions(call: Call) -> str:
    e = call.e
    dest, dest_pos, src, src_pos = call.args[:4]
    picked = e.op("Gather", [e.reshape(operand(call, src, dest.dtype), (-1,)),
                             e.reshape(index_operand(call, src_pos), (-1,))], axis=0)
    written = e.op("ScatterElements", [e.reshape(dest.name, (-1,)),
                                       e.reshape(index_operand(call, dest_pos), (-1,)), picked], axis=0)
    return e.reshape(written, dest.shape)


#: The calls _uniform writes whose first tensor argument gives the result's dtype
#: (and for *_like its shape) and nothing else: its values are never read.
_TYPED_BY_FIRST = ("zeros_like", "ones_like", "full_like", "empty_like", "new_zeros",
                   "new_ones", "new_full", "new_empty", "new_tensor", "filled", "zeroed")


def _uniform(call: Call) -> Value:
    """A result that does not depend on the input's values: a constant (Expand of one
    number when every element is the same), marked as one (sized_like).  A call with
    another argument computed from the node's inputs (x.new_tensor(y), full_like(x,
    y.sum())) is refused: its result is not a constant."""
    e = call.e
    name = rule_name(call)
    typed_by = call.args[0] if name in _TYPED_BY_FIRST and call.args else None
    if any(isinstance(v, Value) and not v.const and v is not typed_by
           for v in _values(list(call.args) + list(call.kwargs.values()))):
        raise call.refuse("a value computed from the node's inputs as its data")
    out = call.out.detach()
    first = one_value(out) if out.dim() > 0 else None
    like = typed_by if isinstance(typed_by, Value) and name.endswith("_like") and \
        typed_by.shape == tuple(out.shape) else None
    if first is not None:
        # zeros_like(x) takes x's shape at run time: a stacked batch stays stacked
        shape = e.shape_of(like.name) if like is not None else e.ints(out.shape)
        written = e.op("Expand", [e.tensor_const(first), shape])
    else:
        written = e.op("Identity", [e.tensor_const(out)])
    return Value(written, call.out, const=True)


def _values(obj: Any) -> list:
    """The leaves of nested argument lists, tuples and dicts."""
    if isinstance(obj, (list, tuple)):
        return [v for o in obj for v in _values(o)]
    if isinstance(obj, dict):
        return _values(list(obj.values()))
    return [obj]


for _name in ("zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones",
              "new_full", "new_empty", "new_tensor", "filled", "zeroed", "zeros", "ones",
              "full", "arange", "tensor", "eye", "linspace"):
    rule(_name)(_uniform)
