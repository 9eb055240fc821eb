"""NumPy ufuncs on traced arrays, computed by their torch equivalents (NumPy's dtypes kept)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from .. import _core
from .numpy_array import (FROM_NUMPY, NP_ARRAY, NP_ASARRAY, PROTOCOL, TracedArray, active_node,
                          enabled, is_active, plain_array, plain_tensor, scalar_tensor,
                          to_plain, to_torch, torch_dtype, unmapped, wrap)



def _umath_clip() -> Any:
    """NumPy's ``clip`` ufunc (``np.clip`` is a Python function that calls it).

    Imported by module path: NumPy 2 keeps it in ``numpy._core.umath``; NumPy
    1.26 ships ``numpy._core`` as a stub package whose ``umath`` submodule is
    only there once imported (and forwards to ``numpy.core.umath``).
    """
    import importlib

    for name in ("numpy._core.umath", "numpy.core.umath"):
        try:
            clip = getattr(importlib.import_module(name), "clip", None)
        except ImportError:
            continue
        if isinstance(clip, np.ufunc):
            return clip
    return None


def _ufunc_table() -> dict:
    table = {
        np.add: torch.add, np.subtract: torch.sub, np.multiply: torch.mul,
        np.divide: torch.div, np.floor_divide: torch.floor_divide, np.power: torch.pow,
        np.float_power: torch.pow, np.negative: torch.neg, np.positive: torch.positive,
        np.remainder: torch.remainder, np.fmod: torch.fmod, np.absolute: torch.abs,
        np.fabs: torch.abs, np.sign: torch.sign, np.sqrt: torch.sqrt,
        np.square: torch.square, np.reciprocal: torch.reciprocal, np.exp: torch.exp,
        np.exp2: torch.exp2, np.expm1: torch.expm1, np.log: torch.log, np.log2: torch.log2,
        np.log10: torch.log10, np.log1p: torch.log1p, np.sin: torch.sin, np.cos: torch.cos,
        np.tan: torch.tan, np.arcsin: torch.asin, np.arccos: torch.acos,
        np.arctan: torch.atan, np.arctan2: torch.atan2, np.hypot: torch.hypot,
        np.sinh: torch.sinh, np.cosh: torch.cosh, np.tanh: torch.tanh,
        np.arcsinh: torch.asinh, np.arccosh: torch.acosh, np.arctanh: torch.atanh,
        np.deg2rad: torch.deg2rad, np.rad2deg: torch.rad2deg, np.floor: torch.floor,
        np.ceil: torch.ceil, np.trunc: torch.trunc, np.rint: torch.round,
        np.greater: torch.gt, np.greater_equal: torch.ge, np.less: torch.lt,
        np.less_equal: torch.le, np.equal: torch.eq, np.not_equal: torch.ne,
        np.maximum: torch.maximum, np.minimum: torch.minimum, np.fmax: torch.fmax,
        np.fmin: torch.fmin, np.matmul: torch.matmul, np.logical_and: torch.logical_and,
        np.logical_or: torch.logical_or, np.logical_xor: torch.logical_xor,
        np.logical_not: torch.logical_not, np.bitwise_and: torch.bitwise_and,
        np.bitwise_or: torch.bitwise_or, np.bitwise_xor: torch.bitwise_xor,
        np.invert: torch.bitwise_not, np.left_shift: torch.bitwise_left_shift,
        np.right_shift: torch.bitwise_right_shift, np.isnan: torch.isnan,
        np.isinf: torch.isinf, np.isfinite: torch.isfinite, np.signbit: torch.signbit,
        np.copysign: torch.copysign, np.logaddexp: torch.logaddexp,
        np.logaddexp2: torch.logaddexp2, np.heaviside: torch.heaviside,
    }
    clip = _umath_clip()
    if clip is not None:
        table[clip] = torch.clamp
    return table


_UFUNCS = _ufunc_table()
# ufunc.reduce -> a torch reduction taking (input, dim, keepdim).
_REDUCTIONS = {
    np.add: torch.sum, np.multiply: torch.prod, np.maximum: torch.amax,
    np.minimum: torch.amin, np.logical_and: torch.all, np.logical_or: torch.any,
}
# ufuncs whose result dtype is the dtype the inputs are computed in.
_NO_INPUT_CAST = {np.greater, np.greater_equal, np.less, np.less_equal, np.equal,
                  np.not_equal, np.logical_and, np.logical_or, np.logical_xor,
                  np.logical_not, np.isnan, np.isinf, np.isfinite, np.signbit,
                  np.left_shift, np.right_shift}


def _needs_cast(t: Any, dtype: torch.dtype) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype != dtype and t.dtype != torch.bool


def _cast_inputs(inputs: list, dtype: torch.dtype) -> list:
    """Tensor inputs computed in dtype, as NumPy's loop for that dtype would."""
    return [t.to(dtype) if _needs_cast(t, dtype) else t for t in inputs]


