"""Session patches: user FunctionPatch objects, installed by start(), removed by stop()."""
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
        for patch in self.patches:
            original = getattr(patch.module, patch.name)
            self.saved.append((patch.module, patch.name, original))
            setattr(patch.module, patch.name, _dispatch(original, patch.replacement))

    def uninstall(self) -> None:
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
