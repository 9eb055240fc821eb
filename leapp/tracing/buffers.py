"""annotate.module(): registered nn.Module buffers tracked while a node traces.

A buffer reassigned in forward() (self.h = new_h) becomes feedback state, and
so does a buffer written in place (self.h.mul_(0.9).add_(x), self.h.copy_(x),
self.h[:] = x, self.h[i] += x, torch.add(self.h, x, out=self.h)): the C handler
records every in-place write functionally and moves the buffer's traced value
on, so the value it holds at the end of the pass is the state's update.  A
buffer only read is baked into the model as a constant.  Every buffer is put
back as a real tensor afterwards, holding its latest value.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import _core
from .node_info import info
from .payload import Leaf
from .traced import plain


class _Tracked:
    __slots__ = ("owner", "attr", "name", "original", "traced", "constant")

    def __init__(self, owner: torch.nn.Module, attr: str, name: str, original: torch.Tensor):
        self.owner, self.attr, self.name, self.original = owner, attr, name, original
        self.traced: Any = None
        self.constant = False  # read-only during the first pass: baked into the model


class BufferTracker:
    """The buffers of one module registered with one node."""

    def __init__(self, model: torch.nn.Module, buffer_names: list[str] | None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"annotate.module() expects an nn.Module, got {type(model).__name__}")
        self.model = model
        self.wanted = None if buffer_names is None else set(buffer_names)
        self.tracked: list[_Tracked] = []
        self.reentered: list[_Tracked] = []
        self.restored = False

    def inject(self, api: Any, node: _core.Node) -> None:
        for full_name, buffer in self.model.named_buffers():
            if buffer is None or (self.wanted is not None and full_name not in self.wanted):
                continue
            owner_path, _, attr = full_name.rpartition(".")
            owner = self.model.get_submodule(owner_path) if owner_path else self.model
            entry = _Tracked(owner, attr, full_name.replace(".", "_"), buffer)
            with torch._C.DisableTorchFunctionSubclass():
                carrier_value = buffer.detach()
            leaf = Leaf(entry.name, carrier_value, None, (entry.name,))
            entry.traced = api.inputs.new_input(node, leaf, state=True)
            info(node).states[entry.name] = node.inputs[-1]
            owner._buffers[attr] = entry.traced
            self.tracked.append(entry)

    def _updated(self, node: _core.Node, entry: _Tracked) -> Any:
        """The buffer's current value when the pass reassigned it or wrote it in
        place (its traced value moved on from the declared one), else None."""
        current = entry.owner._buffers.get(entry.attr)
        if current is None:
            return None
        if current is not entry.traced:
            return current  # reassigned
        carrier = _core.carrier_of(current)
        port = info(node).states.get(entry.name)
        if carrier is not None and port is not None and carrier.node is node \
                and carrier.vid != port.vid:
            return current  # written in place
        return None

    def reassigned(self, node: _core.Node) -> dict[str, Any]:
        """{state name: current value} of the buffers reassigned or written in place
        so far (no side effects)."""
        found = {}
        for entry in self.tracked:
            current = self._updated(node, entry)
            if current is not None:
                found[entry.name] = current
        return found

    def collect(self, api: Any, node: _core.Node) -> None:
        """Reassigned or written buffers become state updates, untouched ones constants."""
        node_info = info(node)
        for entry in self.tracked:
            current = self._updated(node, entry)
            if current is not None:
                api.update_state(node.name, {entry.name: current})
                continue
            port = node_info.states.pop(entry.name)
            node.remove_input(port)
            node.bind_const(port.value, port.vid)
            entry.constant = True

    def reenter(self, api: Any, node: _core.Node) -> None:
        """A later pass: check the state buffers and cache their values."""
        states = info(node).states
        self.reentered = []
        for entry in self.tracked:
            port = states.get(entry.name)
            if entry.constant or port is None:
                continue
            current = entry.owner._buffers.get(entry.attr)
            api.inputs.check_same(node, port, Leaf(entry.name, current, None, (entry.name,)))
            api.inputs.cache(node, port, current)
            self.reentered.append(entry)

    def collect_reentry(self, api: Any, node: _core.Node) -> None:
        """At the end of a later pass: the buffers' new values are the state updates."""
        for entry in self.reentered:
            current = entry.owner._buffers.get(entry.attr)
            if current is not None:
                api.update_state(node.name, {entry.name: current})
        self.reentered = []

    def restore(self) -> None:
        """Put real tensors back on the module (idempotent)."""
        if self.restored:
            return
        for entry in self.tracked:
            current = entry.owner._buffers.get(entry.attr)
            if current is entry.traced or current is None:
                value = entry.original
            else:
                value = plain(current)
            if _core.carrier_of(value) is not None:
                value = plain(value)
            entry.owner._buffers[entry.attr] = value
        self.restored = True