def as_result(tensor: torch.Tensor, reference: Any, what: str) -> Any:
    """tensor with the reference result's dtype, as a TracedArray."""
    if not isinstance(tensor, torch.Tensor):
        return reference
    if isinstance(reference, (np.ndarray, np.generic)):
        want = torch_dtype(reference.dtype, what)
        if tensor.dtype != want:
            tensor = tensor.to(want)
        if tuple(tensor.shape) != tuple(np.shape(reference)):
            raise RuntimeError(f"leapp: the torch equivalent of {what} gave shape "
                               f"{list(tensor.shape)} where NumPy gives "
                               f"{list(np.shape(reference))}; compute it with torch instead.")
    return wrap(tensor)


def _array_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    out = kwargs.get("out")
    node = active_node((inputs, out))
    plain_kwargs = to_plain(kwargs)
    if node is None:
        return getattr(ufunc, method)(*to_plain(inputs), **plain_kwargs)
    what = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    outs = out if isinstance(out, tuple) else ((out,) if out is not None else ())
    extra = sorted(set(kwargs) - {"out", "dtype", "casting"} - (
        {"axis", "keepdims"} if method == "reduce" else set()))
    if extra or any(o is not None and not isinstance(o, TracedArray) for o in outs):
        raise unmapped(f"{what}(..., {', '.join(extra) or 'out=<plain array>'}=...)", node)
    # NumPy's own result, computed on the plain values, gives the dtype (and
    # raises NumPy's errors for invalid casts); the values come from torch.
    ref_kwargs = dict(plain_kwargs)
    if outs:
        ref_kwargs["out"] = tuple(NP_ARRAY(plain_array(o), copy=True) for o in outs)
    reference = getattr(ufunc, method)(*to_plain(inputs), **ref_kwargs)
    if outs:
        reference = ref_kwargs["out"][0] if len(outs) == 1 else ref_kwargs["out"]
    targs = [to_torch(i) for i in inputs]
    if method == "__call__":
        fn = _UFUNCS.get(ufunc)
        if fn is None or ufunc.nout != 1:
            raise unmapped(what, node)
        if ufunc not in _NO_INPUT_CAST and isinstance(reference, (np.ndarray, np.generic)):
            want = torch_dtype(reference.dtype, what)
            if want.is_floating_point or want.is_complex:
                targs = _cast_inputs(targs, want)
        if not isinstance(targs[0], torch.Tensor) or fn in (
                torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.atan2,
                torch.hypot, torch.copysign, torch.logaddexp, torch.logaddexp2,
                torch.heaviside):
            targs = [scalar_tensor(t) for t in targs]
        try:
            result = fn(*targs)
        except TypeError as exc:  # operands torch does not take (None, strings, ...)
            raise unmapped(f"{what} with these operands ({exc})", node) from exc
    elif method == "reduce" and ufunc in _REDUCTIONS:
        result = reduce_over(_REDUCTIONS[ufunc], targs[0], kwargs.get("axis", 0),
                         bool(kwargs.get("keepdims", False)))
    else:
        raise unmapped(what, node)
    if not outs:
        return as_result(result, reference, what)
    target = outs[0]
    if target._shadow is None or not is_active(target):
        raise unmapped(f"{what}(out=<array not traced by node '{node.name}'>)", node)
    target._shadow.copy_(result)
    return target


def _tensor_of_result(result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_tensor_of_result(r) for r in result)
    if isinstance(result, TracedArray) and result._shadow is not None:
        return result._shadow
    if isinstance(result, (np.ndarray, np.generic)):
        array = NP_ASARRAY(result)
        if array.dtype == np.bool_:  # what torch.Tensor.__array_wrap__ does
            array = array.astype(np.uint8)
        return FROM_NUMPY(array)
    return result


def tensor_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    """A NumPy ufunc called on traced tensors (np.tanh(t)).

    While global patching traces and an input belongs to a tracing node, the
    ufunc is recorded through its torch equivalent and gives a traced tensor;
    otherwise it runs on the values and gives a tensor, as for a plain one.
    """
    if enabled() and "out" not in kwargs and active_node(inputs) is not None:
        arrays = tuple(wrap(i) if _core.carrier_of(i) is not None
                       else i for i in inputs)
        return _tensor_of_result(_array_ufunc(ufunc, method, arrays, kwargs))
    values = tuple(plain_tensor(i).detach().numpy() if isinstance(i, torch.Tensor) else to_plain(i)
                   for i in inputs)
    return _tensor_of_result(getattr(ufunc, method)(*values, **to_plain(kwargs)))


def reduce_over(fn: Callable, t: torch.Tensor, axis: Any, keepdims: bool) -> torch.Tensor:
    if axis is None:
        axis = tuple(range(t.dim()))
    if fn in (torch.all, torch.any) and isinstance(axis, tuple):
        result = t
        for dim in sorted((a % max(t.dim(), 1) for a in axis), reverse=True):
            result = fn(result, dim=dim, keepdim=keepdims)
        return result
    if fn is torch.prod and isinstance(axis, tuple):
        result = t
        for dim in sorted((a % max(t.dim(), 1) for a in axis), reverse=True):
            result = torch.prod(result, dim=dim, keepdim=keepdims)
        return result
    return fn(t, dim=axis, keepdim=keepdims)




PROTOCOL["ufunc"] = _array_ufunc
