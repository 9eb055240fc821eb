"""Session patches, installed by start() and removed by stop().

global_patching keeps a trace alive through a numpy round trip: an array that
`.numpy()` / `np.asarray()` made from a traced value comes back through
`torch.from_numpy()` / `torch.as_tensor()` as that traced value.  User
FunctionPatch objects send calls that see a traced value to a replacement.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from . import _core


def _has_active(obj: Any) -> bool:
    carrier = _core.carrier_of(obj)
    if carrier is not None:
        return bool(carrier.active)
    if isinstance(obj, (list, tuple)):
        return any(_has_active(o) for o in obj)
    if isinstance(obj, dict):
        return any(_has_active(o) for o in obj.values())
    return False


@dataclass
class FunctionPatch:
    """Replace module.name by replacement whenever a traced value is passed to it."""

    module: Any
    name: str
    replacement: Callable[..., Any]


class NumpyLinks:
    """Arrays handed out by traced tensors, keyed by (address, shape, dtype)."""

    def __init__(self) -> None:
        self.active = False
        self.carriers: dict[tuple, Any] = {}

    @staticmethod
    def key(array: Any) -> tuple | None:
        interface = getattr(array, "__array_interface__", None)
        if interface is None:
            return None
        return interface["data"][0], tuple(interface["shape"]), interface["typestr"]

    def remember(self, array: Any, carrier: Any) -> None:
        key = self.key(array)
        if self.active and key is not None and carrier is not None:
            self.carriers[key] = carrier

    def restore(self, array: Any, tensor: Any) -> Any:
        """tensor (made from array) as the traced value array came from."""
        key = self.key(array)
        carrier = self.carriers.get(key) if key is not None else None
        if carrier is not None and tensor.data_ptr() == key[0]:
            _core.set_carrier(tensor, carrier.node, carrier.vid, carrier.port,
                              bool(carrier.declared))
        return tensor


NUMPY_LINKS = NumpyLinks()


def _from_numpy(original: Callable) -> Callable:
    @functools.wraps(original)
    def patched(array: Any, *args: Any, **kwargs: Any) -> Any:
        return NUMPY_LINKS.restore(array, original(array, *args, **kwargs))
    return patched


class Patcher:
    """Installs the session's patches and restores the originals."""

    def __init__(self, global_patching: bool, patches: list[FunctionPatch]) -> None:
        for patch in patches:
            if not isinstance(patch, FunctionPatch):
                raise TypeError(f"leapp.start(patching=...) expects FunctionPatch objects, got "
                                f"{type(patch).__name__}")
        self.global_patching = global_patching
        self.patches = list(patches)
        self.saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self.global_patching:
            import torch
            for name in ("from_numpy", "as_tensor"):
                original = getattr(torch, name)
                self.saved.append((torch, name, original))
                setattr(torch, name, _from_numpy(original))
            NUMPY_LINKS.active = True
        for patch in self.patches:
            original = getattr(patch.module, patch.name)
            self.saved.append((patch.module, patch.name, original))
            setattr(patch.module, patch.name, _dispatch(original, patch.replacement))

    def uninstall(self) -> None:
        NUMPY_LINKS.active = False
        NUMPY_LINKS.carriers.clear()
        while self.saved:
            module, name, original = self.saved.pop()
            setattr(module, name, original)


def _dispatch(original: Callable, replacement: Callable) -> Callable:
    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        if _has_active(args) or _has_active(kwargs):
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)
    return patched
