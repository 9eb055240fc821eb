"""NumPy inside traced nodes.

A traced value converted to NumPy (``t.numpy()``, ``np.asarray(t)``,
``np.array(t)``) becomes a :class:`TracedArray`: an ``np.ndarray`` subclass
viewing the memory of a *shadow*, the traced tensor that holds the same
values.  NumPy ufuncs, operators and the common array functions on traced
arrays are computed by their torch equivalents on the shadows, so the C
handler records them in the node's op log like any torch op (the exported
models are torch-only), and every result is again an array viewing its
result tensor.  Where NumPy's dtype rules differ from torch's (int / int true
division, float64 scalars, means of integers), the torch computation is cast
so the result has NumPy's dtype.  ``torch.from_numpy`` / ``torch.as_tensor``
/ ``torch.tensor`` of a traced array give back its (traced) shadow.

In-place NumPy writes (``a *= 2``, ``out=``, ``a[k] = v``, ``np.copyto``)
become in-place torch ops on the shadow, which shares the array's memory.

Arrays of finished nodes, and arrays outside a session, behave as plain
NumPy; a function with no torch mapping raises a clear error inside a
tracing node instead of silently breaking the trace.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from .. import _core
from .state import SESSION

# Captured before any session patches them.
_FROM_NUMPY = torch.from_numpy
_TENSOR = torch.tensor
_NP_ARRAY = np.array
_NP_ASARRAY = np.asarray


def enabled() -> bool:
    """True while a session with global_patching=True traces (the session's NumPy switch)."""
    return SESSION.numpy_patching and _core.is_tracing()


class UnmappedNumpyError(NotImplementedError):
    """A NumPy function without a torch equivalent was called inside a tracing node."""


# --------------------------------------------------------------------------
# The array type


class TracedArray(np.ndarray):
    """An ndarray viewing the memory of a traced tensor (its shadow).

    isinstance(a, np.ndarray) holds and the values are always the real ones;
    while the shadow's node traces, NumPy operations on the array are
    recorded as their torch equivalents.
    """

    _shadow: Any = None

    def __array_finalize__(self, obj: Any) -> None:
        # A new array object over exactly the same memory (a.view(), a
        # subclass-preserving asarray) is the same value; anything else
        # numpy made internally has no shadow and behaves as plain numpy.
        shadow = getattr(obj, "_shadow", None)
        if shadow is not None and _same_memory(self, obj):
            self._shadow = shadow
        else:
            self._shadow = None

    # ---- numpy protocols --------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Callable, types: tuple, args: tuple,
                           kwargs: dict) -> Any:
        return _array_function(func, args, kwargs)

    # ---- indexing ---------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        node = _active_node((self, key))
        if node is None:
            return _plain_array(self)[_to_plain(key)]
        result = _shadow_of(self)[_key_to_torch(key)]
        return wrap(result)

    def __setitem__(self, key: Any, value: Any) -> None:
        node = _active_node((self, key, value))
        if node is None or self._shadow is None or not _is_active(self):
            _plain_array(self)[_to_plain(key)] = _to_plain(value)
            return
        self._shadow[_key_to_torch(key)] = _value_to_torch(value, self._shadow.dtype)

    # ---- methods that numpy would otherwise run on raw memory ---------------

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe",
               subok: bool = True, copy: bool = True) -> Any:
        """The array converted to dtype; recorded as a torch dtype cast."""
        if not _is_active(self):
            return _plain_array(self).astype(dtype, order=order, casting=casting, subok=subok,
                                             copy=copy)
        target = np.dtype(dtype)
        if target == self.dtype:
            return self.copy() if copy else self
        return wrap(self._shadow.to(_torch_dtype(target, "astype")))

    def copy(self, order: str = "C") -> Any:
        """A copy of the array; recorded as a torch clone.

        A copy of a finished node's published array keeps its port, like a
        clone of the tensor would.
        """
        if _carrier(self) is None or not _core.is_tracing():
            return _plain_array(self).copy(order=order)
        return wrap(self._shadow.clone())

    def fill(self, value: Any) -> None:
        """Fill the array with value; recorded as an in-place torch fill."""
        if not _is_active(self):
            _plain_array(self).fill(value)
            return
        self._shadow.fill_(value)

    @property
    def T(self) -> Any:  # noqa: N802 - numpy's name
        """The transposed array."""
        return np.transpose(self)

    def reshape(self, *shape: Any, order: str = "C") -> Any:
        """The array with a new shape (np.reshape)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return np.reshape(self, shape, order=order)

    def transpose(self, *axes: Any) -> Any:
        """The array with its axes permuted (np.transpose)."""
        if not axes:
            return np.transpose(self)
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return np.transpose(self, axes)

    def flatten(self, order: str = "C") -> Any:
        """A flat copy of the array."""
        return np.reshape(self, (-1,), order=order).copy()

    def ravel(self, order: str = "C") -> Any:
        """The array as one dimension (np.ravel)."""
        return np.ravel(self, order=order)

    def squeeze(self, axis: Any = None) -> Any:
        """The array without length-1 axes (np.squeeze)."""
        return np.squeeze(self, axis=axis)

    def swapaxes(self, axis1: int, axis2: int) -> Any:
        """The array with two axes swapped (np.swapaxes)."""
        return np.swapaxes(self, axis1, axis2)

    def clip(self, min: Any = None, max: Any = None, **kwargs: Any) -> Any:  # noqa: A002
        """The array clipped to [min, max] (np.clip)."""
        return np.clip(self, min, max, **kwargs)

    def round(self, decimals: int = 0, out: Any = None) -> Any:
        """The array rounded (np.round)."""
        return np.round(self, decimals, out=out)

    def dot(self, other: Any, out: Any = None) -> Any:
        """The dot product with other (np.dot)."""
        return np.dot(self, other, out=out)

    def sum(self, *args: Any, **kwargs: Any) -> Any:
        return np.sum(self, *args, **kwargs)

    def prod(self, *args: Any, **kwargs: Any) -> Any:
        return np.prod(self, *args, **kwargs)

    def mean(self, *args: Any, **kwargs: Any) -> Any:
        return np.mean(self, *args, **kwargs)

    def std(self, *args: Any, **kwargs: Any) -> Any:
        return np.std(self, *args, **kwargs)

    def var(self, *args: Any, **kwargs: Any) -> Any:
        return np.var(self, *args, **kwargs)

    def max(self, *args: Any, **kwargs: Any) -> Any:
        return np.max(self, *args, **kwargs)

    def min(self, *args: Any, **kwargs: Any) -> Any:
        return np.min(self, *args, **kwargs)

    def argmax(self, *args: Any, **kwargs: Any) -> Any:
        return np.argmax(self, *args, **kwargs)

    def argmin(self, *args: Any, **kwargs: Any) -> Any:
        return np.argmin(self, *args, **kwargs)

    def all(self, *args: Any, **kwargs: Any) -> Any:
        return np.all(self, *args, **kwargs)

    def any(self, *args: Any, **kwargs: Any) -> Any:
        return np.any(self, *args, **kwargs)

    def cumsum(self, *args: Any, **kwargs: Any) -> Any:
        return np.cumsum(self, *args, **kwargs)

    def cumprod(self, *args: Any, **kwargs: Any) -> Any:
        return np.cumprod(self, *args, **kwargs)

    def sort(self, axis: int = -1, kind: Any = None, order: Any = None) -> None:
        """Sort in place; recorded as a sort written back into the shadow."""
        if not _is_active(self):
            _plain_array(self).sort(axis=axis, kind=kind, order=order)
            return
        self._shadow.copy_(torch.sort(self._shadow, dim=axis).values)

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickles as the plain array
        return _plain_array(self).__reduce_ex__(protocol)


for _name in ("sum", "prod", "mean", "std", "var", "max", "min", "argmax", "argmin", "all",
              "any", "cumsum", "cumprod"):
    getattr(TracedArray, _name).__doc__ = f"np.{_name} of the array (recorded while tracing)."
del _name


# --------------------------------------------------------------------------
# Creation and conversion


def _same_memory(a: Any, b: Any) -> bool:
    try:
        ia, ib = a.__array_interface__, b.__array_interface__
    except AttributeError:
        return False
    return (ia["data"][0] == ib["data"][0] and ia["shape"] == ib["shape"]
            and ia["strides"] == ib["strides"] and ia["typestr"] == ib["typestr"])


def _plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """A torch.Tensor over t's memory whose ops are not recorded (leapp.tracing.traced.plain;
    _traced imports this module for TracedTensor's NumPy protocol, so not the reverse)."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def _plain_array(a: Any) -> np.ndarray:
    """a as a plain ndarray over the same memory."""
    return a.view(np.ndarray) if isinstance(a, TracedArray) else a


