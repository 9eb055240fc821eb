"""The input side of a node's life cycle while a session runs: opening nodes,
declaring inputs and states (pass 1: new ports and traced values; later passes:
the structure checked against pass 1, samples cached), and the checks of what
is declared (names, values written by other nodes, values computed outside every
node from an output).  SessionAPI (leapp.tracing.annotations) holds one
NodeInputs; the output side and declared state reach it through its public
methods."""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from . import alias as _alias, escapes as _escapes, guards as _guards
from . import numpy_array as _numpy
from .. import _core
from ..bundle.log import fatal, logger
from .node_info import NodeInfo, info
from .origins import call_site
from .payload import Leaf, flatten, rebuild
from .session_state import SESSION
from .traced import alias, clone_plain, plain
from .session_checks import (OPEN_NODE_HINT, derived_tag, describe, description_text, is_tensor,
                             listed, op_name, port_names, refuse_if_strict,
                             unregistered_text)


class NodeInputs:
    """Nodes opened and their inputs declared (SessionAPI's input side)."""

    # ---- node lookup ------------------------------------------------------

    def new_node(self, name: str) -> Any:
        if not isinstance(name, str) or not name:
            raise TypeError(f"node_name must be a non-empty str, got {name!r}")
        node = _core.Node(name)
        node.info["leapp"] = NodeInfo()
        _core.register_node(node)
        _escapes.begin(node)  # what user code keeps for the next call (leapp.tracing.escapes)
        logger.info("Node context initialized: %s", name)
        return node

    def existing(self, api: str, name: str) -> Any:
        node = _core.find_node(name)
        if node is None:
            fatal(f"{api}() called for node '{name}' but node not found. Call "
                  f"annotate.input_tensors('{name}', ...) first to open the node.")
        return node

    # ---- inputs -------------------------------------------------------------

    def declare(self, node: _core.Node, values: dict, fields: dict, state: bool) -> Any:
        replaced: dict[tuple, Any] = {}
        if not node.is_tracing:
            _escapes.later_pass(node)  # what it reads of pass 1's kept values (escapes)
        for leaf in flatten(values, fields):
            array = leaf.value if isinstance(leaf.value, np.ndarray) else None
            if array is not None:  # NumPy inputs are declared as the tensor they view
                leaf = Leaf(leaf.name, _numpy.as_payload_tensor(array), leaf.semantics,
                            leaf.path)
            if not is_tensor(leaf.value):
                logger.warning("Input '%s' of node '%s' is a %s, not a tensor: it will be passed "
                               "through as a constant.", leaf.name, node.name,
                               type(leaf.value).__name__)
                continue
            if node.is_tracing:
                traced = self.new_input(node, leaf, state)
                replaced[leaf.path] = _numpy.wrap(traced) if array is not None else traced
            else:
                self._check_changed_feedback(node, leaf, state)
                value = self._reenter_input(node, leaf)
                if _guards.needs_shadow(node):  # pass 1 read values into Python: check them
                    value = self._shadow_input(node, leaf.name, value)
                    replaced[leaf.path] = _numpy.wrap(value) if array is not None else value
                    continue
                replaced[leaf.path] = _numpy.plain_array(array) if array is not None else value
        return rebuild(values, replaced)

    def _check_changed_feedback(self, node: _core.Node, leaf: Leaf, state: bool) -> None:
        """Warn (strict: refuse) when a later pass declares a state, or an input fed back
        from a node's output, with a value computed outside every node from an output
        (h = new.clamp(-0.1, 0.1) between the steps): the bundle feeds back the output
        itself, not what the code here made of it."""
        tag = derived_tag(leaf.value)
        if tag is None or _core.find_node(tag[0]) is None:
            return
        port = next((p for p in node.inputs if p.name == leaf.name), None)
        fed_back = port is not None and (port.src_node is not None or
                                         leaf.name in info(node).states)
        if not (state or fed_back):
            return
        src_node, src_port, op = tag
        file, line = call_site()
        what = "State" if state else "Input"
        message = (f"{what} '{leaf.name}' of node '{node.name}' is declared at {file}:{line} "
                   f"with a value computed outside every node by '{op}' from output "
                   f"'{src_port}' of node '{src_node}': the exported pipeline feeds back "
                   f"'{src_node}/{src_port}' itself, so from the next step on it computes "
                   f"something else than what ran here. Fix: do the '{op}' inside the node "
                   f"(before annotate.update_state('{src_node}', ...) or "
                   f"annotate.output_tensors('{src_node}', ...)), or make it a node of its "
                   f"own.")
        if leaf.name in info(node).changed_feedback:
            return  # said on an earlier pass
        info(node).changed_feedback[leaf.name] = message
        refuse_if_strict(message)
        logger.warning("%s", message)

    def _shadow_input(self, node: _core.Node, name: str, value: Any) -> Any:
        """value as an input of this later pass's shadow node (leapp.tracing.guards)."""
        shadow = _guards.shadow_of(node, name)
        traced = value if type(value) is torch.Tensor else alias(value)
        _core.set_carrier(traced, shadow, shadow.new_value(), None, True)
        info(shadow).declared.append((name, weakref.ref(traced)))
        return traced

    def check_unique(self, node: _core.Node, name: str, outputs: bool = False,
                      taken: list | None = None) -> None:
        names = taken if taken is not None else port_names(node, outputs)
        if name in names:
            existing = "{" + ", ".join(repr(n) for n in dict.fromkeys(names)) + "}"
            fatal(f"Duplicate i/o name '{name}' in node '{node.name}'. \nCurrently existing "
                  f"names: {existing}\nEach input/output in the same node must have a unique "
                  f"name.\nError: Duplicate name '{name}' among the "
                  f"{'outputs' if outputs else 'inputs'} of node '{node.name}'. Each "
                  f"input/output must have a unique name: rename one of them."
                  + (OPEN_NODE_HINT if not outputs and node.is_tracing and taken is None
                     else ""))

    def new_input(self, node: _core.Node, leaf: Leaf, state: bool) -> Any:
        self.check_unique(node, leaf.name)
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
                    unregistered_text(leaf.name, node.name, carrier.node.name),
                    carrier.node.name)
            else:
                self._check_written_elsewhere(node, leaf.name, value, carrier)
        node_info = info(node)
        declared = node_info.declared_inputs()
        same = _alias.twin(value, declared) if src_port is None else None
        if same is not None:
            return self._adopt_declared(node, leaf, value, *same)
        dtype, shape = describe(value)
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
        op = next((op_name(record[0]) for record in reversed(writer.ops)
                   if record[3] == carrier.vid), None)
        file, line = call_site()
        how = f" (by '{op}', an in-place op recorded in its functional form)" if op else ""
        as_input = f" after declaring it as its input '{declared_as}'" if declared_as else ""
        message = (
            f"{unregistered_text(name, node.name, writer.name, upstream_style=True)}\n"
            f"Node '{writer.name}' wrote tensor '{name}' in place{how}{as_input}, and node "
            f"'{node.name}' declares it as input '{name}' at {file}:{line}: the exported "
            f"pipeline feeds '{node.name}/{name}' the value given from outside, not the one "
            f"'{writer.name}' wrote, so it would not compute what ran here. Fix: publish the "
            f"written value with annotate.output_tensors('{writer.name}', {{'{name}': ...}}) "
            f"and declare that output in '{node.name}', or clone() the input inside "
            f"'{writer.name}' before writing to it.")
        refuse_if_strict(message)
        logger.error("%s", message)

    def _check_derived(self, node: _core.Node, name: str, value: Any) -> None:
        """Warn (strict: refuse) when value was computed outside every node from an output."""
        tag = derived_tag(value)
        if tag is None:
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
        refuse_if_strict(message)
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

    def find_port(self, node: _core.Node, name: str, outputs: bool) -> Any:
        ports = node.outputs if outputs else list(node.inputs) + list(node.trimmed_inputs)
        for port in ports:
            if port.name == name:
                return port
        available = [p.name for p in ports]
        fatal(f"Validation error when reentering node '{node.name}': Error: Reentering "
              f"{node.name} with new i/o {name} but failed to find it in the current i/o "
              f"list.\navailable i/o names: {available}")

    def check_same(self, node: _core.Node, port: _core.Port, leaf: Leaf) -> None:
        dtype, shape = describe(leaf.value)
        semantics = leaf.semantics
        changed_semantics = semantics is not None and semantics != port.semantics
        if dtype != port.dtype or shape != tuple(port.shape) or changed_semantics:
            old = description_text(port.name, port.dtype, port.shape, port.semantics)
            # As upstream prints it: the new description carries the semantic
            # fields only when those are what changed.
            new = description_text(port.name, dtype, shape,
                                    semantics if changed_semantics else None)
            first = {"dtype": port.dtype, "shape": list(port.shape), **(port.semantics or {})}
            now = {"dtype": dtype, "shape": list(shape),
                   **(semantics if changed_semantics else port.semantics or {})}
            changes = "; ".join(f"{key}: {listed(first.get(key))} (first pass) vs {key}: "
                                f"{listed(now.get(key))} (now)" for key in dict.fromkeys(
                                    [*first, *now]) if first.get(key) != now.get(key))
            fatal(f"Validation error when reentering node '{node.name}': Error: Reentering "
                  f"{node.name} with new i/o {leaf.name} \nbut the description has changed "
                  f"from {old} to {new}.\nThis can happen if some dynamic "
                  f"behavior is not captured by the annotations\nWhat changed: {changes}. "
                  f"Every pass must give '{leaf.name}' the structure of the first one.")

    def cache(self, node: _core.Node, port: _core.Port, value: torch.Tensor) -> None:
        cfg = SESSION.config
        if cfg is not None and info(node).samples < cfg.max_cached_io - 1:
            info(node).pending[id(port)] = (port, clone_plain(value))

    def _reenter_input(self, node: _core.Node, leaf: Leaf) -> Any:
        surviving = info(node).input_aliases.get(leaf.name)
        if surviving is not None:  # a second name of one declared buffer
            port = self.find_port(node, surviving, outputs=False)
            self.check_same(node, port, Leaf(surviving, leaf.value, leaf.semantics, leaf.path))
            return plain(leaf.value)
        port = self.find_port(node, leaf.name, outputs=False)
        self.check_same(node, port, leaf)
        carrier = _core.carrier_of(leaf.value)
        if port.src_node is None and carrier is not None and carrier.port is not None \
                and not carrier.active:
            # A dangling input now fed by a published value: inferred feedback.
            port.src_node, port.src_port = carrier.node, carrier.port
        self.cache(node, port, leaf.value)
        cfg = SESSION.config
        if cfg is not None and cfg.dry_run:
            # As upstream's dry run: the caller's tensor itself comes back a
            # TracedTensor of this input (of a finished node: its ops run eagerly and
            # give plain tensors); stop() makes it plain again (release_traced).  A
            # published value keeps its own carrier: the plain alias as before.
            if type(leaf.value) is torch.Tensor:
                _core.set_carrier(leaf.value, node, port.vid, None, True)
                return leaf.value
            if carrier is not None and carrier.port is None and not carrier.active:
                return leaf.value
        return plain(leaf.value)
