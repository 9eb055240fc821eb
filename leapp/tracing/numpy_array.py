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

from typing import Any, Callable

import numpy as np
import torch

from .. import _core
from .session_state import SESSION

# TracedArray's NumPy protocol: leapp.tracing.numpy_ufuncs and numpy_functions build on this
# module and register their dispatchers here once, when imported (numpy_patches imports both).
PROTOCOL: dict[str, Callable] = {}

# Captured before any session patches them.
FROM_NUMPY = torch.from_numpy
TENSOR = torch.tensor
NP_ARRAY = np.array
NP_ASARRAY = np.asarray


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
        return PROTOCOL["ufunc"](ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Callable, types: tuple, args: tuple,
                           kwargs: dict) -> Any:
        return PROTOCOL["function"](func, args, kwargs)

    # ---- indexing ---------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        node = active_node((self, key))
        if node is None:
            return plain_array(self)[to_plain(key)]
        result = _shadow_of(self)[_key_to_torch(key)]
        return wrap(result)

    def __setitem__(self, key: Any, value: Any) -> None:
        node = active_node((self, key, value))
        if node is None or self._shadow is None or not is_active(self):
            plain_array(self)[to_plain(key)] = to_plain(value)
            return
        self._shadow[_key_to_torch(key)] = value_to_torch(value, self._shadow.dtype)

    # ---- methods that numpy would otherwise run on raw memory ---------------

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe",
               subok: bool = True, copy: bool = True) -> Any:
        """The array converted to dtype; recorded as a torch dtype cast."""
        if not is_active(self):
            return plain_array(self).astype(dtype, order=order, casting=casting, subok=subok,
                                             copy=copy)
        target = np.dtype(dtype)
        if target == self.dtype:
            return self.copy() if copy else self
        return wrap(self._shadow.to(torch_dtype(target, "astype")))

    def copy(self, order: str = "C") -> Any:
        """A copy of the array; recorded as a torch clone.

        A copy of a finished node's published array keeps its port, like a
        clone of the tensor would.
        """
        if _carrier(self) is None or not _core.is_tracing():
            return plain_array(self).copy(order=order)
        return wrap(self._shadow.clone())

    def fill(self, value: Any) -> None:
        """Fill the array with value; recorded as an in-place torch fill."""
        if not is_active(self):
            plain_array(self).fill(value)
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
        if not is_active(self):
            plain_array(self).sort(axis=axis, kind=kind, order=order)
            return
        self._shadow.copy_(torch.sort(self._shadow, dim=axis).values)

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickles as the plain array
        return plain_array(self).__reduce_ex__(protocol)


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


def plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """A torch.Tensor over t's memory whose ops are not recorded (leapp.tracing.traced.plain;
    _traced imports this module for TracedTensor's NumPy protocol, so not the reverse)."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def plain_array(a: Any) -> np.ndarray:
    """a as a plain ndarray over the same memory."""
    return a.view(np.ndarray) if isinstance(a, TracedArray) else a


def wrap(tensor: torch.Tensor) -> Any:
    """A TracedArray viewing tensor's memory, with tensor as its shadow."""
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()  # numpy lives on the host; the copy is recorded
    base = plain_tensor(tensor).detach()
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
    return plain_tensor(tensor).numpy(force=force)


def _carrier(a: Any) -> Any:
    shadow = getattr(a, "_shadow", None)
    return _core.carrier_of(shadow) if shadow is not None else None


def is_active(a: Any) -> bool:
    carrier = _carrier(a)
    return carrier is not None and bool(carrier.active)


def holds_active(obj: Any) -> bool:
    """Whether obj holds a value of a node that is still tracing: a traced tensor or a
    TracedArray, at any depth of lists, tuples and dicts (the session patches and the
    TorchScript calls trace a call that passes one)."""
    if isinstance(obj, TracedArray):
        return is_active(obj)
    carrier = _core.carrier_of(obj)
    if carrier is not None:
        return bool(carrier.active)
    if isinstance(obj, (list, tuple)):
        return any(holds_active(o) for o in obj)
    if isinstance(obj, dict):
        return any(holds_active(o) for o in obj.values())
    return False


def shadow_of(value: Any) -> Any:
    """The traced tensor behind a TracedArray (value itself otherwise)."""
    if isinstance(value, TracedArray) and value._shadow is not None:
        return value._shadow
    return value