def wrap(tensor: torch.Tensor) -> Any:
    """A TracedArray viewing tensor's memory, with tensor as its shadow."""
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()  # numpy lives on the host; the copy is recorded
    base = _plain_tensor(tensor).detach()
    try:
        array = base.numpy()
    except TypeError as exc:
        raise TypeError(f"cannot view a traced {tensor.dtype} tensor as a NumPy array: {exc}. "
                        f"Convert it with .to(torch.float32) first.") from exc
    array = array.view(TracedArray)
    array._shadow = tensor
    return array


def to_numpy(tensor: torch.Tensor, force: bool = False) -> np.ndarray:
    """t.numpy() of a traced tensor: a TracedArray while global patching traces."""
    if enabled() and _core.carrier_of(tensor) is not None:
        return wrap(tensor)
    return _plain_tensor(tensor).numpy(force=force)


def _carrier(a: Any) -> Any:
    shadow = getattr(a, "_shadow", None)
    return _core.carrier_of(shadow) if shadow is not None else None


def _is_active(a: Any) -> bool:
    carrier = _carrier(a)
    return carrier is not None and bool(carrier.active)


def shadow_of(value: Any) -> Any:
    """The traced tensor behind a TracedArray (value itself otherwise)."""
    if isinstance(value, TracedArray) and value._shadow is not None:
        return value._shadow
    return value


