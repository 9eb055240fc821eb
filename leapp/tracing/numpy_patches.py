"""The session's NumPy patches (``torch.from_numpy``, ``np.asarray``, ...).

Importing this module completes TracedArray's NumPy protocol (ufuncs, array functions).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from .. import _core
from . import numpy_functions, numpy_ufuncs  # noqa: F401  (register TracedArray's protocol)
from .numpy_array import TracedArray, plain_array, wrap

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
            return original(plain_array(data) if isinstance(data, TracedArray) else data,
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
