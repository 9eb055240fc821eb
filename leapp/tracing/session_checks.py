"""The session's rules and messages shared by its node life cycle: the tracing thread,
port descriptions, the texts of the errors annotations raise."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from . import numpy_array as _numpy
from .. import _core
from .traced import TracedTensor
from .payload import Leaf
from .session_state import SESSION, SessionConfig


def config() -> SessionConfig | None:
    """The running (or last) session's configuration."""
    return SESSION.config


def is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def describe(value: torch.Tensor) -> tuple[str, tuple]:
    return _core.dtype_name(value), tuple(int(s) for s in value.shape)


def listed(value: Any) -> Any:
    """Tuples as lists, recursively (descriptions print like upstream's)."""
    if isinstance(value, (list, tuple)):
        return [listed(v) for v in value]
    return value


def description_text(name: str, dtype: str, shape: tuple,
                      semantics: dict | None = None) -> str:
    """A port description for messages: the YAML entry as a dict, semantic fields last."""
    entry: dict[str, Any] = {"name": name, "dtype": dtype, "shape": [int(s) for s in shape],
                             "type": "tensor"}
    entry.update({key: listed(value) for key, value in (semantics or {}).items()})
    return repr(entry)


def port_names(node: _core.Node, outputs: bool) -> list[str]:
    ports = node.outputs if outputs else list(node.inputs) + list(node.trimmed_inputs)
    return [p.name for p in ports]


def thread_text(ident: int | None) -> str:
    """'name' (ident N) of a live thread, for messages."""
    for thread in threading.enumerate():
        if thread.ident == ident:
            return f"'{thread.name}' (ident {ident})"
    return f"ident {ident}"


def unregistered_text(name: str, node: str, src: str, upstream_style: bool = False) -> str:
    """The message for an input derived from another node's unpublished value; the
    upstream-style form keeps upstream's wording for the in-place case."""
    if upstream_style:
        return (f"Error: input '{name}' for node '{node}' was derived from node '{src}' but "
                f"is not one of its registered outputs.\nAdd it to that node's "
                f"output_tensors() to connect the two nodes, or ignore this if '{name}' is "
                f"meant to enter the graph from outside.\nTreating '{name}' as a dangling "
                f"input.")
    return (f"Input '{name}' of node '{node}' was derived from node '{src}' but is not one "
            f"of its registered outputs; it becomes a graph input.")


def op_name(func: Any) -> str:
    return getattr(func, "__name__", None) or repr(func)


# Instance-dict key of the C core's "computed outside every node from a
# published output" tag: (node name, port, op name).
DERIVED = "_leapp_derived"


def derived_tag(value: Any) -> tuple | None:
    """The (node name, port, op name) tag of a tensor computed outside every node from a
    published output, or None."""
    tag = vars(value).get(DERIVED) if type(value) is TracedTensor else None
    return tag if isinstance(tag, tuple) and len(tag) == 3 else None


OPEN_NODE_HINT = (
    "\nIf the node is still open from an earlier pass that raised (e.g. a notebook cell run "
    "again after an error), call leapp.start() again to reset the session and rerun.")


def tensor_leaf(leaf: Leaf, arrays: bool) -> Leaf:
    """leaf with a traced array as its shadow (and, if arrays, any array as a tensor)."""
    value = leaf.value
    if isinstance(value, _numpy.TracedArray) and value._shadow is not None:
        return Leaf(leaf.name, value._shadow, leaf.semantics, leaf.path)
    if arrays and isinstance(value, np.ndarray):
        return Leaf(leaf.name, _numpy.as_payload_tensor(value), leaf.semantics, leaf.path)
    return leaf


def refuse_if_strict(message: str) -> None:
    """Raise message as a RuntimeError under leapp.start(strict=True) (or LEAPP_STRICT=1),
    saying so; otherwise return (the caller logs it)."""
    cfg = SESSION.config
    if cfg is not None and cfg.strict:
        from ..bundle.log import fatal
        fatal(message + " (strict mode: leapp.start(strict=True) or LEAPP_STRICT=1)",
              RuntimeError)
