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
node (kept for logging) is not named.

State kept in Python: a value the node computed, set on a module attribute
that held nothing the node read (``None`` before the first call) by code that
also reads that attribute (``out, self.h = self.rnn(x, self.h)``), is named at
WARNING with its path from the root module the node called
(``RNNModel.rnn.hidden_state``).  Every value the node computed and left on its
modules, their children or plain objects they hold is noted
(``NodeInfo.kept``): compile_graph's one-pass note lists them.  On the node's
second pass (:func:`later_pass` to :func:`end_later_pass`) a torch function
mode watches its ops: one that reads a value of the first pass, neither
published nor declared (wherever it was kept: rl_games' ``player.states`` too),
is named with the line that read it (refused under strict) and recorded
(``NodeInfo.kept_reads``) for validation's hint.  What the probes cannot see:
Python numbers (an int counter) and a counter updated in place under
``torch.inference_mode`` (its tensors keep no version): validation of a second
pass refuses those.
"""
from __future__ import annotations

import collections
import dis
import gc
import inspect
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .. import _core
from . import frames
from ..bundle.log import logger
from .node_info import info
from .session_checks import refuse_if_strict
from .session_state import SESSION

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
        self.watch: Any = None  # the _Watch of the nodes in their second pass
        self.named: set = set()  # (id(node), path) named when its first pass finished


_PROBES = _Probes()


def _user_frame() -> tuple[tuple[str, int], Any]:
    """((file, line), code object) of the nearest frame outside leapp and torch."""
    frame = frames.user_frame(1)
    return frames.site(frame), (frame.f_code if frame is not None else None)


def _user_site() -> tuple[str, int]:
    """(file, line) of the nearest frame outside leapp and torch."""
    return frames.user_site(1)


_LOADED: dict = {}  # code object -> the attribute names it loads


def _loads(code: Any, name: str) -> int:
    """How many times the function of code loads an attribute called name."""
    if code is None:
        return 0
    loaded = _LOADED.get(code)
    if loaded is None:
        loaded = collections.Counter(ins.argval for ins in dis.get_instructions(code)
                                     if ins.opname in ("LOAD_ATTR", "LOAD_METHOD"))
        if len(_LOADED) > 4096:
            _LOADED.clear()
        _LOADED[code] = loaded
    return loaded[name]


def _reads_back(code: Any, name: str) -> bool:
    """Whether the function whose code stored attribute name also loads an attribute of
    that name (``out, self.h = self.rnn(x, self.h)``): what it stores, its next call
    reads."""
    return _loads(code, name) > 0


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
            site, code = _user_frame()
            buffer = store is not None and name in store
            for records in _live():
                records.sets.append((module, name, old, value, site, buffer, code))
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
        _PROBES.session, _PROBES.warned, _PROBES.named = SESSION.config, set(), set()
    if torch.nn.Module.__dict__["__setattr__"] is not _setattr:
        install()
    _live()
    _hook()
    _PROBES.open[id(node)] = _Records(node)


def reset() -> None:
    """The session ends: probes removed, records dropped, no pass watched."""
    _unhook()
    if _PROBES.watch is not None:
        _pop_watch(_PROBES.watch)
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
                site, code = _user_frame()  # one entry per receiver and site: a loop adds none
                records.writes[(id(receiver), name, site)] = (receiver, name, site,
                                                              len(records.node.ops), code)
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


def _computed(value: Any, node: _core.Node) -> bool:
    """Whether value holds a value node computed (not one of its declared inputs)."""
    inputs = {port.vid for port in list(node.inputs) + list(node.trimmed_inputs)}
    for tensor in _tensors(value):
        carrier = _core.carrier_of(tensor)
        if carrier is not None and carrier.node is node and carrier.vid not in inputs:
            return True
    return False


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


def _owner_of(tensor: Any, modules: Iterator[torch.nn.Module]) -> tuple[Any, str] | None:
    """(module, attribute) of the module holding tensor, if one does."""
    for module in modules:
        for store in (module.__dict__.get("_buffers") or {}, module.__dict__.get(
                "_parameters") or {}, module.__dict__):
            for name, value in store.items():
                if value is tensor:
                    return module, name
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
    refuse_if_strict(message)
    logger.warning("%s", message)


def _module_paths(called: dict) -> dict[int, str]:
    """id(module) -> its path from the root module the node called (``RNNModel.rnn``): the
    root's class, then attribute names.  A parent's pre-hook runs before its children's,
    so the first module met of a tree is its root."""
    paths: dict[int, str] = {}
    for module in called.values():
        if id(module) in paths:
            continue
        root = type(module).__name__
        for prefix, sub in module.named_modules():
            paths.setdefault(id(sub), f"{root}.{prefix}" if prefix else root)
    return paths


_NOT_WALKED = ("torch", "numpy", "builtins", "leapp", "typing", "collections", "functools",
               "logging", "threading", "weakref", "abc", "enum")


def _walked(obj: Any) -> bool:
    """Whether obj is a plain object of user or library code whose attributes may hold a
    value kept for the next call (not a module, type, function, or torch's own)."""
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType,
                        types.BuiltinFunctionType, torch.nn.Module)):
        return False
    root = (type(obj).__module__ or "").partition(".")[0]
    return root not in _NOT_WALKED and type(getattr(obj, "__dict__", None)) is dict


