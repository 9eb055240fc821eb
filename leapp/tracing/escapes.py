"""Values that escape a node: what user code keeps for the next call.

A node's graph holds its ops; a tensor from outside the node is a constant
of it, with the value it had on the traced pass.  Code that keeps a value of
the node for its next call (a previous output in an attribute, a history in
a list, a counter) and reads it back as such a constant exports a model that
replays the traced pass's value on every call.  With two traced passes
validation refuses it; with one, nothing would tell.  So, while a node
traces its first pass, three cheap probes note what user code does around
it (the forward pre-hook is registered while a node is in its first pass,
the ``__setattr__`` probe is a pass-through outside one; re-entry passes run
without them):

* ``nn.Module.__setattr__``: a tensor attribute (or a list or tuple holding
  tensors) set on a module, with the user's file and line;
* a global forward pre-hook: the modules called inside the node;
* :func:`on_plain_write` (from the in-place rewrite of leapp.tracing.ops): an
  in-place write of a traced value into a plain tensor, with its line.

When the node finishes (:func:`check`), its constants (the plain tensors its
op log holds) decide, so that what exports correctly stays quiet:

* an attribute set to a value of the node whose previous value the node read
  as a constant (``out = x + self.prev; self.prev = out``);
* an attribute changed while the node traced (``self.count += 1``, or
  reassigned to another value) that the node read as a constant;
* a list, tuple, deque or dict of a called module holding both values of the
  node and constants it read (``self.hist.append(x); torch.cat(self.hist)``);
* an in-place write of a value of the node into a tensor of a module (or one
  the node read as a constant) that is neither an input nor tracked state.

Each is named once per site at WARNING (refused under
``leapp.start(strict=True)``) with the fix: declared state
(``annotate.state_tensors`` / ``annotate.update_state``) or a buffer of a
module under ``annotate.module``.  A value stored and never read back by the
node (kept for logging) is not named.  What the probes cannot see: Python
numbers (an int counter), a counter updated in place under
``torch.inference_mode`` (its tensors keep no version), objects that are not
``nn.Module``\\ s, and a
place that held nothing the node read on the first pass (``None``): validation
of a second pass refuses those.
"""
from __future__ import annotations

import collections
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .. import _core
from ..bundle.log import fatal, logger
from .session_state import SESSION

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # leapp/
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_MODULE_SETATTR = torch.nn.Module.__dict__["__setattr__"]
# nn.Module's own bookkeeping attributes: never user state.
_INTERNAL = frozenset(vars(torch.nn.Module()))
_CONTAINERS = (list, tuple, dict, collections.deque)


@dataclass
class _Records:
    """What the probes saw while one node traces its first pass."""

    node: Any
    sets: list = field(default_factory=list)     # (module, name, old, new, site, buffer?)
    called: dict = field(default_factory=dict)   # id(module) -> module
    # (receiver id, op name, site) -> (receiver, op name, site, ops before its latest write)
    writes: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)  # id(tensor attribute) -> version at call


class _Probes:
    """The open first-pass nodes and the installed probes (one per process)."""

    def __init__(self) -> None:
        self.open: dict[int, _Records] = {}
        self.hook: Any = None
        self.warned: set = set()
        self.session: Any = None


_PROBES = _Probes()


