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
from . import frames
from .node_info import NodeInfo, info
from .script import script_site


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
# torch functions that read a traced value into a Python bool themselves (C++ returns
# the bool; an `if` on it is a branch like bool()), by their torch and aten name.
_BOOL_READS = {"equal": "torch.equal()", "allclose": "torch.allclose()",
               "is_nonzero": "torch.is_nonzero()"}
# Ops whose results have a shape (or, for histc / histogram, bin edges) that depends on
# the values: guarded at the op (on_data_shape), their results flagged for size reads.
_DYNAMIC_NAMES = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select",
                  "bincount", "one_hot", "repeat_interleave", "histc", "histogram", "where",
                  "_unique", "_unique2", "unique_dim", "nonzero_numpy", "index"}


def _op_name(func: Any) -> str:
    """'equal' for torch.equal, Tensor.equal and torch.ops.aten.equal.default."""
    if isinstance(func, torch._ops.OpOverload):
        func = func.overloadpacket
    if isinstance(func, torch._ops.OpOverloadPacket):
        qualified = getattr(func, "_qualified_op_name", "")
        return qualified[len("aten::"):] if qualified.startswith("aten::") else ""
    return getattr(func, "__name__", None) or ""


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
    name = _op_name(func)
    if name in _BOOL_READS:
        return _core.OP_CONVERSION
    if name in _DYNAMIC_NAMES and (name != "index" or isinstance(func, (
            torch._ops.OpOverload, torch._ops.OpOverloadPacket))):
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
    validation = False
    frame = None
    for frame in frames.outward(2):  # _site <- on_conversion <- the converting code
        if not frames.in_torch(frame):
            break
        name = frame.f_code.co_filename
        if frame.f_code.co_name in ("__format__", "__repr__", "__str__") \
                or name.endswith("_tensor_str.py"):
            return None
        validation = validation or (name == _DISTRIBUTION_FILE
                                    and frame.f_code.co_name in _VALIDATING)
    else:
        return None
    if frames.in_leapp(frame):
        return script_site() if frame.f_code.co_filename == _SCRIPT_FILE else None
    if validation:
        return frames.site(frame) + (_VALIDATION,)
    return frames.site(frame)


_SCRIPT_FILE = sys.modules[script_site.__module__].__file__
#: torch.distributions' argument checks (Distribution(validate_args=...)): their bool()
#: raises or passes and decides nothing the node computes
_DISTRIBUTION_FILE = os.path.join(frames.TORCH_DIR, "distributions", "distribution.py")
_VALIDATING = frozenset({"__init__", "_validate_sample"})
_VALIDATION = "torch.distributions argument validation"


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
    what = _CONVERSIONS.get(func) or _SIZES.get(func) or _BOOL_READS.get(_op_name(func))
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
    if len(site) == 3 and site[2] == _VALIDATION:
        _validation_read(node, node_info, site)
        return
    if node_info.private:  # a private trace keeps no guards: it refuses (leapp.tracing.node_trace)
        raise DataDependent(f"a traced value is read into Python by {what} at {_where(site)} "
                            "(control flow or a value that depends on the data)")
    first = node_info.reentry_of
    if first is None:
        if not _known(node_info, site, what, value):
            _report(_conversion_message(node, site, what, func, receiver, value),
                    "error" if func is torch.Tensor.__bool__ or what in _BOOL_READS.values()
                    else "warning")
    else:
        _later_pass(first, node_info, site, what, value)


_FIX = ("Express it with tensor ops (torch.where(cond, a, b), masks, torch.clamp, "
        "indexing with tensors) or make the value a declared input of the node.")


def _validation_read(node: _core.Node, node_info: NodeInfo, site: tuple) -> None:
    """torch.distributions checking its arguments: no guard (a failed check raises in
    eager, and the export computes the same without it), one INFO line per node."""
    if node_info.reentry_of is None and not node_info.validation_noted:
        node_info.validation_noted = True
        logger.info("node '%s': torch.distributions checks its arguments by reading traced "
                    "values into Python (at %s:%d); the check decides nothing the node "
                    "computes, so it is not a guard. "
                    "torch.distributions.Distribution.set_default_validate_args(False) "
                    "turns it off.", node.name, os.path.basename(site[0]), site[1])