def _kept_values(node: _core.Node, paths: dict[int, str], called: dict,
                 skip: set) -> list[tuple[str, Any, int]]:
    """(path, tensor, value id) of each value the node computed that is held by one of
    its modules, their children, or a plain object reachable from them (a list, a dict,
    an attribute of an attribute): not an input, declared state or a tracked buffer."""
    node_info = info(node)
    inputs = {port.vid for port in list(node.inputs) + list(node.trimmed_inputs)}
    updates = {c.vid for c in map(_core.carrier_of, node_info.state_updates.values())
               if c is not None}
    found: list[tuple[str, Any, int]] = []
    seen: set[int] = set()

    def visit(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            carrier = _core.carrier_of(obj)
            if carrier is not None and carrier.node is node and carrier.vid not in inputs \
                    and carrier.vid not in updates:
                found.append((path, obj, carrier.vid))
            return
        if depth > 3:
            return
        if isinstance(obj, (list, tuple, collections.deque)):
            for index, item in enumerate(list(obj)[:64]):
                visit(item, f"{path}[{index}]", depth + 1)
        elif isinstance(obj, dict):
            for key, item in list(obj.items())[:64]:
                if isinstance(key, (str, int)):
                    visit(item, f"{path}[{key!r}]", depth + 1)
        elif _walked(obj):
            for key, item in list(vars(obj).items()):
                visit(item, f"{path}.{key}", depth + 1)

    modules: dict[int, torch.nn.Module] = {}
    for module in called.values():
        for sub in module.modules():
            modules.setdefault(id(sub), sub)
    for key, module in modules.items():
        path = paths.get(key, type(module).__name__)
        attributes = module.__dict__
        for name, value in list((attributes.get("_buffers") or {}).items()):
            if (key, name) not in skip:
                visit(value, f"{path}.{name}", 1)
        for name, value in list(attributes.items()):
            if name not in _INTERNAL and not isinstance(value, torch.nn.Module) \
                    and (key, name) not in skip:
                visit(value, f"{path}.{name}", 1)
    return found


def _report_python(site: tuple[str, int], name: str, text: str, node: _core.Node) -> None:
    """A value kept in Python, named at WARNING (strict refuses it at the next pass's
    read, where there is proof: see later_pass)."""
    key = ("python", site, name)
    if key in _PROBES.warned:
        return
    _PROBES.warned.add(key)
    logger.warning("Node '%s': %s: %s", node.name, text, _fix(node.name, name))


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

    paths = _module_paths(records.called)
    tracked = {(id(entry.owner), entry.attr) for tracker in info(node).trackers
               for entry in tracker.tracked}

    def path_of(module: torch.nn.Module, name: str) -> str:
        return f"{paths.get(id(module), type(module).__name__)}.{name}"

    for module, name, old, new, site, buffer, code in records.sets:
        owner = path_of(module, name)
        where = f"{site[0]}:{site[1]}"
        if _computed(new, node) and not _of_node(old, node):
            if (id(module), name) in tracked:
                continue
            if read(old) or _reads_back(code, name):
                _PROBES.named.add((id(node), owner))  # a later pass's read: no 2nd warning
            if read(old):
                _report("kept", site, name,
                        f"{owner} is set at {where} to a value the node computed, for its "
                        f"next call, and the node read the previous value of {owner}", node)
            elif _reads_back(code, name):
                # Held nothing the node read (None before the first call, a buffer written
                # for the first time): the code storing it reads it back on the next call.
                _report_python(site, name,
                               f"{owner} is set at {where} to a value the node computed, and "
                               f"the code there reads {owner} back on its next call "
                               f"(state kept in Python between calls)", node)
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
                        f"the {kind} {path_of(module, name)} (stored into at "
                        f"{site[0]}:{site[1]}) keeps values the node computed, for its next "
                        f"call, next to values from earlier calls that the node read", node)
    kept = info(node).kept
    modules = list(records.called.values()) + [entry[0] for entry in records.sets]
    for receiver, op, site, before, code in records.writes.values():
        holder = _owner_of(receiver, iter(modules))
        # Read before the write: as a constant of the node, or by the code that writes it
        # (self.smooth.copy_(0.9 * self.smooth + x) loads self.smooth twice).
        if not _read(receiver, _constants(node, before)) \
                and (holder is None or _loads(code, holder[1]) < 2):
            if holder is not None:  # a module's tensor written, not read (yet): a later
                # pass that reads it names it (a tensor written for the environment is not)
                module, attr = holder
                kept.append((path_of(module, attr), None, weakref.ref(receiver), site, None))
            continue
        if holder is not None:
            _PROBES.named.add((id(node), path_of(*holder)))
        held = f"the tensor {path_of(*holder)}" if holder else \
            "a tensor from outside the node that it read before"
        name = holder[1] if holder else "value"
        _report("write", site, name,
                f"'{op}' at {site[0]}:{site[1]} writes a value of the node into {held}, "
                f"which is neither an input nor tracked state of the node", node)
    made = {record[3]: record[0] for record in node.ops}  # before the node is pruned
    for path, value, vid in _kept_values(node, paths, records.called, tracked):
        op = made.get(vid)
        kept.append((path, vid, weakref.ref(value), None,
                     None if op is None else getattr(op, "__name__", None) or repr(op)))