def _shadow_of(a: TracedArray) -> torch.Tensor:
    if a._shadow is not None:
        return a._shadow
    return _constant(a)


def active_node(obj: Any) -> Any:
    """The tracing node of the first active TracedArray or TracedTensor in obj."""
    if isinstance(obj, TracedArray):
        carrier = _carrier(obj)
        return carrier.node if carrier is not None and carrier.active else None
    carrier = _core.carrier_of(obj)  # a carrier only on a TracedTensor
    if carrier is not None:
        return carrier.node if carrier.active else None
    if isinstance(obj, (list, tuple)):
        for item in obj:
            node = active_node(item)
            if node is not None:
                return node
    elif isinstance(obj, dict):
        return active_node(tuple(obj.values()))
    return None


def to_plain(obj: Any) -> Any:
    """obj with every TracedArray as a plain ndarray over the same memory."""
    if isinstance(obj, TracedArray):
        return obj.view(np.ndarray)
    if type(obj) is tuple:
        return tuple(to_plain(o) for o in obj)
    if type(obj) is list:
        return [to_plain(o) for o in obj]
    if type(obj) is dict:
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def _constant(array: np.ndarray) -> torch.Tensor:
    """A plain array as a constant tensor (a private copy, so later writes don't leak)."""
    return FROM_NUMPY(NP_ARRAY(plain_array(array), copy=True))


def to_torch(obj: Any) -> Any:
    """obj with arrays as tensors: shadows, or constants for plain arrays."""
    if isinstance(obj, TracedArray) and obj._shadow is not None:
        return obj._shadow
    if isinstance(obj, np.ndarray):
        return _constant(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj) is tuple:
        return tuple(to_torch(o) for o in obj)
    if type(obj) is list:
        return [to_torch(o) for o in obj]
    return obj


def _key_to_torch(key: Any) -> Any:
    """An index key for the shadow: arrays become (index) tensors."""
    if isinstance(key, tuple):
        return tuple(_key_to_torch(k) for k in key)
    if isinstance(key, (np.ndarray, list)) and not isinstance(key, TracedArray):
        return FROM_NUMPY(NP_ARRAY(key))
    if isinstance(key, np.integer):
        return int(key)
    return to_torch(key)


def value_to_torch(value: Any, dtype: torch.dtype) -> Any:
    value = to_torch(value)
    if not isinstance(value, torch.Tensor):
        return TENSOR(value, dtype=dtype)
    return value


_DTYPES: dict[np.dtype, torch.dtype] = {}


def torch_dtype(dtype: np.dtype, what: str) -> torch.dtype:
    found = _DTYPES.get(dtype)
    if found is None:
        try:
            found = FROM_NUMPY(np.empty(0, dtype=dtype)).dtype
        except TypeError:
            raise UnmappedNumpyError(f"{what}: NumPy dtype {dtype} has no torch equivalent, "
                                     f"so it cannot be traced.") from None
        _DTYPES[dtype] = found
    return found


def scalar_tensor(value: Any) -> Any:
    """A Python scalar as a 0-d tensor (torch wants a tensor in first position)."""
    if isinstance(value, bool):
        return TENSOR(value)
    if isinstance(value, int):
        return TENSOR(value, dtype=torch.int64)
    if isinstance(value, float):
        return TENSOR(value, dtype=torch.float64)
    if isinstance(value, complex):
        return TENSOR(value, dtype=torch.complex128)
    return value


def unmapped(what: str, node: _core.Node) -> UnmappedNumpyError:
    return UnmappedNumpyError(
        f"{what} has no torch equivalent in leapp's NumPy tracing, so it cannot be recorded "
        f"in node '{node.name}'. Compute it with torch on the traced tensor instead (convert "
        f"with torch.from_numpy(), or do the work before .numpy()).")


def as_payload_tensor(value: Any) -> Any:
    """A payload leaf as annotations see it: arrays as tensors, the rest unchanged."""
    if isinstance(value, TracedArray) and value._shadow is not None:
        return value._shadow
    if isinstance(value, np.ndarray):
        array = value.view(np.ndarray)
        if not array.flags.writeable or not array.dtype.isnative:
            array = NP_ARRAY(array, copy=True)
        return FROM_NUMPY(array)
    return value