def _known(node_info: NodeInfo, site: tuple, what: str, value: Any) -> bool:
    """Note value at site on the first pass; whether the site was reported already."""
    guard = node_info.guards.get(site)
    if guard is not None:
        guard.values.append(value)
        return True
    node_info.guards[site] = Guard(what, [value])
    return False


def _conversion_message(node: _core.Node, site: tuple, what: str, func: Any, receiver: Any,
                        value: Any) -> str:
    where = _where(site)
    if func is torch.Tensor.__bool__:
        return (f"Attempted to use TracedTensor '{_producer(node, receiver)}' from node "
                f"'{node.name}' in a boolean context (if/while/and/or/not) during tracing. "
                f"At {where} it was {value}: the exported model always takes the branch "
                f"taken here (baked in). {_FIX}")
    if what in _BOOL_READS.values():
        return (f"A traced value of node '{node.name}' was read into a Python bool by {what} "
                f"at {where}: it was {value}, and the exported model always takes the branch "
                f"taken here (baked in). Keep the comparison a tensor ((a == b).all(), "
                f"torch.isclose(a, b).all()) and choose with torch.where, or make the value a "
                f"declared input of the node.")
    if func in _SIZES:
        return (f"A data-dependent size (of a nonzero, unique, masked_select or "
                f"boolean-mask result) of node '{node.name}' was read into Python by "
                f"{what} at {where}: {_shown(value)} is baked into the exported model as a "
                f"constant. {_FIX}")
    return (f"A traced value of node '{node.name}' was read into Python by {what} at "
            f"{where}: {_shown(value)} is baked into the exported model as a constant. {_FIX}")


def _report(message: str, level: str) -> None:
    """A new site on the first pass: refused under strict_guards, else logged once."""
    if _strict():
        fatal(message + " (refused: leapp.start(strict_guards=True))")
    getattr(logger, level)("%s A later pass that sees another value there is refused; "
                           "leapp.start(strict_guards=True) refuses it at once.", message)


# ---- ops whose results' shape comes from the data ---------------------------

_MASK_FIX = ("Keep a fixed size: a mask over the whole tensor (torch.where(mask, x, 0), "
             "mask.sum()) or torch.nonzero_static(mask, size=N).")
_SHAPE_FIXES = {
    "one_hot": "Pass the class count: F.one_hot(idx, num_classes=N).",
    "bincount": ("Give the counts a fixed size: F.one_hot(x, num_classes=N).sum(0), or "
                 "torch.zeros(N).index_add(0, x, weights)."),
    "repeat_interleave": ("Repeat by a Python int, or build a fixed-size result with a mask "
                          "(torch.arange(N) < repeats.sum())."),
    "histc": "Pass a fixed range: torch.histc(x, bins, min=lo, max=hi).",
    "histogram": "Pass a fixed range: torch.histogram(x, bins, range=(lo, hi)).",
}


_LABELS = {"_unique": "unique", "_unique2": "unique", "unique_dim": "unique",
           "nonzero_numpy": "nonzero"}


def _traced(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) and _core.carrier_of(obj) is not None


def _traced_mask(key: Any) -> bool:
    """Whether an index key holds a traced boolean tensor."""
    if isinstance(key, (tuple, list)):
        return any(_traced_mask(k) for k in key)
    if not _traced(key):
        return False
    with torch._C.DisableTorchFunctionSubclass():
        return key.dtype == torch.bool