# ---- a node's second pass: the values of its first pass that it reads again --------

# Reads of a tensor's metadata, not of its values: they bake nothing into the graph.
_METADATA = frozenset({"size", "dim", "numel", "ndimension", "nelement", "stride",
                       "storage_offset", "is_contiguous", "is_floating_point", "is_complex",
                       "element_size", "data_ptr", "get_device", "untyped_storage",
                       "__len__", "__repr__", "__str__", "__format__", "__hash__"})
# In-place ops that overwrite their first argument without reading it.
_OVERWRITES = frozenset({"copy_", "fill_", "zero_", "__setitem__", "normal_", "uniform_"})
# Properties that give the values (every other property read is metadata).
_VALUE_PROPERTIES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})


@dataclass
class _Watched:
    """One node in its second pass: its input value ids, and what pass 1 kept."""

    node: Any
    inputs: set
    paths: dict   # value id -> (path, op) of a kept value of the node
    ids: dict     # id(tensor) -> ((path, op), weak reference) of a kept tensor


class _Watch(torch.overrides.TorchFunctionMode):
    """Pushed while a node runs its second pass (leapp.tracing.annotations re-enters it
    through later_pass, its output_tensors ends it): an op that reads a value the node
    computed on its first pass and nobody declared is state kept in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[int, _Watched] = {}
        self.pushed = False

    # torch calls it for every op of the pass, between the user's code and torch's own
    # frames: the frame walkers (a guard's site, the user's line) skip it as torch's
    @frames.seen_as_torch
    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if self.nodes:
            _look(self, func, args, kwargs)
        return func(*args, **kwargs)


def _look(watch: _Watch, func: Any, args: tuple, kwargs: dict) -> None:
    """Whether this op reads a kept value of a watched node; named where it does."""
    name = getattr(func, "__name__", "")
    if name in _METADATA or (name == "__get__" and getattr(
            getattr(func, "__self__", None), "__name__", None) not in _VALUE_PROPERTIES):
        return
    written = args[0] if name in _OVERWRITES and args else None
    for tensor in _tensors((args, kwargs)):
        if tensor is written:
            continue  # copy_ / fill_ / x[k] = v write it, they do not read it
        found: tuple[_Watched, tuple | None, int | None] | None = None
        for watched in watch.nodes.values():
            entry = watched.ids.get(id(tensor))
            if entry is not None and entry[1]() is tensor:
                found = (watched, entry[0], None)
                break
        if found is None:
            carrier = _core.carrier_of(tensor)
            if carrier is None or carrier.active or carrier.port is not None:
                continue  # plain, still tracing, or published (feedback is declared)
            owner = watch.nodes.get(id(carrier.node))
            if owner is None or carrier.vid in owner.inputs or carrier.node.in_tail:
                continue  # another node's, an input, or a late update being computed
            found = (owner, owner.paths.get(carrier.vid), carrier.vid)
        for frame in frames.outward(1):  # _look <- __torch_function__ <- the op's caller
            if not frames.in_torch(frame):
                break
        else:
            frame = None
        if frame is None or frames.in_leapp(frame):
            return  # leapp's own reads (state_tensors describing a value)
        _read_again(found[0].node, tensor, found[1], found[2], frames.site(frame))
        return


def _holder(tensor: Any) -> str | None:
    """Where user code keeps tensor, for the message: ``PpoPlayerContinuous.states[0]``
    (an attribute of an object, or an item of a list, tuple or dict held by one)."""
    def owner_of(mapping: dict) -> str | None:
        for obj in gc.get_referrers(mapping):
            if getattr(obj, "__dict__", None) is mapping:
                return type(obj).__name__
        return None

    def attribute(value: Any) -> str | None:
        for mapping in gc.get_referrers(value):
            if type(mapping) is dict:
                owner = owner_of(mapping)
                key = next((k for k, v in mapping.items() if v is value), None)
                if owner is not None and isinstance(key, str):
                    return f"{owner}.{key}"
        return None

    direct = attribute(tensor)
    if direct is not None:
        return direct
    for container in gc.get_referrers(tensor):
        if isinstance(container, (list, tuple)):
            index = next((i for i, item in enumerate(container) if item is tensor), None)
            held = attribute(container) if index is not None else None
            if held is not None:
                return f"{held}[{index}]"
    return None


def _state_name(path: str) -> str:
    """The name a fix declares a kept value under: the last attribute of its path."""
    last = path.split("[")[0].rsplit(".", 1)[-1]
    return last if last.isidentifier() else "state"


def _read_again(node: _core.Node, tensor: Any, kept: tuple | None, vid: int | None,
                site: tuple[str, int]) -> None:
    """A later pass of node reads, at site, a value its first pass kept ((path, the op
    that made it) when its first pass found where): warned once per site and recorded
    for validation's hint; refused under strict."""
    node_info = info(node)
    if any(seen[1:] == site for seen in node_info.kept_reads):
        return
    path, op = kept if kept is not None else (_holder(tensor), None)
    if op is None and vid is not None:
        record = next((record[0] for record in node.ops if record[3] == vid), None)
        op = None if record is None else getattr(record, "__name__", None) or repr(record)
    made = f" by '{op}'" if op else ""
    shape = list(tensor.shape)
    what = f"{path} (a tensor of shape {shape})" if path else f"a tensor of shape {shape}"
    node_info.kept_reads.append((path or f"a tensor of shape {shape}", *site))
    name = _state_name(path or "state")
    message = (
        f"Node '{node.name}': {what}, computed{made} on the node's previous pass and kept "
        f"in Python, is read at {site[0]}:{site[1]} on this pass: state kept in Python "
        f"between calls. The exported model holds the first pass's value as a constant, so "
        f"the bundle never carries it from one call to the next. Fix: make it state of node "
        f"'{node.name}': {name} = annotate.state_tensors('{node.name}', {{'{name}': "
        f"{name}}}) before the node reads it (put the returned value where the code reads "
        f"it) and annotate.update_state('{node.name}', {{'{name}': <new value>}}) with what "
        f"the node computes for its next call (docs/tracing.md, 'State kept in Python').")
    refuse_if_strict(message)
    if not any((id(node), named) in _PROBES.named for named in _prefixes(path)):
        logger.warning("%s", message)  # (named already when the first pass finished)


