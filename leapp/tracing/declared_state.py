"""Declared state of a node while a session runs: ``state_tensors``,
``update_state`` (in the call, after its outputs in the node's tail, or in its next
call), ``register_buffer`` and ``module``.  SessionAPI (leapp.tracing.annotations)
holds one DeclaredState, which reaches the input and output sides through their
public methods."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import numpy_array as _numpy
from .. import _core
from .buffers import BufferTracker
from ..bundle.log import fatal, logger
from .node_info import info
from .origins import call_site
from .payload import Leaf, flatten, normalize, rebuild
from .traced import alias, clone_plain
from .session_checks import derived_tag, describe, is_tensor, op_name, tensor_leaf


class DeclaredState:
    """Declared state, buffers and modules (SessionAPI's state side)."""

    def __init__(self, api: Any) -> None:
        self.api = api  # the session's SessionAPI: its inputs and outputs sides

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
        node = self.api.inputs.existing("state_tensors", node_name)
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
                traced = self.api.inputs.new_input(node, tensor_leaf(leaf, True), state=True)
                node_info.states[leaf.name] = node.inputs[-1]
                replaced[leaf.path] = _numpy.wrap(traced) if array else traced
            return rebuild(values, replaced)
        if node.in_tail and set(values) & info(node).late_states:
            # the next call declares a state whose late update never came (another state
            # of the next call, declared inside an environment step before the update,
            # leaves the tail open: the update is tied to the call that declared it)
            self.api.outputs.close_tail(node)
        return self.api.inputs.declare(node, values, fields, state=True)

    def update_state(self, node_name: str, tensors: Any) -> Any:
        """Bind the new values of declared states (feedback outputs)."""
        values, _ = self._flat_state("update_state", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {})
        node = self.api.inputs.existing("update_state", node_name)
        node_info = info(node)
        for name, value in values.items():
            if isinstance(value, np.ndarray):
                value = _numpy.as_payload_tensor(value)
            port = node_info.states.get(name)
            if port is None:
                # upstream's words first, then the node and the fix
                fatal(f"Error: update_state called for '{name}' but it was not registered as a "
                      f"state tensor. Call state_tensors() first. Node '{node_name}' has no "
                      f"state '{name}': declare it with annotate.state_tensors('{node_name}', "
                      f"{{'{name}': initial}}) before updating it.")
            if node.is_tracing:
                self.api.outputs.check_outputs("update_state", node, [Leaf(name, value, None, (name,))])
            elif node.in_tail and name in node_info.late_states:
                self._check_late_update(node, name, value)
            elif not node.is_tracing and not self._is_feedback(node, name):
                self._refuse_untied(node, name)
            dtype, shape = describe(value)
            if dtype != port.dtype or shape != tuple(port.shape):
                fatal(f"Error: update_state for '{name}' of node '{node_name}' has shape "
                      f"{list(shape)} and dtype {dtype} but expected shape {list(port.shape)} "
                      f"and dtype {port.dtype}.")
            if not node.is_tracing and not node.in_tail and node_info.awaiting is not None \
                    and name in node_info.awaiting["missing"]:
                self._complete_sample(node, name, value)
                continue
            node_info.state_updates[name] = value
        if node.in_tail and not node_info.late_states - set(node_info.state_updates):
            self.api.outputs.close_tail(node)
        return rebuild(values, {})

    @staticmethod
    def _is_feedback(node: _core.Node, name: str) -> bool:
        return any(port.name == name and port.is_state for port in node.outputs)

    def _check_late_update(self, node: _core.Node, name: str, value: Any) -> None:
        """A state updated after output_tensors must be computed from the node's own
        traced values (its tail); anything else cannot be tied to the call."""
        carrier = _core.carrier_of(value)
        if carrier is not None and carrier.node is node:
            self._name_tail_constants(node, name, carrier.vid)
            return
        file, line = call_site()
        tag = derived_tag(value) if carrier is None else None
        if carrier is not None:
            origin = f"a value of node '{carrier.node.name}'"
        elif tag is not None and tag[0] == node.name:
            origin = (f"a value computed by '{tag[2]}' from its published output '{tag[1]}' "
                      f"(published values are constants once output_tensors has run; "
                      f"use the value the model returned, before it was published)")
        else:
            origin = "a value computed outside the node's traced ops"

        fatal(f"Error: update_state for state '{name}' of node '{node.name}' at {file}:{line} "
              f"comes after the node's output_tensors and receives {origin}: the update "
              f"cannot be tied to the call that declared the state, so the exported state "
              f"would never advance. Compute the new state from the node's values (the "
              f"tensors its model returned), or call update_state before the environment "
              f"step (before annotate.output_tensors('{node.name}', ...)).")

    def _name_tail_constants(self, node: _core.Node, name: str, vid: int) -> None:
        """Warn when a late update is computed, after the node's outputs, with tensors from
        outside the node (done flags masking the new state): the export bakes their
        traced values."""
        wanted = {vid}
        found: list[tuple[str, tuple]] = []
        for func, args, kwargs, outs in reversed(node.ops[info(node).tail_start:]):
            if not wanted & set(outs if isinstance(outs, (tuple, list)) else (outs,)):
                continue
            for item in _template_items((args, kwargs)):
                if isinstance(item, _core.Ref) and item.kind == _core.REF_VALUE:
                    wanted.add(item.index)
                elif isinstance(item, torch.Tensor) and item.dim() > 0:
                    found.append((op_name(func), tuple(item.shape)))
        if not found:
            return
        file, line = call_site()
        op, shape = found[-1]
        logger.warning(
            "update_state for state '%s' of node '%s' at %s:%d is computed after the node's "
            "outputs with a tensor from outside the node (shape %s, by '%s'; done flags "
            "masking the new state, say): the export bakes the value it had here. Fix: "
            "declare it as an input of the node (annotate.input_tensors('%s', {...}) in the "
            "node's call) and apply it inside the node, or keep it out of the state's update.",
            name, node.name, file, line, list(shape), op, node.name)

    def _refuse_untied(self, node: _core.Node, name: str) -> None:
        file, line = call_site()
        fatal(f"Error: update_state for state '{name}' of node '{node.name}' at {file}:{line} "
              f"cannot be tied to the call that declared the state: the node's next call "
              f"already declared its state (or the first pass ended) without this update, so "
              f"'{name}' is a regular input of the exported node and would never advance. Call "
              f"update_state before the environment step (before "
              f"annotate.output_tensors('{node.name}', ...)), or at the latest before the "
              f"node's next annotate.state_tensors call.")

    def _complete_sample(self, node: _core.Node, name: str, value: Any) -> None:
        """A later pass's late update: the last values of that pass's sample."""
        node_info = info(node)
        awaiting = node_info.awaiting
        port = self.api.inputs.find_port(node, name, outputs=True)
        self.api.inputs.check_same(node, port, Leaf(name, value, None, (name,)))
        awaiting["sample"][id(port)] = (port, clone_plain(value))
        awaiting["missing"].discard(name)
        if not awaiting["missing"]:
            node_info.awaiting = None
            self.api.outputs.commit_sample(node, awaiting["sample"])

    def register_buffer(self, node_name: str, tensors: Any) -> Any:
        """Persistent tensors of the node that traced code may write in place."""
        if isinstance(tensors, torch.Tensor):
            tensors = {"buffer_0": tensors}
            single = True
        elif isinstance(tensors, (list, tuple)) and all(is_tensor(t) for t in tensors):
            tensors = {f"buffer_{i}": t for i, t in enumerate(tensors)}
            single = False
        else:
            single = None
        values, fields = normalize("register_buffer", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {}) if single is not True else values["buffer_0"]
        node = self.api.inputs.existing("register_buffer", node_name)
        replaced = {}
        for leaf in flatten(values, fields):
            if not is_tensor(leaf.value) or not node.is_tracing:
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
        node = self.api.inputs.existing("module", node_name)
        if not node.is_tracing:
            for tracker in info(node).trackers:
                if tracker.model is model:
                    tracker.reenter(self.api, node)
            return None
        if any(tracker.model is model for tracker in info(node).trackers):
            return None  # already tracked by this node
        tracker = BufferTracker(model, buffer_names)
        tracker.inject(self.api, node)
        info(node).trackers.append(tracker)
        return None


def _template_items(obj: Any) -> Any:
    """The leaves of an op record's argument template (Refs, tensors, numbers)."""
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _template_items(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _template_items(item)
    else:
        yield obj