def _shape_of(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            return tuple(result.shape)
    if isinstance(result, (tuple, list)):
        return tuple(_shape_of(r) for r in result)
    return None


def _data_range(x: torch.Tensor) -> tuple:
    with torch._C.DisableTorchFunctionSubclass():
        if x.numel() == 0:
            return (0.0, 0.0)
        return (float(x.min()), float(x.max()))


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _data_read(name: str, args: tuple, kwargs: dict, result: Any) -> tuple | None:
    """(what, value, shape from data) when this call's result is decided by the data
    (what the exported model keeps), else None.  value is the result's shape, or the data's
    range for histc / histogram (their bin edges; the shape is fixed by bins)."""
    if name == "one_hot":
        if int(_arg(args, kwargs, 1, "num_classes", -1)) != -1:
            return None
        return "F.one_hot without num_classes", _shape_of(result), True
    if name == "repeat_interleave":
        if kwargs.get("output_size") is not None:
            return None
        repeats = args[0] if len(args) == 1 and "repeats" not in kwargs \
            else _arg(args, kwargs, 1, "repeats")
        if not _traced(repeats):
            return None
        return "repeat_interleave with tensor repeats", _shape_of(result), True
    if name in ("histc", "histogram"):
        if name == "histc":
            low, high = _arg(args, kwargs, 2, "min", 0), _arg(args, kwargs, 3, "max", 0)
            if float(low) != float(high):
                return None
        elif kwargs.get("range") is not None or isinstance(
                _arg(args, kwargs, 1, "bins", 100), torch.Tensor):
            return None
        return f"torch.{name} without a range", _data_range(args[0]), False
    if name == "where":
        if len(args) + len(kwargs) != 1:
            return None  # torch.where(cond, a, b): shaped like its arguments
        return "torch.where(condition) (its indices)", _shape_of(result), True
    if name in ("__getitem__", "index"):
        if not _traced_mask(args[1] if len(args) > 1 else kwargs.get("indices")):
            return None
        return "a boolean-mask index (x[mask])", _shape_of(result), True
    return f"torch.{_LABELS.get(name, name)}", _shape_of(result), True


def on_data_shape(node: _core.Node, func: Any, args: tuple, kwargs: Any, result: Any) -> bool:
    """The core's hook for an op whose results' shape may depend on the values (nonzero,
    unique, masked_select, a boolean-mask index, one_hot without num_classes, bincount,
    repeat_interleave with tensor repeats; histc and histogram without a range, whose bin
    edges do): a guard at the user's line, the shape (or range) seen its value, as a
    value read into Python.  Returns whether the results' shape depends on the data (the
    core then flags them, and a size read of them is a guard too)."""
    name = _op_name(func)
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    found = _data_read(name, args, kwargs, result)
    if found is None:
        return False
    what, value, dynamic = found
    site = _site()
    if site is None:
        return dynamic
    # the op's own site, apart from a conversion on the same line (len(torch.nonzero(m)))
    site = (site[0], site[1], what if len(site) < 3 else f"{what}; {site[2]}")
    node_info = info(node)
    if node_info.private:  # a private trace (leapp.tracing.node_trace) keeps no guards
        return dynamic
    first = node_info.reentry_of
    selection = name not in _SHAPE_FIXES
    if first is not None:
        if not selection or site in info(first).guards:
            _later_pass(first, node_info, site,
                        f"the {'shape' if dynamic else 'range'} of {what}", value)
        return dynamic
    if selection:  # a guard once it reaches an output (check_outputs)
        node_info.data_shapes.setdefault(site, Guard(what)).values.append(value)
        for out in result if isinstance(result, (tuple, list)) else (result,):
            carrier = _core.carrier_of(out) if isinstance(out, torch.Tensor) else None
            if carrier is not None:
                node_info.data_vids[carrier.vid] = site
        return dynamic
    if _known(node_info, site, what, value):
        return dynamic
    fix = _SHAPE_FIXES.get(name, f"{_MASK_FIX} {_FIX}")
    seen = f"its shape was {_shown(value)}" if dynamic else f"the range was {_shown(value)}"
    decided = "shape" if dynamic else "bin edges (the data's min and max)"
    _report(f"{what[0].upper()}{what[1:]} in node '{node.name}' at {_op_line(site)} gives a "
            f"result whose {decided} the data decides: {seen} here, and the bundle is built "
            f"for that (baked in): its port shapes, and a model that fixes the value (the "
            f"ONNX writer's), do not follow other inputs, on every backend. {fix}", "warning")
    return dynamic


def _op_line(site: tuple) -> str:
    """file:line of an op's guard site (its key names the op too), and for an op of
    TorchScript code the note on the instruction."""
    note = site[2].split("; ", 1)[1] if "; " in site[2] else ""
    return f"{site[0]}:{site[1]}" + (f" ({note})" if note else "")


def _value_ids(template: Any, into: set) -> None:
    """The value ids a recorded op's argument template refers to."""
    if isinstance(template, _core.Ref):
        if template.kind == _core.REF_VALUE:
            into.add(template.index)
    elif isinstance(template, (tuple, list)):
        for item in template:
            _value_ids(item, into)
    elif isinstance(template, dict):
        for item in template.values():
            _value_ids(item, into)


def _sources(node: _core.Node, vid: int) -> list[tuple]:
    """The sites of pass 1's selections (nonzero, x[mask], ...) that value vid comes from."""
    node_info = info(node)
    needed, found = {vid}, []
    for _func, args, kwargs, out in reversed(node.ops):
        outs = set(out) if isinstance(out, tuple) else {out}
        if not outs & needed:
            continue
        for one in outs & needed:
            site = node_info.data_vids.get(one)
            if site is not None and site not in found:
                found.append(site)
        _value_ids(args, needed)
        _value_ids(kwargs, needed)
    return found


def _shape_follows_data(node: _core.Node, vid: int) -> bool:
    """Whether value vid's shape follows the data: the op log up to it replayed on fake
    tensors, each selection's count a symbol (torch's unbacked sizes); a replay that
    fails counts as yes.  The core's flag alone says only that vid was computed from a
    selection (x[mask].sum() is flagged and has a fixed shape)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

    def resolve(obj: Any) -> Any:
        if isinstance(obj, _core.Ref):
            return node.consts[obj.index] if obj.kind == _core.REF_CONST else env[obj.index]
        if isinstance(obj, tuple):
            return tuple(resolve(o) for o in obj)
        if isinstance(obj, list):
            return [resolve(o) for o in obj]
        if isinstance(obj, dict):
            return {k: resolve(v) for k, v in obj.items()}
        if isinstance(obj, slice):
            return slice(resolve(obj.start), resolve(obj.stop), resolve(obj.step))
        return obj

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    env: dict[int, Any] = {}
    try:
        with torch._C.DisableTorchFunctionSubclass():  # plain before the mode (torch 2.7's
            inputs = {port.vid: port.value.detach().as_subclass(torch.Tensor)  # detach there
                      for port in node.inputs if isinstance(port.value, torch.Tensor)}
        with mode, torch._C.DisableTorchFunctionSubclass():  # gives a FakeTensor already)
            for port_vid, value in inputs.items():
                env[port_vid] = mode.from_tensor(value)
            for func, args, kwargs, out in node.ops:
                result = func(*resolve(args), **resolve(kwargs or {}))
                if isinstance(out, tuple):
                    for one, value in zip(out, result):
                        env[one] = value
                elif isinstance(out, int):
                    env[out] = result
                if out == vid or (isinstance(out, tuple) and vid in out):
                    break
            return bool(free_unbacked_symbols(env[vid].shape))
    except Exception:  # noqa: BLE001  (what the replay cannot follow: say so)
        return True


def check_outputs(node: _core.Node, outputs: list[tuple[str, Any]]) -> None:
    """Pass 1's outputs whose shape the data decides (they come from nonzero, unique,
    masked_select, a boolean-mask index, ...): the bundle's port keeps the traced shape,
    on every backend.  Each selection they come from becomes a guard at its line (its
    shapes the values: a later pass that selects another count is refused there); the
    first time, a WARNING names the output, the line and the fix (strict_guards: refused)."""
    node_info = info(node)
    if not node_info.data_vids:
        return
    for name, value in outputs:
        carrier = _core.carrier_of(value) if isinstance(value, torch.Tensor) else None
        if carrier is None or not carrier.dynamic or carrier.node is not node \
                or not _shape_follows_data(node, carrier.vid):
            continue
        for site in _sources(node, carrier.vid):
            pending = node_info.data_shapes[site]
            if site in node_info.guards:
                continue
            node_info.guards[site] = pending
            _report(f"Output '{name}' of node '{node.name}' has a shape the data decides: "
                    f"it comes from {pending.what} at {_op_line(site)}, whose shape was "
                    f"{_shown(pending.values[0])} here, and the bundle's port keeps the traced "
                    f"shape {_shown(_shape_of(value))} for '{name}' on every input, on every "
                    f"backend (baked in). {_MASK_FIX} {_FIX}", "warning")


def _later_pass(first: _core.Node, node_info: NodeInfo, site: tuple, what: str,
                value: Any) -> None:
    count = node_info.guard_counts.get(site, 0)
    node_info.guard_counts[site] = count + 1
    guard = info(first).guards.get(site)
    if guard is not None and count < len(guard.values) and _same(guard.values[count], value):
        return
    if guard is None or count >= len(guard.values):
        seen = ("the first pass never read a value there"
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


_core._bind_guards(on_conversion, on_data_shape, torch.Tensor.__getitem__, torch.bool)