def _prefixes(path: str | None) -> list[str]:
    """path and the paths holding it: RNNModel.rnn.h[0] -> it, RNNModel.rnn.h, ..."""
    if not path:
        return []
    found = [path]
    while True:
        cut = max(path.rfind("["), path.rfind("."))
        if cut <= 0:
            return found
        path = path[:cut]
        found.append(path)


def later_pass(node: _core.Node) -> None:
    """node is re-entered (an input of a later pass declared): on its second pass, the
    values its first pass kept are watched until its output_tensors (end_later_pass)."""
    node_info = info(node)
    cfg = SESSION.config
    if node_info.passes != 1 or node_info.private or cfg is None or cfg.dry_run:
        return
    watch = _PROBES.watch
    if watch is None:
        watch = _PROBES.watch = _Watch()
    if id(node) in watch.nodes:
        return
    outputs = {port.vid for port in node.outputs}
    paths: dict[int, tuple] = {}
    ids: dict[int, tuple[tuple, Any]] = {}
    for path, vid, ref, _site, op in node_info.kept:
        value = ref()
        if value is None or vid in outputs:
            continue  # gone, or published: feedback when declared, validation otherwise
        if vid is not None:
            paths.setdefault(vid, (path, op))
        ids.setdefault(id(value), ((path, op), ref))
    watch.nodes[id(node)] = _Watched(
        node, {port.vid for port in list(node.inputs) + list(node.trimmed_inputs)}, paths, ids)
    if not watch.pushed:
        watch.__enter__()
        watch.pushed = True