def _user_site() -> tuple[str, int]:
    """(file, line) of the nearest frame outside leapp and torch."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_PACKAGE_DIR + os.sep) or name.startswith(_TORCH_DIR + os.sep)):
            return (name, frame.f_lineno)
        frame = frame.f_back
    return ("<unknown>", 0)


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(isinstance(item, torch.Tensor) for item in value)
    return False


def _live() -> list[_Records]:
    """The records of the nodes still in their first pass (a node left open by an
    exception is dropped; the probes go when none is left)."""
    records = list(_PROBES.open.values())
    if all(entry.node.is_tracing for entry in records):
        return records
    for key, entry in list(_PROBES.open.items()):
        if not entry.node.is_tracing:
            del _PROBES.open[key]
    if not _PROBES.open:
        _unhook()
    return list(_PROBES.open.values())


def _setattr(module: torch.nn.Module, name: str, value: Any) -> None:
    """nn.Module.__setattr__ while a node traces its first pass: note tensor attributes."""
    if _PROBES.open and name not in _INTERNAL and not isinstance(value, torch.nn.Module):
        store = module.__dict__.get("_buffers")
        old = store[name] if store is not None and name in store else \
            module.__dict__.get(name)
        if _has_tensor(value) or _has_tensor(old):
            site = _user_site()
            buffer = store is not None and name in store
            for records in _live():
                records.sets.append((module, name, old, value, site, buffer))
    _MODULE_SETATTR(module, name, value)


def _called(module: torch.nn.Module, args: Any) -> None:
    """The global forward pre-hook: module runs inside the open nodes (the versions of
    its tensor attributes noted, to tell an attribute updated in place from one set
    again unchanged)."""
    key = id(module)
    for records in _PROBES.open.values():
        if key in records.called:
            continue
        records.called[key] = module
        attributes = module.__dict__
        buffers = attributes.get("_buffers")
        for store in (buffers, attributes) if buffers else (attributes,):
            for value in store.values():
                if isinstance(value, torch.Tensor):
                    records.versions.setdefault(id(value), _version(value))


def _version(tensor: torch.Tensor) -> int | None:
    """tensor's version counter; None for an inference tensor (torch.inference_mode),
    which has none."""
    with torch._C.DisableTorchFunctionSubclass():
        try:
            return tensor._version
        except RuntimeError:
            return None


def install() -> None:
    """The session starts: nn.Module.__setattr__ probed (a pass-through while no node is
    in its first pass; patched once per session, as patching a class attribute of
    nn.Module costs a walk over all its subclasses)."""
    torch.nn.Module.__setattr__ = _setattr  # type: ignore[method-assign,assignment]


def _hook() -> None:
    if _PROBES.hook is None:
        _PROBES.hook = torch.nn.modules.module.register_module_forward_pre_hook(_called)


def _unhook() -> None:
    _PROBES.open.clear()
    if _PROBES.hook is not None:
        _PROBES.hook.remove()
        _PROBES.hook = None


def begin(node: _core.Node) -> None:
    """A node starts its first pass: probe until it finishes."""
    if SESSION.config is not _PROBES.session:  # a new session: sites warned anew
        _PROBES.session, _PROBES.warned = SESSION.config, set()
    if torch.nn.Module.__dict__["__setattr__"] is not _setattr:
        install()
    _live()
    _hook()
    _PROBES.open[id(node)] = _Records(node)


def reset() -> None:
    """The session ends: probes removed, records dropped."""
    _unhook()
    if torch.nn.Module.__dict__["__setattr__"] is _setattr:
        torch.nn.Module.__setattr__ = _MODULE_SETATTR  # type: ignore[method-assign]


def on_plain_write(func: Any, receiver: Any, args: tuple) -> None:
    """An in-place op of a tracing node writes into receiver, a plain tensor."""
    if not _PROBES.open:
        return
    for arg in _tensors(args):
        carrier = _core.carrier_of(arg)
        if carrier is not None and carrier.active:
            records = _PROBES.open.get(id(carrier.node))
            if records is not None:
                name = getattr(func, "__name__", None) or repr(func)
                site = _user_site()  # one entry per receiver and site: a loop adds none
                records.writes[(id(receiver), name, site)] = (receiver, name, site,
                                                              len(records.node.ops))
            return


# ---- the check at the node's finish -----------------------------------------------

def _tensors(obj: Any) -> Iterator[Any]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple, collections.deque)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _storage(tensor: torch.Tensor) -> int:
    with torch._C.DisableTorchFunctionSubclass():
        try:
            return tensor.untyped_storage().data_ptr()
        except RuntimeError:  # a tensor without storage (meta, sparse)
            return 0


def _constants(node: _core.Node, end: int | None = None) -> tuple[set[int], set[int]]:
    """(ids, memory addresses) of the plain tensors the node's ops read (its constants
    from outside), in its first end records (all by default): a view of a tensor read
    counts as the tensor read."""
    # Values of the node itself are Refs in the records: every tensor there is a constant.
    ids: set[int] = set()
    memory: set[int] = set()
    for record in node.ops[:end]:
        for tensor in _tensors((record[1], record[2])):
            ids.add(id(tensor))
            memory.add(_storage(tensor))
    memory.discard(0)
    return ids, memory


def _of_node(value: Any, node: _core.Node) -> bool:
    """Whether value holds a value of node (itself, or in a list, tuple or dict)."""
    for tensor in _tensors(value):
        carrier = _core.carrier_of(tensor)
        if carrier is not None and carrier.node is node:
            return True
    return False


def _read(value: Any, constants: tuple[set[int], set[int]]) -> bool:
    ids, memory = constants
    return any(id(tensor) in ids or _storage(tensor) in memory for tensor in _tensors(value))


def _changed(old: Any, new: Any, versions: dict) -> bool:
    """Whether a plain tensor attribute holds another value than before: set again after
    an in-place update (self.count += 1; its version moved on since its module was
    called), or replaced by a tensor of another shape or other values (a copy on
    another device or in another dtype with the same values is the same)."""
    if new is old:
        seen = versions.get(id(new))
        if not isinstance(new, torch.Tensor) or seen is None:
            return False
        now = _version(new)
        return now is not None and now != seen
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
        return old is not None
    with torch._C.DisableTorchFunctionSubclass():
        if old.shape != new.shape:
            return True
        try:
            return not torch.equal(old.detach().to(new.device, new.dtype), new.detach())
        except (RuntimeError, TypeError):  # values that do not compare: not evidence
            return False


def _owner_of(tensor: Any, modules: Iterator[torch.nn.Module]) -> tuple[str, str] | None:
    """(module class, attribute) of the module holding tensor, if one does."""
    for module in modules:
        for store in (module.__dict__.get("_buffers") or {}, module.__dict__.get(
                "_parameters") or {}, module.__dict__):
            for name, value in store.items():
                if value is tensor:
                    return type(module).__name__, name
    return None


def _source_line(module: torch.nn.Module, name: str) -> tuple[str, int]:
    """The line of module's class that stores into self.<name> (best effort)."""
    try:
        lines, first = inspect.getsourcelines(type(module))
        file = inspect.getsourcefile(type(module)) or "<unknown>"
    except (OSError, TypeError):
        return ("<unknown>", 0)
    patterns = [f"self.{name}.{verb}(" for verb in ("append", "appendleft", "extend",
                                                      "insert", "update", "__setitem__")]
    patterns += [f"self.{name}[", f"self.{name} =", f"self.{name} +="]
    for pattern in patterns:
        for offset, text in enumerate(lines):
            if pattern in text and "def __init__" not in text:
                return (file, first + offset)
    return (file, first)


