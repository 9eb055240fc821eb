"""NumPy array functions on traced arrays (``np.concatenate``, ``np.where``, ...) as torch ops."""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from .numpy_array import (NP_ARRAY, PROTOCOL, TENSOR, TracedArray, active_node, is_active,
                          plain_array, scalar_tensor, to_plain, to_torch, torch_dtype,
                          unmapped, value_to_torch)
from .numpy_ufuncs import as_result, reduce_over



def _axis(axis: Any, t: torch.Tensor) -> Any:
    if axis is None:
        return tuple(range(t.dim()))
    return tuple(axis) if isinstance(axis, list) else axis


def _reduction(fn: Callable) -> Callable:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: bool = False, **kwargs: Any) -> torch.Tensor:
        if dtype is not None:
            a = a.to(torch_dtype(np.dtype(dtype), "dtype="))
        return reduce_over(fn, a, axis, bool(keepdims))
    return impl


def _mean(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: bool = False, **kwargs: Any) -> torch.Tensor:
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        a = a.to(torch.float64)
    if dtype is not None:
        a = a.to(torch_dtype(np.dtype(dtype), "dtype="))
    return torch.mean(a, dim=_axis(axis, a), keepdim=bool(keepdims))


def _var_std(fn: Callable) -> Callable:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0,
             keepdims: bool = False, **kwargs: Any) -> torch.Tensor:
        if not (a.dtype.is_floating_point or a.dtype.is_complex):
            a = a.to(torch.float64)
        return fn(a, dim=_axis(axis, a), correction=ddof, keepdim=bool(keepdims))
    return impl


def _arg(fn: Callable) -> Callable:
    def impl(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False
             ) -> torch.Tensor:
        if axis is None:
            return fn(a.reshape(-1))
        return fn(a, dim=axis, keepdim=bool(keepdims))
    return impl


def _cum(fn: Callable) -> Callable:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> torch.Tensor:
        if axis is None:
            a, axis = a.reshape(-1), 0
        if dtype is not None:
            a = a.to(torch_dtype(np.dtype(dtype), "dtype="))
        return fn(a, dim=axis)
    return impl


def _as_tensors(seq: Any) -> list:
    return [t if isinstance(t, torch.Tensor) else TENSOR(t) for t in seq]


def _common(tensors: list) -> list:
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return [t.to(dtype) if t.dtype != dtype else t for t in tensors]


def _concatenate(arrays: Any, axis: Any = 0, out: Any = None, **kwargs: Any) -> torch.Tensor:
    tensors = _common(_as_tensors(arrays))
    if axis is None:
        return torch.cat([t.reshape(-1) for t in tensors])
    return torch.cat(tensors, dim=axis)


def _stack(arrays: Any, axis: int = 0, out: Any = None, **kwargs: Any) -> torch.Tensor:
    return torch.stack(_common(_as_tensors(arrays)), dim=axis)


def _vstack(tup: Any, **kwargs: Any) -> torch.Tensor:
    return torch.vstack(_common(_as_tensors(tup)))


def _hstack(tup: Any, **kwargs: Any) -> torch.Tensor:
    return torch.hstack(_common(_as_tensors(tup)))


def _reshape(a: Any, shape: Any = None, order: str = "C", **kwargs: Any) -> torch.Tensor:
    if shape is None:
        shape = kwargs.get("newshape")
    if order != "C":
        raise NotImplementedError("order")
    return torch.reshape(a, (shape,) if isinstance(shape, int) else tuple(shape))


def _ravel(a: Any, order: str = "C") -> torch.Tensor:
    if order not in ("C", "K", "A"):
        raise NotImplementedError("order")
    return torch.reshape(a, (-1,))


def _transpose(a: Any, axes: Any = None) -> torch.Tensor:
    if axes is None:
        axes = tuple(range(a.dim() - 1, -1, -1))
    return torch.permute(a, tuple(axes))


def _squeeze(a: Any, axis: Any = None) -> torch.Tensor:
    if axis is None:
        return torch.squeeze(a)
    return torch.squeeze(a, dim=tuple(axis) if isinstance(axis, (list, tuple)) else axis)


def _expand_dims(a: Any, axis: Any) -> torch.Tensor:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    ndim = a.dim() + len(axes)
    for ax in sorted(x % ndim for x in axes):
        a = torch.unsqueeze(a, ax)
    return a


def _clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None,
          **kwargs: Any) -> torch.Tensor:
    a_min = kwargs.pop("min", a_min)
    a_max = kwargs.pop("max", a_max)
    return torch.clamp(a, a_min, a_max)


