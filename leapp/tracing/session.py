"""The traced slow paths of the annotations, run while a session is active.

The C core answers annotations directly when no session runs; with one, it
calls into SessionAPI.  Node contexts, ports, the op log and provenance live
in C objects (leapp._core.Node / Port / Carrier); this module walks payloads,
raises the clear errors, and drives the node lifecycle:

  pass 1 of a node: input_tensors declares ports and returns traced values,
  ops are recorded by the C handler, output_tensors prunes, builds the
  GraphModule, publishes the output ports and closes the node;
  later passes: the same calls check the structure against pass 1, fill in a
  missing source (inferred feedback) and cache samples for validation.

Declared state (state_tensors / update_state / register_buffer / module) is
part of that lifecycle.  Next to it: _origins (call sites, re-run detection),
_method (@annotate.method) and _mirror (mirror_leapp_tags).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from . import alias as _alias, guards as _guards, method as _method, mirror as _mirror, numpy_array as _numpy
from .. import _core
from .fx import build_graph_module
from .buffers import BufferTracker
from ..bundle.log import fatal, logger
from .node_info import NodeInfo, info
from .origins import call_site, check_origin
from .payload import Leaf, flatten, normalize, rebuild
from .state import SESSION, SessionConfig
from .traced import TracedTensor, alias, clone_plain, plain


def config() -> SessionConfig | None:
    """The running (or last) session's configuration."""
    return SESSION.config


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _describe(value: torch.Tensor) -> tuple[str, tuple]:
    return _core.dtype_name(value), tuple(int(s) for s in value.shape)


def _listed(value: Any) -> Any:
    """Tuples as lists, recursively (descriptions print like upstream's)."""
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    return value


def _description_text(name: str, dtype: str, shape: tuple,
                      semantics: dict | None = None) -> str:
    """A port description for messages: the YAML entry as a dict, semantic fields last."""
    entry: dict[str, Any] = {"name": name, "dtype": dtype, "shape": [int(s) for s in shape],
                             "type": "tensor"}
    entry.update({key: _listed(value) for key, value in (semantics or {}).items()})
    return repr(entry)


def _port_names(node: _core.Node, outputs: bool) -> list[str]:
    ports = node.outputs if outputs else list(node.inputs) + list(node.trimmed_inputs)
    return [p.name for p in ports]


def _thread_text(ident: int | None) -> str:
    """'name' (ident N) of a live thread, for messages."""
    for thread in threading.enumerate():
        if thread.ident == ident:
            return f"'{thread.name}' (ident {ident})"
    return f"ident {ident}"


def check_session_thread(what: str) -> None:
    """Refuse what (e.g. 'leapp.stop()') outside the thread owning the running session."""
    owner = _core.session_thread()
    if owner is None or owner == threading.get_ident():
        return
    if all(thread.ident != owner for thread in threading.enumerate()):
        logger.warning("%s: the thread that started the session has ended; the session is "
                       "handed to thread %s.", what, _thread_text(threading.get_ident()))
        return
    API.refuse_thread(what)


