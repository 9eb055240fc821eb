"""leapp.annotate: the annotations inserted into user code.

With no session running every annotation returns its input unchanged (the
very same objects) at C speed, so they can stay in training code.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

from . import _core
from .bundle.log import fatal, logger

input_tensors = _core.input_tensors
output_tensors = _core.output_tensors
state_tensors = _core.state_tensors
update_state = _core.update_state
register_buffer = _core.register_buffer
module = _core.module
mirror_leapp_tags = _core.mirror_leapp_tags

# Keywords leapp 0.7.2's decorators accept besides node_name / export_with /
# backend_params; upstream's method() takes them and ignores inputs/outputs.
_ACCEPTED = ("node_name", "export_with", "backend_params", "environment_constants",
             "register_buffers", "inputs", "outputs")


def _names(option: str, value: Any) -> tuple[str, ...]:
    """A tuple of names from None, one str, or an iterable of str (others dropped)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    try:
        items = list(value)
    except TypeError:
        logger.warning("annotate.method(%s=...) expects a list of names, got %s; it is ignored.",
                       option, type(value).__name__)
        return ()
    kept = tuple(dict.fromkeys(item for item in items if isinstance(item, str)))
    dropped = [item for item in items if not isinstance(item, str)]
    if dropped:
        logger.warning("annotate.method(%s=...) takes names (str); ignoring %r.", option, dropped)
    return kept


def method(fn: Callable | None = None, *, node_name: str | None = None,
           export_with: str | None = None, backend_params: dict | None = None,
           environment_constants: Iterable[str] | str | None = None,
           register_buffers: Iterable[str] | str | None = None,
           inputs: Iterable[str] | None = None, outputs: Iterable[str] | None = None,
           **unknown: Any) -> Any:
    """Decorator tracing a function or method as one node.

    Inputs come from the signature, output names from the return statement;
    tensor defaults not passed become constants of the node.  With no session
    the decorated function is called directly.

    ``environment_constants`` names closed-over objects (``"model"``,
    ``"self.table"``) the function reads: they are frozen into the node as
    constants (every closed-over tensor is; naming them also checks, on the
    first trace, that each name resolves).  ``register_buffers`` names
    closed-over tensors the function writes in place: each becomes a buffer of
    the node, as with ``annotate.register_buffer``.  ``inputs`` / ``outputs``
    are accepted for leapp 0.7.2 compatibility and not used: the signature and
    the return statement give the port names.  Other keywords are ignored with
    a warning, as leapp 0.7.2 ignores them.
    """
    if unknown:
        logger.warning("annotate.method() ignores unknown keyword arguments %s; it accepts %s.",
                       sorted(unknown), ", ".join(_ACCEPTED))
    constants = _names("environment_constants", environment_constants)
    buffers = _names("register_buffers", register_buffers)
    overlap = sorted(set(constants) & set(buffers))
    if overlap:
        fatal(f"annotate.method(): the following names are present in both register_buffers "
              f"and environment_constants: {overlap}. A closed-over object is either a constant "
              f"or a buffer written in place: list it once.", ValueError)
    if inputs is not None or outputs is not None:
        logger.debug("annotate.method(): inputs= / outputs= are not used; port names come from "
                     "the signature and the return statement.")
    options = {"node_name": node_name, "export_with": export_with,
               "backend_params": dict(backend_params or {}),
               "environment_constants": constants, "register_buffers": buffers}

    def decorate(function: Callable) -> Any:
        wrapper = _core.Method(function, options)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(wrapper, attr, getattr(function, attr))
            except AttributeError:
                pass
        wrapper.__wrapped__ = function
        return wrapper

    return decorate(fn) if fn is not None else decorate


def warp_op(node_name: str, inputs: list[str] | None = None, outputs: list[str] | None = None,
            **params: Any) -> contextlib.AbstractContextManager:
    """leapp 0.7.2's Warp region: a no-op context with no session running.

    This implementation does not trace NVIDIA Warp kernels; inside a session
    it raises ImportError, as leapp 0.7.2 does when its Warp backend is not
    installed.
    """
    if not _core.is_tracing():
        return contextlib.nullcontext()
    fatal(f"LEAPP: the warp backend is not installed. annotate.warp_op('{node_name}') needs "
          f"Warp kernel tracing, which this leapp does not provide: express the region in "
          f"torch ops, or export it separately and bring the model with export_with=None and "
          f"backend_params={{'model_path': ...}}.", ImportError)


_PUBLIC = ("input_tensors", "output_tensors", "method", "state_tensors", "update_state",
           "register_buffer", "module", "mirror_leapp_tags", "warp_op")


def __getattr__(name: str) -> Any:
    raise AttributeError(f"leapp.annotate has no attribute '{name}'. Available annotations: "
                         f"{', '.join(_PUBLIC)}")