def _where(condition: Any, x: Any = None, y: Any = None) -> Any:
    if x is None and y is None:
        raise NotImplementedError("where(condition)")
    if not isinstance(condition, torch.Tensor):
        condition = TENSOR(condition)
    if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
        x = scalar_tensor(x)
    return torch.where(condition.to(torch.bool), x, y)


def _round(a: Any, decimals: int = 0, out: Any = None) -> torch.Tensor:
    return torch.round(a, decimals=decimals) if decimals else torch.round(a)


def _flip(m: Any, axis: Any = None) -> torch.Tensor:
    if axis is None:
        axis = tuple(range(m.dim()))
    return torch.flip(m, (axis,) if isinstance(axis, int) else tuple(axis))


def _roll(a: Any, shift: Any, axis: Any = None) -> torch.Tensor:
    if axis is None:
        return torch.roll(a, shift)
    return torch.roll(a, shift, dims=axis)


def _dot(a: Any, b: Any, out: Any = None) -> torch.Tensor:
    a, b = _as_tensors((a, b))
    if a.dim() == 0 or b.dim() == 0:
        return torch.mul(a, b)
    if b.dim() > 2:
        return torch.tensordot(a, b, dims=([a.dim() - 1], [b.dim() - 2]))
    return torch.matmul(*_common([a, b]))


def _like(fn: Callable) -> Callable:
    def impl(a: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("order", None)
        kwargs.pop("subok", None)
        shape = kwargs.pop("shape", None)
        if shape is not None:
            raise NotImplementedError("shape")
        if dtype is not None:
            kwargs["dtype"] = torch_dtype(np.dtype(dtype), "dtype=")
        return fn(a, *args, **kwargs)
    return impl


def _copy(a: Any, order: str = "K", subok: bool = False) -> torch.Tensor:
    return torch.clone(a)


def _copyto(dst: Any, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    raise AssertionError("handled by _array_function")


def _swapaxes(a: Any, axis1: int, axis2: int) -> torch.Tensor:
    return torch.swapaxes(a, axis1, axis2)


def _moveaxis(a: Any, source: Any, destination: Any) -> torch.Tensor:
    return torch.moveaxis(a, source, destination)


def _broadcast_to(array: Any, shape: Any, subok: bool = False) -> torch.Tensor:
    return array.expand(tuple(shape) if not isinstance(shape, int) else (shape,))


def _tile(a: Any, reps: Any) -> torch.Tensor:
    return torch.tile(a, (reps,) if isinstance(reps, int) else tuple(reps))


def _repeat(a: Any, repeats: Any, axis: Any = None) -> torch.Tensor:
    if axis is None:
        a, axis = a.reshape(-1), 0
    return torch.repeat_interleave(a, repeats, dim=axis)


def _einsum(subscripts: str, *operands: Any, **kwargs: Any) -> torch.Tensor:
    if kwargs.get("out") is not None:
        raise NotImplementedError("out")
    return torch.einsum(subscripts, *_common(_as_tensors(operands)))


def _tensordot(a: Any, b: Any, axes: Any = 2) -> torch.Tensor:
    return torch.tensordot(*_common(_as_tensors((a, b))), dims=axes)


def _sort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, **kwargs: Any
          ) -> torch.Tensor:
    if axis is None:
        a, axis = a.reshape(-1), 0
    return torch.sort(a, dim=axis).values


def _argsort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, **kwargs: Any
             ) -> torch.Tensor:
    if axis is None:
        a, axis = a.reshape(-1), 0
    return torch.argsort(a, dim=axis, stable=True)