def _shadow_of(a: TracedArray) -> torch.Tensor:
    if a._shadow is not None:
        return a._shadow
    return _constant(a)


def _active_node(obj: Any) -> Any:
    """The tracing node of the first active TracedArray or TracedTensor in obj."""
    if isinstance(obj, TracedArray):
        carrier = _carrier(obj)
        return carrier.node if carrier is not None and carrier.active else None
    carrier = _core.carrier_of(obj)  # a carrier only on a TracedTensor
    if carrier is not None:
        return carrier.node if carrier.active else None
    if isinstance(obj, (list, tuple)):
        for item in obj:
            node = _active_node(item)
            if node is not None:
                return node
    elif isinstance(obj, dict):
        return _active_node(tuple(obj.values()))
    return None


def _to_plain(obj: Any) -> Any:
    """obj with every TracedArray as a plain ndarray over the same memory."""
    if isinstance(obj, TracedArray):
        return obj.view(np.ndarray)
    if type(obj) is tuple:
        return tuple(_to_plain(o) for o in obj)
    if type(obj) is list:
        return [_to_plain(o) for o in obj]
    if type(obj) is dict:
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def _constant(array: np.ndarray) -> torch.Tensor:
    """A plain array as a constant tensor (a private copy, so later writes don't leak)."""
    return _FROM_NUMPY(_NP_ARRAY(_plain_array(array), copy=True))


def _to_torch(obj: Any) -> Any:
    """obj with arrays as tensors: shadows, or constants for plain arrays."""
    if isinstance(obj, TracedArray) and obj._shadow is not None:
        return obj._shadow
    if isinstance(obj, np.ndarray):
        return _constant(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj) is tuple:
        return tuple(_to_torch(o) for o in obj)
    if type(obj) is list:
        return [_to_torch(o) for o in obj]
    return obj


def _key_to_torch(key: Any) -> Any:
    """An index key for the shadow: arrays become (index) tensors."""
    if isinstance(key, tuple):
        return tuple(_key_to_torch(k) for k in key)
    if isinstance(key, (np.ndarray, list)) and not isinstance(key, TracedArray):
        return _FROM_NUMPY(_NP_ARRAY(key))
    if isinstance(key, np.integer):
        return int(key)
    return _to_torch(key)


def _value_to_torch(value: Any, dtype: torch.dtype) -> Any:
    value = _to_torch(value)
    if not isinstance(value, torch.Tensor):
        return _TENSOR(value, dtype=dtype)
    return value


_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype, what: str) -> torch.dtype:
    found = _DTYPES.get(dtype)
    if found is None:
        try:
            found = _FROM_NUMPY(np.empty(0, dtype=dtype)).dtype
        except TypeError:
            raise UnmappedNumpyError(f"{what}: NumPy dtype {dtype} has no torch equivalent, "
                                     f"so it cannot be traced.") from None
        _DTYPES[dtype] = found
    return found


