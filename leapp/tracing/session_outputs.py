"""The output side of a node's life cycle: ``output_tensors`` (checks, the node's
finish, re-entry), the tail of late state updates and its close.  SessionAPI
(leapp.tracing.annotations) holds one NodeOutputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import alias as _alias, escapes as _escapes, guards as _guards
from . import numpy_array as _numpy
from .. import _core
from .fx import build_graph_module
from ..bundle.log import fatal, logger
from .node_info import info
from .payload import Leaf, flatten, normalize, rebuild
from .session_state import SESSION
from .traced import TracedTensor, clone_plain, plain


from .session_checks import describe, is_tensor, tensor_leaf


class NodeOutputs:
    """output_tensors and the finish of a node (SessionAPI's output side)."""

    def __init__(self, api: Any) -> None:
        self.api = api  # the session's SessionAPI: buffer trackers call its annotations
        self.inputs = api.inputs

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
        static_leaves = [tensor_leaf(leaf, True) for leaf in flatten(*statics)]
        if node.is_tracing:
            self._finish(node, [tensor_leaf(leaf, False) for leaf in leaves], static_leaves,
                         export_with, backend_params or {})
            return rebuild(values, {})
        _escapes.end_later_pass(node)  # leapp.tracing.escapes
        self._reenter_outputs(node, [tensor_leaf(leaf, True) for leaf in leaves],
                              static_leaves)
        _guards.end_pass(node)
        # The payload as passed; a leaf still traced (a value of another node
        # passed through) comes back plain, in a rebuilt container.
        unwrapped = ((leaf, _numpy.plain_array(leaf.value)
                      if isinstance(leaf.value, np.ndarray) else plain(leaf.value))
                     for leaf in leaves)
        return rebuild(values, {leaf.path: value for leaf, value in unwrapped
                                if value is not leaf.value})

    def check_outputs(self, api: str, node: _core.Node, leaves: list[Leaf]) -> None:
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
            from ..bundle.backend_names import check_backend
            check_backend(node.name, export_with, backend_params)
        self.check_outputs("output_tensors", node, leaves)
        _guards.check_outputs(node, [(leaf.name, leaf.value) for leaf in leaves]
                              + list(node_info.state_updates.items()))
        _escapes.check(node)  # values kept for the next call (leapp.tracing.escapes)
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
            if not is_tensor(leaf.value):
                fatal(f"Error: static output '{leaf.name}' has type "
                      f"{type(leaf.value).__name__} but expected a raw tracable data type.\n"
                      f"**Static outputs must be raw tensors, not derived from input tensors.**"
                      f"\nIf this value depends on inputs, use it as a regular output tensor "
                      f"instead. (A static output is a torch.Tensor.)", TypeError)
        names = [leaf.name for leaf in leaves + static_leaves]
        for index, name in enumerate(names):
            if name in names[:index]:
                self.inputs.check_unique(node, name, outputs=True, taken=names[:index])
        self._check_static_over_state(node, static_leaves)
        for tracker in node_info.trackers:
            tracker.collect(self.api, node)
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
        late = node_info.late_states
        if not late:  # with late states, the node's graph waits for their updates
            self._prune(node)
        for tracker in node_info.trackers:
            tracker.restore()
        node_info.export_with = None if skip else export_with
        node_info.backend_params = dict(backend_params)
        if not late:
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
        if late:
            # Their update_state comes later (after an environment step, say):
            # ops on the node's internal values keep being recorded until then.
            node_info.tail_start = len(node.ops)
            node.open_tail()

    def _output_port(self, leaf: Leaf, vid: int) -> Any:
        dtype, shape = describe(leaf.value)
        return _core.Port(leaf.name, dtype, shape, vid, clone_plain(leaf.value), leaf.semantics)

    def _merge_states(self, node: _core.Node, outputs: dict) -> set[str]:
        """Add the updated states to outputs (name -> Port), in declaration order.

        A state named like a regular output replaces it in place, keeping the
        regular output's semantics; returns the names replaced that way.
        Declared states not updated yet are left for update_state after
        output_tensors (node_info.late_states: the node's tail).
        """
        node_info = info(node)
        shadowed: set[str] = set()
        for name, port in node_info.states.items():
            value = node_info.state_updates.get(name)
            if value is None:
                node_info.late_states.add(name)
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
            dtype, shape = describe(leaf.value)
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
            tracker.collect_reentry(self.api, node)
        resolved: dict[str, Leaf] = {leaf.name: leaf for leaf in leaves}
        for name, value in node_info.state_updates.items():
            if any(port.name == name and port.is_state for port in node.outputs):
                resolved[name] = Leaf(name, value, None, (name,))
        for leaf in static_leaves:
            resolved[leaf.name] = leaf
        for leaf in resolved.values():
            port = self.inputs.find_port(node, leaf.name, outputs=True)
            self.inputs.check_same(node, port, leaf)
            self.inputs.cache(node, port, leaf.value)
        missing = {name for name in node_info.late_bound if name not in resolved}
        node_info.state_updates = {}
        if missing:  # this pass's sample is complete once update_state binds them
            node_info.awaiting = {"sample": node_info.pending, "missing": missing}
        else:
            self.commit_sample(node, node_info.pending)
        node_info.pending = {}

    def commit_sample(self, node: _core.Node, sample: dict) -> None:
        """Append one later pass's cached values to the ports' samples."""
        node_info = info(node)
        cfg = SESSION.config
        if sample and cfg is not None and node_info.samples < cfg.max_cached_io - 1:
            for port, value in sample.values():
                port.samples.append(value)
            node_info.samples += 1

    def close_tail(self, node: _core.Node) -> None:
        """Bind the states updated after output_tensors as feedback and build the
        node's graph; a declared state never updated stays a regular input."""
        node_info = info(node)
        late, node_info.late_states = node_info.late_states, set()
        added, bound = [], []
        for name, port in node_info.states.items():
            if name not in late:
                continue
            value = node_info.state_updates.pop(name, None)
            if value is None:
                logger.warning("State '%s' of node '%s' was declared but never passed to "
                               "update_state(); it stays a regular input. Call "
                               "annotate.update_state('%s', {'%s': new_value}) in each call "
                               "of the node, or declare it with annotate.input_tensors.",
                               name, node.name, node.name, name)
                port.is_state = 0
                continue
            out = self._output_port(Leaf(name, value, port.semantics, (name,)),
                                    _core.carrier_of(value).vid)
            out.is_state = 1
            added.append(out)
            bound.append((name, value))
            port.src_node, port.src_port = node, name
        node.add_outputs(added)
        node_info.late_bound = tuple(name for name, _ in bound)
        self._prune(node)
        node_info.graph_module = build_graph_module(
            node, node_info.live_ops, list(node.inputs), [p.vid for p in node.outputs])
        for name, value in bound:
            carrier = _core.carrier_of(value)
            if carrier.port is None:
                carrier.port = name
            _core.remember(value)
        node.close_tail()

    def close_tails(self) -> None:
        """End every node's tail (stop(): updates that never came)."""
        for node in _core.nodes().values():
            if node.in_tail:
                self.close_tail(node)
            info(node).awaiting = None