def _abs(x: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.abs(x)


def _atleast(ndim: int) -> Callable:
    def impl(*arys: Any) -> Any:
        out = []
        for a in arys:
            if ndim >= 1 and a.dim() == 0:
                a = a.reshape(1)
            if ndim >= 2 and a.dim() == 1:
                a = a.unsqueeze(0)
            out.append(a)
        return out[0] if len(out) == 1 else tuple(out)
    return impl


def _linalg_norm(x: Any, ord: Any = None, axis: Any = None,  # noqa: A002
                 keepdims: bool = False) -> torch.Tensor:
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        x = x.to(torch.float64)
    if ord is None and axis is None:
        return torch.linalg.vector_norm(x.reshape(-1), keepdim=False) if not keepdims else \
            torch.linalg.vector_norm(x, dim=tuple(range(x.dim())), keepdim=True)
    if isinstance(axis, int) or (axis is None and x.dim() == 1):
        return torch.linalg.vector_norm(x, ord=2 if ord is None else ord,
                                        dim=axis if axis is not None else 0, keepdim=keepdims)
    return torch.linalg.norm(x, ord=ord, dim=axis, keepdim=keepdims)


def _isclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> torch.Tensor:
    a, b = _as_tensors((a, b))
    return torch.isclose(*_common([a, b]), rtol=rtol, atol=atol, equal_nan=equal_nan)


_FUNCTIONS: dict[Callable, Callable] = {
    np.sum: _reduction(torch.sum), np.prod: _reduction(torch.prod),
    np.max: _reduction(torch.amax), np.amax: _reduction(torch.amax),
    np.min: _reduction(torch.amin), np.amin: _reduction(torch.amin),
    np.all: _reduction(torch.all), np.any: _reduction(torch.any),
    np.mean: _mean, np.std: _var_std(torch.std), np.var: _var_std(torch.var),
    np.argmax: _arg(torch.argmax), np.argmin: _arg(torch.argmin),
    np.cumsum: _cum(torch.cumsum), np.cumprod: _cum(torch.cumprod),
    np.concatenate: _concatenate, np.stack: _stack, np.vstack: _vstack,
    np.hstack: _hstack, np.reshape: _reshape, np.ravel: _ravel, np.transpose: _transpose,
    np.squeeze: _squeeze, np.expand_dims: _expand_dims, np.clip: _clip, np.where: _where,
    np.round: _round, np.around: _round, np.flip: _flip, np.roll: _roll, np.dot: _dot,
    np.zeros_like: _like(torch.zeros_like), np.ones_like: _like(torch.ones_like),
    np.full_like: _like(torch.full_like), np.empty_like: _like(torch.zeros_like),
    np.copy: _copy, np.copyto: _copyto, np.swapaxes: _swapaxes, np.moveaxis: _moveaxis,
    np.broadcast_to: _broadcast_to, np.tile: _tile, np.repeat: _repeat,
    np.einsum: _einsum, np.tensordot: _tensordot, np.sort: _sort, np.argsort: _argsort,
    np.abs: _abs, np.absolute: _abs, np.atleast_1d: _atleast(1),
    np.atleast_2d: _atleast(2), np.linalg.norm: _linalg_norm, np.isclose: _isclose,
}


def _holds_array(obj: Any) -> bool:
    if isinstance(obj, (np.ndarray, np.generic)):
        return True
    if isinstance(obj, (tuple, list)):
        return any(_holds_array(o) for o in obj)
    return False


def _array_function(func: Callable, args: tuple, kwargs: dict) -> Any:
    node = active_node((args, kwargs))
    if node is None:
        if func is np.copy and len(args) == 1 and not kwargs and isinstance(args[0], TracedArray):
            return args[0].copy()  # keeps a published port
        return func(*to_plain(args), **to_plain(kwargs))
    module = getattr(func, "__module__", None) or "numpy"
    what = f"{module if module.startswith('numpy') else 'numpy'}.{getattr(func, '__name__', func)}"
    impl = _FUNCTIONS.get(func)
    if impl is None and func is not np.copyto:
        # Like size() or item() on a tensor: a function giving plain Python
        # values (np.shape, np.allclose, ...) runs as is and is not recorded.
        reference = func(*to_plain(args), **to_plain(kwargs))
        if not _holds_array(reference):
            return reference
        raise unmapped(what, node)
    if kwargs.get("out") is not None:
        raise unmapped(what + "(out=...)", node)
    refused = sorted(k for k in ("where", "initial", "like") if k in kwargs)
    if refused:
        raise unmapped(f"{what}({', '.join(k + '=...' for k in refused)})", node)
    if func is np.copyto:
        dst, src = args[0] if args else kwargs["dst"], args[1] if len(args) > 1 else kwargs["src"]
        func(NP_ARRAY(plain_array(dst), copy=True), *to_plain(args[1:]),
             **to_plain(kwargs))  # NumPy's casting checks
        if not isinstance(dst, TracedArray) or not is_active(dst) or len(args) > 2 or (
                set(kwargs) - {"casting"}):
            raise unmapped(what + " into an array that is not traced by this node", node)
        dst._shadow.copy_(value_to_torch(src, dst._shadow.dtype).expand(dst._shadow.shape))
        return None
    reference = func(*to_plain(args), **to_plain(kwargs))
    targs = to_torch(args)
    tkwargs = {k: to_torch(v) for k, v in kwargs.items()}
    try:
        result = impl(*targs, **tkwargs)
    except (NotImplementedError, TypeError) as exc:
        raise unmapped(f"{what} with these arguments ({exc})", node) from exc
    if isinstance(result, tuple):
        return tuple(as_result(r, ref, what) for r, ref in zip(result, reference))
    return as_result(result, reference, what)




PROTOCOL["function"] = _array_function
