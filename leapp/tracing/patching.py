"""Session patches, installed by start() and removed by stop().

With ``global_patching=True`` (the default) a session replaces the NumPy
conversion entry points (``torch.from_numpy``, ``torch.as_tensor``,
``torch.tensor``, ``np.array``, ``np.asarray``, ``np.asanyarray``) so that
NumPy work inside a node stays traced (see ``leapp.tracing.numpy_array``), and installs
the user's :class:`FunctionPatch` definitions: a patched function called with
a value of a tracing node runs the replacement instead.  With
``global_patching=False`` nothing is patched, user definitions included, and
they are not checked.

The definitions are all checked before anything is patched; if installing
fails half-way, what was installed is put back.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence

from .. import _core
from . import numpy_array as _numpy, numpy_patches, script as _script
from ..bundle.log import logger


@dataclass(frozen=True)
class FunctionPatch:
    """A traceable replacement for one module-level function.

    While a session runs, ``module.function_name`` is replaced by a wrapper
    that calls ``replacement`` with the same arguments whenever one of them
    (at any depth of lists, tuples and dicts) is a value of a tracing node,
    and the original function otherwise.
    """

    module: ModuleType
    function_name: str
    replacement: Callable[..., Any]


def validate(patching: Sequence[FunctionPatch] | None) -> tuple[FunctionPatch, ...]:
    """The definitions, checked; raises TypeError / ValueError on the first bad one."""
    definitions = () if patching is None else tuple(patching)
    seen: set[tuple[int, str]] = set()
    for definition in definitions:
        if not isinstance(definition, FunctionPatch):
            raise TypeError("patching entries must be FunctionPatch instances")
        module, name = definition.module, definition.function_name
        if not isinstance(module, ModuleType):
            raise TypeError("FunctionPatch.module must be a Python module")
        if not isinstance(name, str) or not name:
            raise ValueError("FunctionPatch.function_name must be a non-empty string")
        if not hasattr(module, name):
            raise ValueError(f"module {module.__name__!r} has no attribute {name!r}")
        if not callable(getattr(module, name)):
            raise TypeError(f"{module.__name__}.{name} is not callable")
        if not callable(definition.replacement):
            raise TypeError("FunctionPatch.replacement must be callable")
        key = (id(module), name)
        if key in seen:
            raise ValueError(f"duplicate patch target {module.__name__}.{name}")
        seen.add(key)
    return definitions


def _dispatch(original: Callable, replacement: Callable) -> Callable:
    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        if _numpy.holds_active(args) or _numpy.holds_active(kwargs):
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)
    return patched


_MISSING = object()


class Patcher:
    """Installs the session's patches and restores the originals."""

    def __init__(self, global_patching: bool, patches: Sequence[FunctionPatch] | None) -> None:
        self.global_patching = bool(global_patching)
        self.patches = patches
        # (owner, name, original, installed wrapper), in installation order
        self.saved: list[tuple[Any, str, Any, Any]] = []
        self._installed = False

    @property
    def installed(self) -> bool:
        """Whether the patches are in place."""
        return self._installed

    def _set(self, owner: Any, name: str, wrapper: Any) -> None:
        original = getattr(owner, name)
        self.saved.append((owner, name, original, wrapper))
        setattr(owner, name, wrapper)

    def install(self, *, patching: Sequence[FunctionPatch] | None = None) -> None:
        """Check every definition, then patch; a failure leaves nothing patched.

        patching, when given, replaces the definitions the session started
        with (as upstream's ``ExportManager().patcher.install(patching=...)``).
        """
        if patching is not None:
            self.patches = patching
        if not self.global_patching or self._installed:
            return
        definitions = validate(self.patches)
        try:
            for owner, name, wrapper in numpy_patches.patches():
                self._set(owner, name, wrapper)
            for owner, name, wrapper in _script.patches():
                self._set(owner, name, wrapper)
            for definition in definitions:
                original = getattr(definition.module, definition.function_name)
                self._set(definition.module, definition.function_name,
                          _dispatch(original, definition.replacement))
        except BaseException:
            self.uninstall()
            raise
        self._installed = True
        logger.debug("Installed %d session patches", len(self.saved))

    def uninstall(self) -> None:
        """Put every patched function back (those nobody replaced since)."""
        self._installed = False
        while self.saved:
            owner, name, original, wrapper = self.saved.pop()
            if inspect.getattr_static(owner, name, _MISSING) is wrapper:
                setattr(owner, name, original)
