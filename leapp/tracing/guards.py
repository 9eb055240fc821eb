"""Guards: traced values read into Python inside a node.

The exported graph holds tensor ops only.  When user code turns a traced
value into a Python value (``if x.sum() > 0``, ``int(t)``, ``t.item()``,
``t.tolist()``, ``len(torch.nonzero(m))``, ...) the graph keeps what that
value was on the traced pass: a branch, a loop count or a number baked in.
As torch.export does with data-dependent values, each such conversion is a
*guard*, recorded with the user's file and line and the value seen:

* on the first pass of a node, once per site: an ERROR for a boolean
  context (upstream's wording first), a WARNING for numbers and sizes, both
  naming the site, the value and the fix; ``leapp.start(strict_guards=True)``
  refuses instead;
* on later passes of a node that has guards, the node is traced again into a
  throw-away *shadow* node (same ops, nothing kept but the guards), and each
  conversion must see what the first pass saw at that site: a difference is
  refused (the trace took another branch).  Nodes without guards re-enter at
  eager speed, as before.

The C core calls :func:`on_conversion` only for the kinds that
:func:`conversion_kind` gives (``OP_CONVERSION``; ``OP_SIZE`` of a value whose
shape depends on data, ``OP_DYNAMIC`` marking such values), so ordinary ops
never leave C.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _core
from ..bundle.log import fatal, logger
from .node_info import NodeInfo, info
from .script import script_site

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # leapp/
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))

# Conversions of a value into Python: always a guard.
_CONVERSIONS = {
    torch.Tensor.__bool__: "bool()", torch.Tensor.__int__: "int()",
    torch.Tensor.__float__: "float()", torch.Tensor.__index__: "an index (__index__)",
    torch.Tensor.__complex__: "complex()", torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
}
# Size reads: a guard only on a value whose shape depends on data.
_SIZES = {
    torch.Tensor.__len__: "len()", torch.Tensor.numel: ".numel()",
    torch.Tensor.size: ".size()", torch.Tensor.shape.__get__: ".shape",
}
# Ops whose results have a shape that depends on the values.
_DYNAMIC_NAMES = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select",
                  "bincount"}


class DataDependent(RuntimeError):
    """A value read into Python inside a node traced privately (no guard is kept)."""


def conversion_kind(func: Any) -> int | None:
    """The guard kind of func (OP_CONVERSION, OP_SIZE, OP_DYNAMIC), else None."""
    try:
        if func in _CONVERSIONS:
            return _core.OP_CONVERSION
        if func in _SIZES:
            return _core.OP_SIZE
    except TypeError:  # an unhashable callable
        return None
    if getattr(func, "__name__", None) in _DYNAMIC_NAMES:
        return _core.OP_DYNAMIC
    return None


@dataclass
class Guard:
    """One site's conversions on the first pass of a node."""

    what: str                                  # "bool()", ".item()", ...
    values: list = field(default_factory=list)  # in the order they happened


def _site() -> tuple[str, int] | None:
    """(file, line) of the user's code that converted the value.

    None when the conversion is leapp's own (the nearest frame outside torch
    is in leapp) or torch's printing of a tensor (repr, format): neither
    decides what the graph computes.  A conversion made by a TorchScript
    instruction that leapp runs op by op (leapp.tracing.script) is the
    user's: its site is that instruction's source line, with the callable and
    the call site as a third item.
    """
    try:
        frame: Any = sys._getframe(2)  # _site <- on_conversion <- the converting code
    except ValueError:
        return None
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR):
            break
        if frame.f_code.co_name in ("__format__", "__repr__", "__str__") \
                or name.endswith("_tensor_str.py"):
            return None
        frame = frame.f_back
    if frame is None:
        return None
    if frame.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep):
        return script_site() if frame.f_code.co_filename == _SCRIPT_FILE else None
    return (frame.f_code.co_filename, frame.f_lineno)


_SCRIPT_FILE = sys.modules[script_site.__module__].__file__


def _where(site: tuple) -> str:
    """file:line of a site, and for a TorchScript instruction what it is."""
    return f"{site[0]}:{site[1]}" + (f" ({site[2]})" if len(site) > 2 else "")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # noqa: BLE001  (values that do not compare: different)
        return False


def _producer(node: _core.Node, receiver: Any) -> str:
    """The name of the op (or input) that gave receiver, as upstream names it."""
    carrier = _core.carrier_of(receiver)
    if carrier is None:
        return "tensor"
    for port in node.inputs:
        if port.vid == carrier.vid:
            return port.name
    for func, _args, _kwargs, out in reversed(node.ops):
        if out == carrier.vid or (isinstance(out, tuple) and carrier.vid in out):
            return getattr(func, "__name__", None) or "tensor"
    return "tensor"


class Options:
    """The running session's guard options (set by leapp.start)."""

    strict: bool = False  # leapp.start(strict_guards=True): refuse every baked-in conversion


