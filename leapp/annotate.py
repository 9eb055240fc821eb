"""leapp.annotate: the annotations inserted into user code.

With no session running every annotation returns its input unchanged (the
very same objects) at C speed, so they can stay in training code.
"""
from __future__ import annotations

from typing import Any, Callable

from . import _core

input_tensors = _core.input_tensors
output_tensors = _core.output_tensors
state_tensors = _core.state_tensors
update_state = _core.update_state
register_buffer = _core.register_buffer
module = _core.module
mirror_leapp_tags = _core.mirror_leapp_tags


def method(fn: Callable | None = None, *, node_name: str | None = None,
           export_with: str | None = None, backend_params: dict | None = None,
           **legacy: Any) -> Any:
    """Decorator tracing a function or method as one node.

    Inputs come from the signature, output names from the return statement;
    tensor defaults not passed become constants of the node.  With no session
    the decorated function is called directly.
    """
    if legacy:
        raise TypeError(f"annotate.method() got unexpected arguments {sorted(legacy)}; "
                        f"accepted: node_name, export_with, backend_params")
    options = {"node_name": node_name, "export_with": export_with,
               "backend_params": dict(backend_params or {})}

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


_PUBLIC = ("input_tensors", "output_tensors", "method", "state_tensors", "update_state",
           "register_buffer", "module", "mirror_leapp_tags")


def __getattr__(name: str) -> Any:
    raise AttributeError(f"leapp.annotate has no attribute '{name}'. Available annotations: "
                         f"{', '.join(_PUBLIC)}")