def end_later_pass(node: _core.Node) -> None:
    """node's later pass ends (its output_tensors): no longer watched."""
    watch = _PROBES.watch
    if watch is None or watch.nodes.pop(id(node), None) is None or watch.nodes:
        return
    _pop_watch(watch)


def _pop_watch(watch: _Watch) -> None:
    watch.nodes.clear()
    stack = torch.overrides._get_current_function_mode_stack()
    if watch.pushed and stack and stack[-1] is watch:  # else another mode is above it:
        watch.__exit__(None, None, None)               # it stays, idle, until then
        watch.pushed = False


# ---- what the compile says of them -------------------------------------------------

def _kept_paths(node: _core.Node) -> list[str]:
    """The kept values of node's first pass that are not published outputs."""
    outputs = {port.vid for port in node.outputs}
    return list(dict.fromkeys(path for path, vid, _ref, _site, _op in info(node).kept
                              if vid is None or vid not in outputs))


def one_pass_note(name: str) -> str:
    """For the one-pass note of compile_graph: the values node name kept in Python."""
    node = _core.find_node(name)
    if node is None or "leapp" not in node.info:
        return ""
    paths = _kept_paths(node)
    if not paths:
        return ""
    shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
    return (f"; it keeps values it computed in Python ({shown}): if its next call reads "
            f"them, they are state to declare with annotate.state_tensors and "
            f"annotate.update_state")


def reentry_note(name: str) -> str:
    """For validation's hint when a later pass of node name failed: the values kept in
    Python that a later pass read (or, none seen, that the first pass kept)."""
    node = _core.find_node(name)
    if node is None or "leapp" not in node.info:
        return ""
    node_info = info(node)
    if node_info.kept_reads:
        read = "; ".join(f"{path} read at {file}:{line}"
                         for path, file, line in node_info.kept_reads[:4])
        return (f" State kept in Python between calls was read again on a later pass: "
                f"{read}. Declare it with annotate.state_tensors() before the node reads it "
                f"and bind its new value with annotate.update_state() (docs/tracing.md, "
                f"'State kept in Python').")
    paths = _kept_paths(node)
    if not paths:
        return ""
    return (f" The node keeps values it computed in Python ({', '.join(paths[:4])}); if it "
            f"reads them on its next call, declare them with annotate.state_tensors() and "
            f"annotate.update_state() (docs/tracing.md, 'State kept in Python').")