def _scalar_tensor(value: Any) -> Any:
    """A Python scalar as a 0-d tensor (torch wants a tensor in first position)."""
    if isinstance(value, bool):
        return _TENSOR(value)
    if isinstance(value, int):
        return _TENSOR(value, dtype=torch.int64)
    if isinstance(value, float):
        return _TENSOR(value, dtype=torch.float64)
    if isinstance(value, complex):
        return _TENSOR(value, dtype=torch.complex128)
    return value


def _unmapped(what: str, node: _core.Node) -> UnmappedNumpyError:
    return UnmappedNumpyError(
        f"{what} has no torch equivalent in leapp's NumPy tracing, so it cannot be recorded "
        f"in node '{node.name}'. Compute it with torch on the traced tensor instead (convert "
        f"with torch.from_numpy(), or do the work before .numpy()).")


# --------------------------------------------------------------------------
# ufuncs


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


def _as_result(tensor: torch.Tensor, reference: Any, what: str) -> Any:
    """tensor with the reference result's dtype, as a TracedArray."""
    if not isinstance(tensor, torch.Tensor):
        return reference
    if isinstance(reference, (np.ndarray, np.generic)):
        want = _torch_dtype(reference.dtype, what)
        if tensor.dtype != want:
            tensor = tensor.to(want)
        if tuple(tensor.shape) != tuple(np.shape(reference)):
            raise RuntimeError(f"leapp: the torch equivalent of {what} gave shape "
                               f"{list(tensor.shape)} where NumPy gives "
                               f"{list(np.shape(reference))}; compute it with torch instead.")
    return wrap(tensor)


def _array_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    out = kwargs.get("out")
    node = _active_node((inputs, out))
    plain_kwargs = _to_plain(kwargs)
    if node is None:
        return getattr(ufunc, method)(*_to_plain(inputs), **plain_kwargs)
    what = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    outs = out if isinstance(out, tuple) else ((out,) if out is not None else ())
    extra = sorted(set(kwargs) - {"out", "dtype", "casting"} - (
        {"axis", "keepdims"} if method == "reduce" else set()))
    if extra or any(o is not None and not isinstance(o, TracedArray) for o in outs):
        raise _unmapped(f"{what}(..., {', '.join(extra) or 'out=<plain array>'}=...)", node)
    # NumPy's own result, computed on the plain values, gives the dtype (and
    # raises NumPy's errors for invalid casts); the values come from torch.
    ref_kwargs = dict(plain_kwargs)
    if outs:
        ref_kwargs["out"] = tuple(_NP_ARRAY(_plain_array(o), copy=True) for o in outs)
    reference = getattr(ufunc, method)(*_to_plain(inputs), **ref_kwargs)
    if outs:
        reference = ref_kwargs["out"][0] if len(outs) == 1 else ref_kwargs["out"]
    targs = [_to_torch(i) for i in inputs]
    if method == "__call__":
        fn = _UFUNCS.get(ufunc)
        if fn is None or ufunc.nout != 1:
            raise _unmapped(what, node)
        if ufunc not in _NO_INPUT_CAST and isinstance(reference, (np.ndarray, np.generic)):
            want = _torch_dtype(reference.dtype, what)
            if want.is_floating_point or want.is_complex:
                targs = _cast_inputs(targs, want)
        if not isinstance(targs[0], torch.Tensor) or fn in (
                torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.atan2,
                torch.hypot, torch.copysign, torch.logaddexp, torch.logaddexp2,
                torch.heaviside):
            targs = [_scalar_tensor(t) for t in targs]
        try:
            result = fn(*targs)
        except TypeError as exc:  # operands torch does not take (None, strings, ...)
            raise _unmapped(f"{what} with these operands ({exc})", node) from exc
    elif method == "reduce" and ufunc in _REDUCTIONS:
        result = _reduce(_REDUCTIONS[ufunc], targs[0], kwargs.get("axis", 0),
                         bool(kwargs.get("keepdims", False)))
    else:
        raise _unmapped(what, node)
    if not outs:
        return _as_result(result, reference, what)
    target = outs[0]
    if target._shadow is None or not _is_active(target):
        raise _unmapped(f"{what}(out=<array not traced by node '{node.name}'>)", node)
    target._shadow.copy_(result)
    return target