def _strict() -> bool:
    return Options.strict


def on_conversion(node: _core.Node, func: Any, receiver: Any, value: Any) -> None:
    """The core's hook: a traced value of node, still tracing, read into Python."""
    what = _CONVERSIONS.get(func) or _SIZES.get(func)
    if what is None:
        return
    if func in _SIZES:
        with torch._C.DisableTorchFunctionSubclass():
            if receiver.dim() == 0:
                return  # a scalar's shape is static
    site = _site()
    if site is None:
        return
    node_info = info(node)
    if node_info.private:  # a private trace keeps no guards: it refuses (leapp.tracing.node_trace)
        raise DataDependent(f"a traced value is read into Python by {what} at {_where(site)} "
                            "(control flow or a value that depends on the data)")
    first = node_info.reentry_of
    if first is None:
        _first_pass(node, node_info, site, what, func, receiver, value)
    else:
        _later_pass(first, node_info, site, what, value)


def _first_pass(node: _core.Node, node_info: NodeInfo, site: tuple, what: str, func: Any,
                receiver: Any, value: Any) -> None:
    guard = node_info.guards.get(site)
    if guard is not None:
        guard.values.append(value)
        return
    node_info.guards[site] = Guard(what, [value])
    where = _where(site)
    fix = ("Express it with tensor ops (torch.where(cond, a, b), masks, torch.clamp, "
           "indexing with tensors) or make the value a declared input of the node.")
    if func is torch.Tensor.__bool__:
        message = (f"Attempted to use TracedTensor '{_producer(node, receiver)}' from node "
                   f"'{node.name}' in a boolean context (if/while/and/or/not) during tracing. "
                   f"At {where} it was {value}: the exported model always takes the branch "
                   f"taken here (baked in). {fix}")
    elif func in _SIZES:
        message = (f"A data-dependent size (of a nonzero, unique, masked_select or "
                   f"boolean-mask result) of node '{node.name}' was read into Python by "
                   f"{what} at {where}: {_shown(value)} is baked into the exported model as a "
                   f"constant. {fix}")
    else:
        message = (f"A traced value of node '{node.name}' was read into Python by {what} at "
                   f"{where}: {_shown(value)} is baked into the exported model as a "
                   f"constant. {fix}")
    if _strict():
        fatal(message + " (refused: leapp.start(strict_guards=True))")
    level = "error" if func is torch.Tensor.__bool__ else "warning"
    getattr(logger, level)("%s A later pass that sees another value there is refused; "
                           "leapp.start(strict_guards=True) refuses it at once.", message)


def _later_pass(first: _core.Node, node_info: NodeInfo, site: tuple, what: str,
                value: Any) -> None:
    count = node_info.guard_counts.get(site, 0)
    node_info.guard_counts[site] = count + 1
    guard = info(first).guards.get(site)
    if guard is not None and count < len(guard.values) and _same(guard.values[count], value):
        return
    if guard is None or count >= len(guard.values):
        seen = (f"the first pass never read a value there"
                if guard is None else
                f"the first pass read {len(guard.values)} value(s) there, this pass more")
    else:
        seen = (f"the first pass saw {_shown(guard.values[count])}, this pass "
                f"{_shown(value)} ({what}, occurrence {count + 1})")
    fatal(f"Error: node '{first.name}': the trace took another branch at {_where(site)}: "
          f"{seen}. The exported model holds only what the first pass computed, so it would "
          f"not compute what ran here. Express the data-dependent choice with tensor ops "
          f"(torch.where(cond, a, b), masks) or make the value a declared input of the node.")


# ---- shadow passes -----------------------------------------------------------

def needs_shadow(node: _core.Node) -> bool:
    """Whether a later pass of node must be traced to check its guards."""
    return bool(info(node).guards)


def shadow_of(node: _core.Node, name: str) -> _core.Node:
    """The shadow node of this later pass of node, for its input name.

    The first input of a pass makes it; an input declared again starts a new
    pass (the one before raised before its outputs)."""
    node_info = info(node)
    shadow = node_info.shadow
    if shadow is not None and shadow.is_tracing \
            and any(taken == name for taken, _ in info(shadow).declared):
        shadow.finish(node.node_index)
    if shadow is None or not shadow.is_tracing:
        shadow = _core.Node(node.name)
        shadow.info["leapp"] = NodeInfo(reentry_of=node)
        node_info.shadow = shadow
    return shadow


def end_pass(node: _core.Node) -> None:
    """Close the shadow of the pass that ends (its op log is dropped)."""
    node_info = info(node)
    shadow, node_info.shadow = node_info.shadow, None
    if shadow is not None and shadow.is_tracing:
        shadow.finish(node.node_index)  # closed without taking a completion index
    node_info.passes += 1


_core._bind_guards(on_conversion, torch.Tensor.__getitem__, torch.bool)