def _fix(node: str, name: str) -> str:
    return (f"it is a constant in the exported model, which replays this pass's value on "
            f"every call while the code here changes it from call to call. Fix: make it state "
            f"of node '{node}': {name} = annotate.state_tensors('{node}', {{'{name}': {name}}}) "
            f"before the node reads it and annotate.update_state('{node}', {{'{name}': "
            f"<new value>}}) with what the node computes for the next call; or register it as "
            f"a buffer of an nn.Module tracked with annotate.module('{node}', module). A value "
            f"kept only for logging and never read back inside a node is not reported.")


def _report(kind: str, site: tuple[str, int], name: str, text: str, node: _core.Node) -> None:
    key = (kind, site, name)
    if key in _PROBES.warned:
        return
    _PROBES.warned.add(key)
    message = f"Node '{node.name}': {text}: {_fix(node.name, name)}"
    cfg = SESSION.config
    if cfg is not None and cfg.strict:
        fatal(message + " (strict mode: leapp.start(strict=True) or LEAPP_STRICT=1)",
              RuntimeError)
    logger.warning("%s", message)


def check(node: _core.Node) -> None:
    """The node finishes its first pass: name what escaped it (see the module doc)."""
    records = _PROBES.open.pop(id(node), None)
    if not _PROBES.open:
        _unhook()
    if records is None or not (records.sets or records.called or records.writes):
        return
    constants: tuple[set[int], set[int]] | None = None

    def read(value: Any) -> bool:
        nonlocal constants
        if constants is None:
            constants = _constants(node)
        return _read(value, constants)

    for module, name, old, new, site, buffer in records.sets:
        # A registered buffer is state by definition: replaced by a value of the node, it
        # is named without evidence that the node read it (a plain attribute needs that).
        owner = f"{type(module).__name__}.{name}"
        where = f"{site[0]}:{site[1]}"
        buffer = buffer and isinstance(old, torch.Tensor)
        if _of_node(new, node) and not _of_node(old, node) and (buffer or read(old)):
            _report("kept", site, name,
                    f"{owner} is set at {where} to a value the node computed, for its next "
                    f"call, and the node read the previous value of {owner}", node)
        elif not _of_node(new, node) and not _of_node(old, node) \
                and _changed(old, new, records.versions) \
                and (read(new) or read(old)):
            _report("changed", site, name,
                    f"{owner} changes at {where} while the node traces (a counter or a "
                    f"value kept across calls), and the node reads it", node)
    for module in records.called.values():
        for name, value in list(vars(module).items()):
            if type(value) not in _CONTAINERS or not value or name in _INTERNAL:
                continue
            if _of_node(value, node) and read(value):
                site = _source_line(module, name)
                kind = type(value).__name__
                _report("history", site, name,
                        f"the {kind} {type(module).__name__}.{name} (stored into at "
                        f"{site[0]}:{site[1]}) keeps values the node computed, for its next "
                        f"call, next to values from earlier calls that the node read", node)
    modules = list(records.called.values()) + [entry[0] for entry in records.sets]
    for receiver, op, site, before in records.writes.values():
        holder = _owner_of(receiver, iter(modules))
        if holder is None and not _read(receiver, _constants(node, before)):
            continue  # a tensor the node made for itself (not read before the write)
        held = f"the tensor {holder[0]}.{holder[1]}" if holder else \
            "a tensor from outside the node that it read before"
        name = holder[1] if holder else "value"
        _report("write", site, name,
                f"'{op}' at {site[0]}:{site[1]} writes a value of the node into {held}, "
                f"which is neither an input nor tracked state of the node", node)