def _tensor_of_result(result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_tensor_of_result(r) for r in result)
    if isinstance(result, TracedArray) and result._shadow is not None:
        return result._shadow
    if isinstance(result, (np.ndarray, np.generic)):
        array = _NP_ASARRAY(result)
        if array.dtype == np.bool_:  # what torch.Tensor.__array_wrap__ does
            array = array.astype(np.uint8)
        return _FROM_NUMPY(array)
    return result


def tensor_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    """A NumPy ufunc called on traced tensors (np.tanh(t)).

    While global patching traces and an input belongs to a tracing node, the
    ufunc is recorded through its torch equivalent and gives a traced tensor;
    otherwise it runs on the values and gives a tensor, as for a plain one.
    """
    if enabled() and "out" not in kwargs and _active_node(inputs) is not None:
        arrays = tuple(wrap(i) if _core.carrier_of(i) is not None
                       else i for i in inputs)
        return _tensor_of_result(_array_ufunc(ufunc, method, arrays, kwargs))
    values = tuple(_plain_tensor(i).detach().numpy() if isinstance(i, torch.Tensor) else _to_plain(i)
                   for i in inputs)
    return _tensor_of_result(getattr(ufunc, method)(*values, **_to_plain(kwargs)))


def _reduce(fn: Callable, t: torch.Tensor, axis: Any, keepdims: bool) -> torch.Tensor:
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


# --------------------------------------------------------------------------
# array functions


def _axis(axis: Any, t: torch.Tensor) -> Any:
    if axis is None:
        return tuple(range(t.dim()))
    return tuple(axis) if isinstance(axis, list) else axis


def _reduction(fn: Callable) -> Callable:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: bool = False, **kwargs: Any) -> torch.Tensor:
        if dtype is not None:
            a = a.to(_torch_dtype(np.dtype(dtype), "dtype="))
        return _reduce(fn, a, axis, bool(keepdims))
    return impl


def _mean(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: bool = False, **kwargs: Any) -> torch.Tensor:
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        a = a.to(torch.float64)
    if dtype is not None:
        a = a.to(_torch_dtype(np.dtype(dtype), "dtype="))
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
            a = a.to(_torch_dtype(np.dtype(dtype), "dtype="))
        return fn(a, dim=axis)
    return impl


def _as_tensors(seq: Any) -> list:
    return [t if isinstance(t, torch.Tensor) else _TENSOR(t) for t in seq]


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
        condition = _TENSOR(condition)
    if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
        x = _scalar_tensor(x)
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
            kwargs["dtype"] = _torch_dtype(np.dtype(dtype), "dtype=")
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
    node = _active_node((args, kwargs))
    if node is None:
        if func is np.copy and len(args) == 1 and not kwargs and isinstance(args[0], TracedArray):
            return args[0].copy()  # keeps a published port
        return func(*_to_plain(args), **_to_plain(kwargs))
    module = getattr(func, "__module__", None) or "numpy"
    what = f"{module if module.startswith('numpy') else 'numpy'}.{getattr(func, '__name__', func)}"
    impl = _FUNCTIONS.get(func)
    if impl is None and func is not np.copyto:
        # Like size() or item() on a tensor: a function giving plain Python
        # values (np.shape, np.allclose, ...) runs as is and is not recorded.
        reference = func(*_to_plain(args), **_to_plain(kwargs))
        if not _holds_array(reference):
            return reference
        raise _unmapped(what, node)
    if kwargs.get("out") is not None:
        raise _unmapped(what + "(out=...)", node)
    refused = sorted(k for k in ("where", "initial", "like") if k in kwargs)
    if refused:
        raise _unmapped(f"{what}({', '.join(k + '=...' for k in refused)})", node)
    if func is np.copyto:
        dst, src = args[0] if args else kwargs["dst"], args[1] if len(args) > 1 else kwargs["src"]
        func(_NP_ARRAY(_plain_array(dst), copy=True), *_to_plain(args[1:]),
             **_to_plain(kwargs))  # NumPy's casting checks
        if not isinstance(dst, TracedArray) or not _is_active(dst) or len(args) > 2 or (
                set(kwargs) - {"casting"}):
            raise _unmapped(what + " into an array that is not traced by this node", node)
        dst._shadow.copy_(_value_to_torch(src, dst._shadow.dtype).expand(dst._shadow.shape))
        return None
    reference = func(*_to_plain(args), **_to_plain(kwargs))
    targs = _to_torch(args)
    tkwargs = {k: _to_torch(v) for k, v in kwargs.items()}
    try:
        result = impl(*targs, **tkwargs)
    except (NotImplementedError, TypeError) as exc:
        raise _unmapped(f"{what} with these arguments ({exc})", node) from exc
    if isinstance(result, tuple):
        return tuple(_as_result(r, ref, what) for r, ref in zip(result, reference))
    return _as_result(result, reference, what)