class SessionAPI:
    """The annotations' implementation while a session runs (and their payload checks)."""

    # ---- threads --------------------------------------------------------------

    def refuse_thread(self, what: str) -> None:
        """Raise the error for a session call from a thread that does not own it.

        A session traces the thread that called leapp.start(): node contexts
        and their op logs are per session, not per thread, so another thread's
        annotations or ops on traced values would interleave with the owner's
        records.  The C core calls this for annotations, @annotate.method calls
        and traced ops coming from another thread while a session runs.
        """
        owner = _core.session_thread()
        fatal(f"{what} was called from thread {_thread_text(threading.get_ident())} while the "
              f"LEAPP tracing session belongs to thread {_thread_text(owner)}, the thread that "
              f"called leapp.start(). A session traces one thread: run the annotated code, "
              f"and the torch ops on its traced values, in that thread (several nodes may be "
              f"traced there one after another), or call leapp.stop() there before other "
              f"threads use the annotations.")

    # ---- node lookup ------------------------------------------------------

    def _new_node(self, name: str) -> Any:
        if not isinstance(name, str) or not name:
            raise TypeError(f"node_name must be a non-empty str, got {name!r}")
        node = _core.Node(name)
        node.info["leapp"] = NodeInfo()
        _core.register_node(node)
        logger.info("Node context initialized: %s", name)
        return node

    def _existing(self, api: str, name: str) -> Any:
        node = _core.find_node(name)
        if node is None:
            fatal(f"{api}() called for node '{name}' but node not found. Call "
                  f"annotate.input_tensors('{name}', ...) first to open the node.")
        return node

    # ---- inputs -------------------------------------------------------------

    def input_tensors(self, node_name: str, tensors: Any, _origin: Any = None) -> Any:
        """Declare node inputs; returns traced values (plain ones on re-entry)."""
        values, fields = normalize("input_tensors", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {})
        node = _core.find_node(node_name) or self._new_node(node_name)
        check_origin(node, _origin if _origin is not None else call_site())
        return self._declare(node, values, fields, state=False)

    def _declare(self, node: _core.Node, values: dict, fields: dict, state: bool) -> Any:
        replaced: dict[tuple, Any] = {}
        for leaf in flatten(values, fields):
            array = leaf.value if isinstance(leaf.value, np.ndarray) else None
            if array is not None:  # NumPy inputs are declared as the tensor they view
                leaf = Leaf(leaf.name, _numpy.as_payload_tensor(array), leaf.semantics,
                            leaf.path)
            if not _is_tensor(leaf.value):
                logger.warning("Input '%s' of node '%s' is a %s, not a tensor: it will be passed "
                               "through as a constant.", leaf.name, node.name,
                               type(leaf.value).__name__)
                continue
            if node.is_tracing:
                traced = self._new_input(node, leaf, state)
                replaced[leaf.path] = _numpy.wrap(traced) if array is not None else traced
            else:
                value = self._reenter_input(node, leaf)
                if _guards.needs_shadow(node):  # pass 1 read values into Python: check them
                    value = self._shadow_input(node, leaf.name, value)
                    replaced[leaf.path] = _numpy.wrap(value) if array is not None else value
                    continue
                replaced[leaf.path] = _numpy.plain_array(array) if array is not None else value
        return rebuild(values, replaced)

    def _shadow_input(self, node: _core.Node, name: str, value: Any) -> Any:
        """value as an input of this later pass's shadow node (leapp.tracing.guards)."""
        shadow = _guards.shadow_of(node, name)
        traced = value if type(value) is torch.Tensor else alias(value)
        _core.set_carrier(traced, shadow, shadow.new_value(), None, True)
        info(shadow).declared.append((name, weakref.ref(traced)))
        return traced

    def _check_unique(self, node: _core.Node, name: str, outputs: bool = False,
                      taken: list | None = None) -> None:
        names = taken if taken is not None else _port_names(node, outputs)
        if name in names:
            existing = "{" + ", ".join(repr(n) for n in dict.fromkeys(names)) + "}"
            fatal(f"Duplicate i/o name '{name}' in node '{node.name}'. \nCurrently existing "
                  f"names: {existing}\nEach input/output in the same node must have a unique "
                  f"name.\nError: Duplicate name '{name}' among the "
                  f"{'outputs' if outputs else 'inputs'} of node '{node.name}'. Each "
                  f"input/output must have a unique name: rename one of them."
                  + (OPEN_NODE_HINT if not outputs and node.is_tracing and taken is None
                     else ""))

    def _new_input(self, node: _core.Node, leaf: Leaf, state: bool) -> Any:
        self._check_unique(node, leaf.name)
        value = leaf.value
        carrier = _core.carrier_of(value)
        src_node = src_port = None
        if carrier is not None and carrier.active:
            if carrier.node is not node:
                fatal(f"Error: when creating inputs for '{node.name}', detected data "
                      f"'{leaf.name}' is an active TracedTensor from a different node "
                      f"'{carrier.node.name}'. \nMixing active contexts is not allowed. Call "
                      f"output_tensors() on the source node first.\nFinish "
                      f"'{carrier.node.name}' with annotate.output_tensors('{carrier.node.name}'"
                      f", ...) before its values are declared as inputs of '{node.name}'.")
            logger.warning("Input '%s' of node '%s' is already a traced value of this node; "
                           "it is declared again as a new input.", leaf.name, node.name)
        elif carrier is None:
            self._check_derived(node, leaf.name, value)
        elif carrier is not None:
            if carrier.port is not None:
                src_node, src_port = carrier.node, carrier.port
            elif not carrier.declared:
                logger.warning(
                    "%s Publish it with annotate.output_tensors('%s', ...) to wire it.",
                    _unregistered_text(leaf.name, node.name, carrier.node.name),
                    carrier.node.name)
            else:
                self._check_written_elsewhere(node, leaf.name, value, carrier)
        node_info = info(node)
        declared = node_info.declared_inputs()
        same = _alias.twin(value, declared) if src_port is None else None
        if same is not None:
            return self._adopt_declared(node, leaf, value, *same)
        dtype, shape = _describe(value)
        vid = node.new_value()
        port = _core.Port(leaf.name, dtype, shape, vid, clone_plain(value), leaf.semantics)
        port.src_node, port.src_port = src_node, src_port
        port.is_state = 1 if state else 0
        node.add_input(port)
        traced = value if type(value) is torch.Tensor else alias(value)
        _core.set_carrier(traced, node, vid, None, True)
        if traced is not value and carrier is not None:
            _alias.join(value, traced)  # one memory, two nodes' values
        _alias.link_declared(node, traced, [t for _, t in declared])
        node_info.declared.append((leaf.name, weakref.ref(traced)))
        return traced

    def _check_written_elsewhere(self, node: _core.Node, name: str, value: Any,
                                 carrier: Any) -> None:
        """Warn (strict: refuse) when value is an input that another, finished node
        declared and then wrote in place: the export would feed this node the value
        given from outside, not the one the other node wrote."""
        writer = carrier.node
        ports = list(writer.inputs) + list(writer.trimmed_inputs)
        if any(port.vid == carrier.vid for port in ports):
            return  # declared there and never written: the same outside value
        declared_as = next((n for n, t in info(writer).declared_inputs() if t is value), None)
        op = next((_op_name(record[0]) for record in reversed(writer.ops)
                   if record[3] == carrier.vid), None)
        file, line = call_site()
        how = f" (by '{op}', an in-place op recorded in its functional form)" if op else ""
        as_input = f" after declaring it as its input '{declared_as}'" if declared_as else ""
        message = (
            f"{_unregistered_text(name, node.name, writer.name, upstream_style=True)}\n"
            f"Node '{writer.name}' wrote tensor '{name}' in place{how}{as_input}, and node "
            f"'{node.name}' declares it as input '{name}' at {file}:{line}: the exported "
            f"pipeline feeds '{node.name}/{name}' the value given from outside, not the one "
            f"'{writer.name}' wrote, so it would not compute what ran here. Fix: publish the "
            f"written value with annotate.output_tensors('{writer.name}', {{'{name}': ...}}) "
            f"and declare that output in '{node.name}', or clone() the input inside "
            f"'{writer.name}' before writing to it.")
        cfg = SESSION.config
        if cfg is not None and cfg.strict:
            fatal(message + " (strict mode: leapp.start(strict=True) or LEAPP_STRICT=1)",
                  RuntimeError)
        logger.error("%s", message)

    def _check_derived(self, node: _core.Node, name: str, value: Any) -> None:
        """Warn (strict: refuse) when value was computed outside every node from an output."""
        tag = getattr(value, "__dict__", {}).get(_DERIVED) if type(value) is TracedTensor \
            else None
        if not tag or not isinstance(tag, tuple) or len(tag) != 3:
            return
        src_node, src_port, op = tag
        if _core.find_node(src_node) is None:
            return  # a tag left from an earlier session
        message = (f"Input '{name}' of node '{node.name}' was computed outside every node by "
                   f"'{op}' from output '{src_port}' of node '{src_node}': it becomes a new "
                   f"graph input, so the exported pipeline will not compute what ran here. "
                   f"Do that computation inside a node (e.g. in '{src_node}' before "
                   f"annotate.output_tensors, or in '{node.name}' after "
                   f"annotate.input_tensors), or declare the input from the output itself.")
        cfg = SESSION.config
        if cfg is not None and cfg.strict:
            fatal(message + " (strict mode: leapp.start(strict=True) or LEAPP_STRICT=1)",
                  RuntimeError)
        logger.warning("%s If it is meant to enter the pipeline from outside (e.g. an "
                       "environment step), this is what happens and the warning can be "
                       "ignored. Pass strict=True to leapp.start() to make this an error.",
                       message)

    def _adopt_declared(self, node: _core.Node, leaf: Leaf, value: torch.Tensor, name: str,
                        other: torch.Tensor) -> Any:
        """A second declaration of one buffer (same memory, same layout): one port."""
        port = next((p for p in list(node.inputs) + list(node.trimmed_inputs)
                     if p.name == name), None)
        if port is None:
            fatal(f"State tensor '{name}' of node '{node.name}' is missing its input "
                  f"description.")
        logger.info("Input '%s' for node '%s' shares memory with declared input '%s'. Both "
                    "names describe one graph value, so '%s' will be the only port in the "
                    "exported node interface.", leaf.name, node.name, name, name)
        if leaf.semantics is not None and port.semantics is None:
            port.semantics = leaf.semantics
        if leaf.name != name:
            info(node).input_aliases[leaf.name] = name
        if value is other:
            return other
        traced = value if type(value) is torch.Tensor else alias(value)
        _core.set_carrier(traced, node, _core.carrier_of(other).vid, None, True)
        _alias.link_declared(node, traced, [other])
        return traced

    def _find_port(self, node: _core.Node, name: str, outputs: bool) -> Any:
        ports = node.outputs if outputs else list(node.inputs) + list(node.trimmed_inputs)
        for port in ports:
            if port.name == name:
                return port
        available = [p.name for p in ports]
        fatal(f"Validation error when reentering node '{node.name}': Error: Reentering "
              f"{node.name} with new i/o {name} but failed to find it in the current i/o "
              f"list.\navailable i/o names: {available}")

    def _check_same(self, node: _core.Node, port: _core.Port, leaf: Leaf) -> None:
        dtype, shape = _describe(leaf.value)
        semantics = leaf.semantics
        changed_semantics = semantics is not None and semantics != port.semantics
        if dtype != port.dtype or shape != tuple(port.shape) or changed_semantics:
            old = _description_text(port.name, port.dtype, port.shape, port.semantics)
            # As upstream prints it: the new description carries the semantic
            # fields only when those are what changed.
            new = _description_text(port.name, dtype, shape,
                                    semantics if changed_semantics else None)
            first = {"dtype": port.dtype, "shape": list(port.shape), **(port.semantics or {})}
            now = {"dtype": dtype, "shape": list(shape),
                   **(semantics if changed_semantics else port.semantics or {})}
            changes = "; ".join(f"{key}: {_listed(first.get(key))} (first pass) vs {key}: "
                                f"{_listed(now.get(key))} (now)" for key in dict.fromkeys(
                                    [*first, *now]) if first.get(key) != now.get(key))
            fatal(f"Validation error when reentering node '{node.name}': Error: Reentering "
                  f"{node.name} with new i/o {leaf.name} \nbut the description has changed "
                  f"from {old} to {new}.\nThis can happen if some dynamic "
                  f"behavior is not captured by the annotations\nWhat changed: {changes}. "
                  f"Every pass must give '{leaf.name}' the structure of the first one.")

    def _cache(self, node: _core.Node, port: _core.Port, value: torch.Tensor) -> None:
        cfg = SESSION.config
        if cfg is not None and info(node).samples < cfg.max_cached_io - 1:
            info(node).pending[id(port)] = (port, clone_plain(value))

    def _reenter_input(self, node: _core.Node, leaf: Leaf) -> Any:
        surviving = info(node).input_aliases.get(leaf.name)
        if surviving is not None:  # a second name of one declared buffer
            port = self._find_port(node, surviving, outputs=False)
            self._check_same(node, port, Leaf(surviving, leaf.value, leaf.semantics, leaf.path))
            return plain(leaf.value)
        port = self._find_port(node, leaf.name, outputs=False)
        self._check_same(node, port, leaf)
        carrier = _core.carrier_of(leaf.value)
        if port.src_node is None and carrier is not None and carrier.port is not None \
                and not carrier.active:
            # A dangling input now fed by a published value: inferred feedback.
            port.src_node, port.src_port = carrier.node, carrier.port
        self._cache(node, port, leaf.value)
        return plain(leaf.value)

    # ---- outputs ------------------------------------------------------------

    def output_tensors(self, node_name: str, tensors: Any, static_outputs: Any = None,
                       export_with: str | None = None, backend_params: dict | None = None,
                       **kwargs: Any) -> Any:
        """Finish the node (pass 1) or check and cache its outputs (later passes)."""
        if kwargs:
            raise TypeError(f"output_tensors() got unexpected keyword arguments "
                            f"{sorted(kwargs)}; accepted: static_outputs, export_with, "
                            f"backend_params")
        values, fields = normalize("output_tensors", node_name, tensors)
        statics = normalize("output_tensors static_outputs", node_name, static_outputs) \
            if static_outputs is not None else ({}, {})
        if not _core.is_tracing():
            return rebuild(values, {})
        node = _core.find_node(node_name)
        if node is None:
            fatal(f"output_tensors() called for node '{node_name}' but input_tensors() was "
                  f"never called for it. Call annotate.input_tensors('{node_name}', ...) first.")
        leaves = list(flatten(values, fields))
        static_leaves = [_tensor_leaf(leaf, True) for leaf in flatten(*statics)]
        if node.is_tracing:
            self._finish(node, [_tensor_leaf(leaf, False) for leaf in leaves], static_leaves,
                         export_with, backend_params or {})
            return rebuild(values, {})
        self._reenter_outputs(node, [_tensor_leaf(leaf, True) for leaf in leaves],
                              static_leaves)
        _guards.end_pass(node)
        # The payload as passed; a leaf still traced (a value of another node
        # passed through) comes back plain, in a rebuilt container.
        unwrapped = ((leaf, _numpy.plain_array(leaf.value)
                      if isinstance(leaf.value, np.ndarray) else plain(leaf.value))
                     for leaf in leaves)
        return rebuild(values, {leaf.path: value for leaf, value in unwrapped
                                if value is not leaf.value})

    def _check_outputs(self, api: str, node: _core.Node, leaves: list[Leaf]) -> None:
        untraced = [f"{leaf.name}: {type(leaf.value).__name__}" for leaf in leaves
                    if _core.carrier_of(leaf.value) is None]
        if untraced:
            fatal(f"{api}() for node '{node.name}' received non-traced tensors: {untraced}\n"
                  f"Possible causes:\n"
                  f"  1. raw tensors were passed that never went through the node's inputs "
                  f"(use static_outputs= for constants);\n"
                  f"  2. the trace was broken, e.g. by a numpy round-trip or .item();\n"
                  f"  3. the value returned by annotate.input_tensors() was not used.")
        foreign = [leaf for leaf in leaves if _core.carrier_of(leaf.value).node is not node
                   or not _core.carrier_of(leaf.value).active]
        if foreign:
            owners = {_core.carrier_of(leaf.value).node.name for leaf in leaves}
            owners_text = "{" + ", ".join(repr(n) for n in sorted(owners)) + "}"
            which = [f"{leaf.name} (node '{_core.carrier_of(leaf.value).node.name}')"
                     for leaf in foreign]
            fatal(f"{api}() for node '{node.name}' received tensors that belong to a different "
                  f"node: {owners_text}.\n Make sure you are passing tensors derived from "
                  f"annotate.input_tensors('{node.name}', ...) to annotate.{api}"
                  f"('{node.name}', ...).\nThe tensors from elsewhere: {which}. Declare them "
                  f"with annotate.input_tensors('{node.name}', ...) to use them here.")

    def _finish(self, node: _core.Node, leaves: list[Leaf], static_leaves: list[Leaf],
                export_with: str | None, backend_params: dict) -> None:
        node_info = info(node)
        cfg = SESSION.config
        skip = cfg is not None and (cfg.dry_run or node.name in cfg.non_traced)
        # Everything that can be refused is checked before the node changes.
        if not skip and export_with is not None:
            from ..compiling.backends import check_backend
            check_backend(node.name, export_with, backend_params)
        self._check_outputs("output_tensors", node, leaves)
        updates = list(node_info.state_updates.values())
        for tracker in node_info.trackers:
            updates.extend(tracker.reassigned(node).values())
        _alias.check_outputs(node, node_info.declared_inputs(),
                             [(leaf.name, leaf.value) for leaf in leaves], updates)
        for leaf in static_leaves:
            if _core.carrier_of(leaf.value) is not None or type(leaf.value) is TracedTensor:
                fatal(f"Error: static output '{leaf.name}' is a traced TracedTensor. Static "
                      f"outputs should be constant tensors, not traced computations.\nCannot "
                      f"create static output from traced tensor '{leaf.name}' of node "
                      f"'{node.name}': return traced values through the tensors argument "
                      f"instead.")
            if not _is_tensor(leaf.value):
                fatal(f"Error: static output '{leaf.name}' has type "
                      f"{type(leaf.value).__name__} but expected a raw tracable data type.\n"
                      f"**Static outputs must be raw tensors, not derived from input tensors.**"
                      f"\nIf this value depends on inputs, use it as a regular output tensor "
                      f"instead. (A static output is a torch.Tensor.)", TypeError)
        names = [leaf.name for leaf in leaves + static_leaves]
        for index, name in enumerate(names):
            if name in names[:index]:
                self._check_unique(node, name, outputs=True, taken=names[:index])
        self._check_static_over_state(node, static_leaves)
        for tracker in node_info.trackers:
            tracker.collect(self, node)
        # Output order: regular outputs, then updated states (in declaration
        # order), then static outputs.  A state named like a regular output
        # takes that output's place; a static output named like a state takes
        # the state's place (its value is what the state port then carries).
        outputs: dict[str, Any] = {}
        for leaf in leaves:
            outputs[leaf.name] = self._output_port(leaf, _core.carrier_of(leaf.value).vid)
        shadowed = self._merge_states(node, outputs)
        for leaf in static_leaves:
            vid = node.bind_const(clone_plain(leaf.value))
            previous = outputs.get(leaf.name)
            if previous is None:
                outputs[leaf.name] = self._output_port(leaf, vid)
                continue
            logger.warning("Static output '%s' of node '%s' has the name of an updated state: "
                           "the state port carries the static value.", leaf.name, node.name)
            previous.vid, previous.value = vid, clone_plain(leaf.value)
        node.add_outputs(list(outputs.values()))
        self._prune(node)
        for tracker in node_info.trackers:
            tracker.restore()
        node_info.export_with = None if skip else export_with
        node_info.backend_params = dict(backend_params)
        node_info.graph_module = build_graph_module(
            node, node_info.live_ops, list(node.inputs), [p.vid for p in node.outputs])
        for leaf in leaves:
            carrier = _core.carrier_of(leaf.value)
            if leaf.name in shadowed:  # replaced by the state update of the same name
                continue
            if carrier.port is None:  # one value published twice keeps its first port
                carrier.port = leaf.name
            _core.remember(leaf.value)  # the caller holds it: a plain tensor after stop()
        for name, value in node_info.state_updates.items():
            carrier = _core.carrier_of(value)
            if carrier is not None and carrier.port is None:
                carrier.port = name
            _core.remember(value)
        node.finish()

    def _output_port(self, leaf: Leaf, vid: int) -> Any:
        dtype, shape = _describe(leaf.value)
        return _core.Port(leaf.name, dtype, shape, vid, clone_plain(leaf.value), leaf.semantics)

    def _merge_states(self, node: _core.Node, outputs: dict) -> set[str]:
        """Add the updated states to outputs (name -> Port), in declaration order.

        A state named like a regular output replaces it in place, keeping the
        regular output's semantics; returns the names replaced that way.
        Declared states never updated stay regular inputs.
        """
        node_info = info(node)
        shadowed: set[str] = set()
        for name, port in node_info.states.items():
            value = node_info.state_updates.get(name)
            if value is None:
                logger.warning("State '%s' of node '%s' was declared but never passed to "
                               "update_state(); it stays a regular input.", name, node.name)
                port.is_state = 0
                continue
            previous = outputs.get(name)
            semantics = port.semantics
            if previous is not None:
                logger.warning("Output '%s' of node '%s' has the name of an updated state: the "
                               "state's new value replaces it.", name, node.name)
                semantics = previous.semantics
                shadowed.add(name)
            vid = _core.carrier_of(value).vid
            out = self._output_port(Leaf(name, value, semantics, (name,)), vid)
            out.is_state = 1
            outputs[name] = out
            port.src_node, port.src_port = node, name
        return shadowed

    def _check_static_over_state(self, node: _core.Node, static_leaves: list[Leaf]) -> None:
        """A static output named like an updated state must match it in dtype and shape."""
        node_info = info(node)
        updates = dict(node_info.state_updates)
        for tracker in node_info.trackers:
            updates.update(tracker.reassigned(node))
        for leaf in static_leaves:
            port = node_info.states.get(leaf.name)
            if port is None or leaf.name not in updates:
                continue
            dtype, shape = _describe(leaf.value)
            if dtype != port.dtype or shape != tuple(port.shape):
                fatal(f"Error: static output '{leaf.name}' of node '{node.name}' has the name "
                      f"of an updated state, so it replaces the state's new value, but it has "
                      f"shape {list(shape)} and dtype {dtype} where the state has shape "
                      f"{list(port.shape)} and dtype {port.dtype}. Rename the static output.")

    def _prune(self, node: _core.Node) -> None:
        live_ops, live = node.prune([p.vid for p in node.outputs])
        info(node).live_ops = live_ops
        trimmed = [port for port in node.inputs if not live[port.vid]]
        if trimmed:
            node.trim_inputs([port.name for port in trimmed])
            logger.warning(
                "Warning: when building the graph module for %s, detected the following inputs "
                "are not used in the computation or directly returned as output: %s \nFor "
                "clarity and efficiency, consider removing these inputs", node.name,
                {p.name for p in trimmed})

    def _reenter_outputs(self, node: _core.Node, leaves: list[Leaf],
                         static_leaves: list[Leaf]) -> None:
        """Check a later pass's outputs against pass 1 and cache them.

        The values are resolved by name as on pass 1: a state update replaces a
        regular output of its name, a static output replaces a state.
        """
        node_info = info(node)
        for tracker in node_info.trackers:
            tracker.collect_reentry(self, node)
        resolved: dict[str, Leaf] = {leaf.name: leaf for leaf in leaves}
        for name, value in node_info.state_updates.items():
            if any(port.name == name and port.is_state for port in node.outputs):
                resolved[name] = Leaf(name, value, None, (name,))
        for leaf in static_leaves:
            resolved[leaf.name] = leaf
        for leaf in resolved.values():
            port = self._find_port(node, leaf.name, outputs=True)
            self._check_same(node, port, leaf)
            self._cache(node, port, leaf.value)
        node_info.state_updates = {}
        cfg = SESSION.config
        if node_info.pending and cfg is not None and node_info.samples < cfg.max_cached_io - 1:
            for port, value in node_info.pending.values():
                port.samples.append(value)
            node_info.samples += 1
        node_info.pending = {}

    # ---- state, buffers, modules -------------------------------------------

    def _flat_state(self, api: str, node_name: str, tensors: Any) -> tuple[dict, dict]:
        values, fields = normalize(api, node_name, tensors)
        for key, value in values.items():
            if isinstance(value, (dict, list, tuple)):
                raise TypeError(f"{api}() for node '{node_name}' does not support nested state "
                                f"structures ('{key}' is a {type(value).__name__}); declare "
                                f"each state tensor under its own name.")
        return values, fields

    def state_tensors(self, node_name: str, tensors: Any) -> Any:
        """Declare state inputs of the node; updated ones become feedback."""
        values, fields = self._flat_state("state_tensors", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {})
        node = self._existing("state_tensors", node_name)
        node_info = info(node)
        if node.is_tracing:
            replaced = {}
            for leaf in flatten(values, fields):
                if leaf.name in node_info.states:
                    logger.warning("State '%s' of node '%s' is already declared; the existing "
                                   "state value is returned.", leaf.name, node.name)
                    port = node_info.states[leaf.name]
                    existing = alias(clone_plain(port.value))
                    _core.set_carrier(existing, node, port.vid, None, True)
                    replaced[leaf.path] = existing
                    continue
                array = isinstance(leaf.value, np.ndarray)
                traced = self._new_input(node, _tensor_leaf(leaf, True), state=True)
                node_info.states[leaf.name] = node.inputs[-1]
                replaced[leaf.path] = _numpy.wrap(traced) if array else traced
            return rebuild(values, replaced)
        return self._declare(node, values, fields, state=True)

    def update_state(self, node_name: str, tensors: Any) -> Any:
        """Bind the new values of declared states (feedback outputs)."""
        values, _ = self._flat_state("update_state", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {})
        node = self._existing("update_state", node_name)
        node_info = info(node)
        for name, value in values.items():
            if isinstance(value, np.ndarray):
                value = _numpy.as_payload_tensor(value)
            port = node_info.states.get(name)
            if port is None:
                fatal(f"Error: update_state called for '{name}' but it was not registered as a "
                      f"state tensor of node '{node_name}'. Declare it first with "
                      f"annotate.state_tensors('{node_name}', {{'{name}': initial}}).")
            if node.is_tracing:
                self._check_outputs("update_state", node, [Leaf(name, value, None, (name,))])
            dtype, shape = _describe(value)
            if dtype != port.dtype or shape != tuple(port.shape):
                fatal(f"Error: update_state for '{name}' of node '{node_name}' has shape "
                      f"{list(shape)} and dtype {dtype} but expected shape {list(port.shape)} "
                      f"and dtype {port.dtype}.")
            node_info.state_updates[name] = value
        return rebuild(values, {})

    def register_buffer(self, node_name: str, tensors: Any) -> Any:
        """Persistent tensors of the node that traced code may write in place."""
        if isinstance(tensors, torch.Tensor):
            tensors = {"buffer_0": tensors}
            single = True
        elif isinstance(tensors, (list, tuple)) and all(_is_tensor(t) for t in tensors):
            tensors = {f"buffer_{i}": t for i, t in enumerate(tensors)}
            single = False
        else:
            single = None
        values, fields = normalize("register_buffer", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {}) if single is not True else values["buffer_0"]
        node = self._existing("register_buffer", node_name)
        replaced = {}
        for leaf in flatten(values, fields):
            if not _is_tensor(leaf.value) or not node.is_tracing:
                continue
            if _core.carrier_of(leaf.value) is not None:
                fatal(f"register_buffer() for node '{node_name}': '{leaf.name}' is already "
                      f"traced; buffers must be raw tensors.")
            vid = node.bind_const(clone_plain(leaf.value))
            traced = leaf.value if type(leaf.value) is torch.Tensor else alias(leaf.value)
            _core.set_carrier(traced, node, vid, None, True)
            replaced[leaf.path] = traced
        return rebuild(values, replaced)

    def module(self, node_name: str, model: torch.nn.Module,
               buffer_names: list[str] | None = None) -> None:
        """Track the registered buffers of model while the node traces."""
        node = self._existing("module", node_name)
        if not node.is_tracing:
            for tracker in info(node).trackers:
                if tracker.model is model:
                    tracker.reenter(self, node)
            return None
        if any(tracker.model is model for tracker in info(node).trackers):
            return None  # already tracked by this node
        tracker = BufferTracker(model, buffer_names)
        tracker.inject(self, node)
        info(node).trackers.append(tracker)
        return None

    # ---- their own modules: provenance (_mirror), @annotate.method (_method) ----
    # The C core looks both up on this object by name.

    mirror_leapp_tags = staticmethod(_mirror.mirror_leapp_tags)
    # Called as API.call_method(method, args, kwargs): the session API is its first argument.
    call_method = _method.call_method


def _unregistered_text(name: str, node: str, src: str, upstream_style: bool = False) -> str:
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


def _op_name(func: Any) -> str:
    return getattr(func, "__name__", None) or repr(func)


# Instance-dict key of the C core's "computed outside every node from a
# published output" tag: (node name, port, op name).
_DERIVED = "_leapp_derived"

OPEN_NODE_HINT = (
    "\nIf the node is still open from an earlier pass that raised (e.g. a notebook cell run "
    "again after an error), call leapp.start() again to reset the session and rerun.")


def _tensor_leaf(leaf: Leaf, arrays: bool) -> Leaf:
    """leaf with a traced array as its shadow (and, if arrays, any array as a tensor)."""
    value = leaf.value
    if isinstance(value, _numpy.TracedArray) and value._shadow is not None:
        return Leaf(leaf.name, value._shadow, leaf.semantics, leaf.path)
    if arrays and isinstance(value, np.ndarray):
        return Leaf(leaf.name, _numpy.as_payload_tensor(value), leaf.semantics, leaf.path)
    return leaf


API = SessionAPI()
