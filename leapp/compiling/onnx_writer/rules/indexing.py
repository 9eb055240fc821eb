"""x[key] with tensor indices computed from the node's inputs, as eager indexes.

Eager first applies the basic parts of the key one by one (an int or a 0-dim
integer tensor selects its dim away, a slice slices, None inserts a dim, a boolean
mask becomes the index tensors of its True positions) and then indexes the
remaining dims with the tensor indices at once: they broadcast together, and their
result dims replace the indexed dims in place when those dims are adjacent, or go
to the front when anything separates them.  Negative values inside an index tensor
count from the end of their dim.  Written with static shapes: Slice, Gather,
Unsqueeze for the basic parts; for several tensor indices one Gather of a linear
position (sum of index * stride) on the indexed dims moved to the front and
flattened.  A boolean mask computed from the inputs has a data-dependent result
shape and is refused.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..emit import Call, Value

_INDEX_DTYPES = (torch.int64, torch.int32)
_MASK_DTYPES = (torch.bool, torch.uint8)


def _as_int64(call: Call, index: Value) -> str:
    return call.e.cast(index.name, index.dtype, torch.int64)


def _constant(item: Any) -> torch.Tensor | None:
    """A key item known at write time as a tensor (folded tensors, Python lists)."""
    if isinstance(item, Value) and item.const:
        return item.example
    if isinstance(item, torch.Tensor):
        return item
    if isinstance(item, (list, tuple)):
        if any(isinstance(v, (Value, torch.Tensor, slice)) or v is None or v is Ellipsis
               for v in item):
            return None
        return torch.tensor(item)
    return None


def _wrapped(call: Call, index: Any, size: int) -> str:
    """An index tensor as int64 with its negative values counted from the end."""
    e = call.e
    if isinstance(index, torch.Tensor):
        return e.tensor_const(torch.where(index < 0, index + size, index).to(torch.int64))
    name = _as_int64(call, index)
    negative = e.op("Less", [name, e.scalar_int(0)])
    return e.op("Where", [negative, e.op("Add", [name, e.scalar_int(size)]), name])


def advanced(call: Call, x: Value, items: list, zero_dim_selects: bool = True) -> str:
    """x indexed by items (the key with its Ellipsis expanded); refuses what it cannot
    write with static shapes.  A 0-dim integer tensor selects, as Python's x[...] does
    (zero_dim_selects); aten.index broadcasts it with the other indices instead, which
    moves them to the front when a slice separates them."""
    e = call.e
    name, shape = x.name, list(x.shape)
    dim = 0
    indices: list[tuple[int, Any]] = []  # (dim of the basic result, Value or constant)
    for item in items:
        if item is None:
            name = e.unsqueeze(name, [dim])
            shape.insert(dim, 1)
            dim += 1
            continue
        if isinstance(item, slice):
            if any(isinstance(v, (Value, torch.Tensor)) for v in (item.start, item.stop,
                                                                    item.step)):
                raise call.refuse("a slice with tensor bounds")
            start, stop, step = item.indices(shape[dim])
            if step <= 0:
                raise call.refuse("a slice with a step below 1")
            length = len(range(start, stop, step))
            if length != shape[dim]:
                name = e.slice(name, [start], [stop], [dim], [step])
                shape[dim] = length
            dim += 1
            continue
        if isinstance(item, bool):
            raise call.refuse("a Python bool in the key")
        if isinstance(item, int):
            if not -shape[dim] <= item < shape[dim]:
                raise call.refuse(f"index {item} out of range for a dim of {shape[dim]}")
            name = e.op("Gather", [name, e.scalar_int(item)], axis=dim)
            shape.pop(dim)
            continue
        constant = _constant(item)
        index = constant if constant is not None else item
        if not isinstance(index, (Value, torch.Tensor)):
            raise call.refuse(f"a key item of type {type(item).__name__}")
        if index.dtype in _MASK_DTYPES:
            if constant is None:
                raise call.refuse("a boolean mask computed from the inputs (its result shape "
                                  "is data-dependent)")
            mask = constant.bool()
            if mask.dim() == 0 or tuple(mask.shape) != tuple(shape[dim:dim + mask.dim()]):
                raise call.refuse(f"a mask of shape {tuple(mask.shape)}")
            for k, positions in enumerate(mask.nonzero().unbind(1)):
                indices.append((dim + k, positions))
            dim += mask.dim()
            continue
        if index.dtype not in _INDEX_DTYPES:
            raise call.refuse(f"an index of dtype {index.dtype}")
        if zero_dim_selects and (index.dim() if isinstance(index, torch.Tensor)
                                 else index.rank) == 0:
            # a 0-dim integer tensor selects, as an int would (its dim goes away)
            picked = e.tensor_const(index.to(torch.int64)) if isinstance(index, torch.Tensor) \
                else _as_int64(call, index)
            name = e.op("Gather", [name, picked], axis=dim)
            shape.pop(dim)
            continue
        indices.append((dim, index))
        dim += 1
    if not indices:
        result, result_shape = name, shape
    elif len(indices) == 1:
        at, index = indices[0]
        # (Gather counts a negative index from the end)
        gathered = _wrapped(call, index, shape[at]) if isinstance(index, torch.Tensor) \
            else _as_int64(call, index)
        result = e.op("Gather", [name, gathered], axis=at)
        result_shape = shape[:at] + list(index.shape) + shape[at + 1:]
    else:
        result, result_shape = _several(call, name, shape, indices)
    if tuple(result_shape) != tuple(call.out.shape):
        raise call.refuse(f"a key whose result shape {tuple(result_shape)} is not eager's "
                          f"{tuple(call.out.shape)}")
    if result == x.name:
        result = e.op("Identity", [result])
    return result


def _several(call: Call, name: str, shape: list[int], indices: list) -> tuple[str, list]:
    """Several index tensors: the indexed dims moved to the front and flattened, one
    Gather of the linear position; the broadcast result dims back in place when the
    indexed dims were adjacent."""
    e = call.e
    dims = [d for d, _ in indices]
    rest = [d for d in range(len(shape)) if d not in dims]
    perm = dims + rest
    if perm != list(range(len(shape))):
        name = e.op("Transpose", [name], perm=perm)
    sizes = [shape[d] for d in dims]
    rest_sizes = [shape[d] for d in rest]
    flat = e.reshape(name, (math.prod(sizes), *rest_sizes))
    stride = math.prod(sizes)
    linear = None
    for (_, index), size in zip(indices, sizes):
        stride //= size
        term = _wrapped(call, index, size)
        if stride != 1:
            term = e.op("Mul", [term, e.scalar_int(stride)])
        linear = term if linear is None else e.op("Add", [linear, term])
    broadcast = list(torch.broadcast_shapes(*(tuple(index.shape) for _, index in indices)))
    result = e.op("Gather", [flat, linear], axis=0)
    nb, first = len(broadcast), dims[0]
    adjacent = dims == list(range(first, first + len(dims)))
    if not adjacent or first == 0:
        return result, broadcast + rest_sizes
    back = list(range(nb, nb + first)) + list(range(nb)) + list(range(nb + first,
                                                                      nb + len(rest)))
    result = e.op("Transpose", [result], perm=back)
    return result, rest_sizes[:first] + broadcast + rest_sizes[first:]