# --------------------------------------------------------------------------
# Session patches (installed by leapp.tracing.patching.Patcher under global_patching)


def _to_tensor(array: TracedArray, dtype: Any = None, device: Any = None) -> torch.Tensor:
    """The traced tensor of a traced array (a recorded conversion if asked for)."""
    tensor = array._shadow
    if dtype is not None or device is not None:
        tensor = tensor.to(device=device, dtype=dtype)
    return tensor


def _traced_array(data: Any) -> bool:
    return isinstance(data, TracedArray) and data._shadow is not None


def _from_numpy(original: Callable) -> Callable:
    @functools.wraps(original)
    def from_numpy(ndarray: Any) -> torch.Tensor:
        if _traced_array(ndarray):
            return _to_tensor(ndarray)
        return original(ndarray)
    return from_numpy


def _as_tensor(original: Callable) -> Callable:
    @functools.wraps(original)
    def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> torch.Tensor:
        if _traced_array(data):
            return _to_tensor(data, dtype, device)
        return original(data, dtype=dtype, device=device)
    return as_tensor


def _tensor(original: Callable) -> Callable:
    @functools.wraps(original)
    def tensor(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        source = data._shadow if _traced_array(data) else data
        if not (isinstance(source, torch.Tensor) and _core.carrier_of(source) is not None
                and not args and set(kwargs) <= {"dtype", "device", "requires_grad"}
                and not kwargs.get("requires_grad")):
            return original(_plain_array(data) if isinstance(data, TracedArray) else data,
                            *args, **kwargs)
        result = source.detach().clone()
        if kwargs.get("dtype") is not None or kwargs.get("device") is not None:
            result = result.to(device=kwargs.get("device"), dtype=kwargs.get("dtype"))
        return result
    return tensor


def _np_array(original: Callable, copy_default: Any) -> Callable:
    @functools.wraps(original)
    def array(obj: Any, *args: Any, **kwargs: Any) -> Any:
        traced = _core.carrier_of(obj) is not None
        if not traced and not _traced_array(obj):
            return original(obj, *args, **kwargs)
        if set(kwargs) - {"dtype", "copy", "order"} or len(args) > 1:
            return original(obj, *args, **kwargs)
        dtype = args[0] if args else kwargs.get("dtype")
        copy = kwargs.get("copy", copy_default)
        result = wrap(obj) if traced else obj
        if dtype is not None and np.dtype(dtype) != result.dtype:
            if copy is False:
                raise ValueError(f"Unable to avoid copy while creating an array with dtype "
                                 f"{np.dtype(dtype)} from array with dtype {result.dtype}.")
            return result.astype(dtype)
        if copy:
            return result.copy()
        return result
    return array


def patches() -> list[tuple[Any, str, Callable]]:
    """(owner, name, replacement) for every function global patching replaces."""
    return [
        (torch, "from_numpy", _from_numpy(torch.from_numpy)),
        (torch, "as_tensor", _as_tensor(torch.as_tensor)),
        (torch, "tensor", _tensor(torch.tensor)),
        (np, "array", _np_array(np.array, True)),
        (np, "asarray", _np_array(np.asarray, None)),
        (np, "asanyarray", _np_array(np.asanyarray, None)),
    ]


def as_payload_tensor(value: Any) -> Any:
    """A payload leaf as annotations see it: arrays as tensors, the rest unchanged."""
    if isinstance(value, TracedArray) and value._shadow is not None:
        return value._shadow
    if isinstance(value, np.ndarray):
        array = value.view(np.ndarray)
        if not array.flags.writeable or not array.dtype.isnative:
            array = _NP_ARRAY(array, copy=True)
        return _FROM_NUMPY(array)
    return value

