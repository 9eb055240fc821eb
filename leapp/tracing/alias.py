"""Alias provenance: tensors of a tracing node that share storage.

A view of a traced value (``x[0]``, ``x.view(...)``, ``x.detach()``, ``x.t()``,
``x[:]``, a split...) shares its memory: an in-place write through either one
changes what the other holds in eager code, so the exported graph must see
the write through both.  The C handler calls ``link`` after an op that may
return a view, and ``write`` after an in-place op on a value that has aliases.

Each write is carried onto every other live alias that overlaps it, as ops of
the node computed from the written value:

* identical layout: the alias takes the written value itself (no op);
* fully covered: a gather of the written value's elements;
* partly covered: a scatter of the overlapping elements into its old value.

Element positions come from the storage layouts (offset, sizes, strides) at
trace time and become constants of the exported graph, so any chain of views
is handled the same way.  Writes through a view of another dtype are refused.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from .. import _core
from . import ops as _ops
from ..bundle.log import fatal

# In-place ops that only change the receiver's own shape/strides, not the bytes.
_LAYOUT_ONLY = {"t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_",
                "as_strided_", "resize_", "resize_as_", "detach_", "requires_grad_"}


class AliasGroup:
    """The live tensors known to share one storage (weak references)."""

    __slots__ = ("members", "__weakref__")

    def __init__(self) -> None:
        self.members: list[weakref.ref] = []

    def add(self, tensor: torch.Tensor) -> None:
        if len(self.members) >= 16 and len(self.members) % 16 == 0:
            self.members = [m for m in self.members if m() is not None]
        self.members.append(weakref.ref(tensor))

    def live(self) -> list[torch.Tensor]:
        alive = [m() for m in self.members]
        self.members = [m for m, t in zip(self.members, alive) if t is not None]
        return [t for t in alive if t is not None]


def _storage(t: torch.Tensor) -> tuple | None:
    """(device, storage address) of t, or None for tensors without memory."""
    with torch._C.DisableTorchFunctionSubclass():
        if t.device.type == "meta" or t.numel() == 0:
            return None
        try:
            return (str(t.device), t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # sparse, nested, functional...
            return None


def _layout(t: torch.Tensor) -> tuple:
    with torch._C.DisableTorchFunctionSubclass():
        return (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _offsets(layout: tuple) -> torch.Tensor:
    """The storage offset of every element of a tensor, in its logical order."""
    _, shape, stride, offset = layout
    with torch._C.DisableTorchFunctionSubclass():
        pos = torch.tensor(offset, dtype=torch.long)
        for size, step in zip(shape, stride):
            pos = pos.unsqueeze(-1) + torch.arange(size, dtype=torch.long) * step
        return pos.reshape(-1)


def link(src: Any, result: Any) -> None:
    """result (an op's output) joins src's alias group when it shares src's storage."""
    if isinstance(result, (tuple, list)):
        for item in result:
            link(src, item)
        return
    if not isinstance(result, torch.Tensor) or result is src:
        return
    source, target = _core.carrier_of(src), _core.carrier_of(result)
    if source is None or target is None:
        return
    where = _storage(src)
    if where is None or where != _storage(result):
        return
    group = source.group
    if group is None:
        group = source.group = AliasGroup()
        group.add(src)
    group.add(result)
    target.group = group


def join(a: torch.Tensor, b: torch.Tensor) -> None:
    """Put two traced tensors known to share memory in one alias group."""
    first, second = _core.carrier_of(a), _core.carrier_of(b)
    if first is None or second is None:
        return
    group = first.group or second.group or AliasGroup()
    for tensor, carrier in ((a, first), (b, second)):
        if carrier.group is not group:
            carrier.group = group
            group.add(tensor)


def link_declared(node: _core.Node, tensor: torch.Tensor, declared: list) -> None:
    """Put a newly declared input in one group with the node's earlier declared
    inputs that share its storage (one buffer declared twice is handled by twin())."""
    where = _storage(tensor)
    if where is None:
        return
    for other in declared:
        carrier = _core.carrier_of(other)
        if (other is not tensor and carrier is not None and carrier.node is node
                and _storage(other) == where):
            join(other, tensor)


def write(receiver: torch.Tensor, func: Any) -> None:
    """An in-place write on receiver: carry it onto the receiver's live aliases."""
    carrier = _core.carrier_of(receiver)
    if carrier is None or carrier.group is None:
        return
    if (getattr(func, "__name__", "") or "") in _LAYOUT_ONLY:
        return
    node = carrier.node
    members = [(m, _core.carrier_of(m)) for m in carrier.group.live() if m is not receiver]
    # Outside tracing (later passes, finished nodes) only aliases that a tracing
    # node declared or that stand for a published port can be affected.
    members = [(m, c) for m, c in members if c is not None
               and (node.is_tracing or c.node.is_tracing or c.port is not None)]
    if not members:
        return
    written = _layout(receiver)
    where = _storage(receiver)
    offsets = None
    for member, other in members:
        if _storage(member) != where:
            continue
        layout = _layout(member)
        if layout == written and other.node is node:
            other.vid = carrier.vid
            continue
        if offsets is None:
            offsets = _offsets(written)
            ordered, order = torch.sort(offsets)
        mine = _offsets(layout)
        pos = torch.searchsorted(ordered, mine).clamp(max=ordered.numel() - 1)
        hit = ordered[pos] == mine
        if not bool(hit.any()):
            continue
        if not node.is_tracing or other.node is not node:
            _foreign_write(receiver, carrier, member, other)
            continue
        if layout[0] != written[0]:
            fatal(f"Error: node '{node.name}' writes in place through a view of dtype "
                  f"{_core.dtype_name(receiver)} whose memory is shared with a value of dtype "
                  f"{_core.dtype_name(member)} read by the node. The exported graph cannot "
                  f"reinterpret memory: write through a tensor of the same dtype, or clone() "
                  f"before writing.", NotImplementedError)
        source = order[pos]
        written_ref = _core.value_ref(carrier.vid)
        if bool(hit.all()):
            if (mine.numel() == offsets.numel()
                    and torch.equal(source, torch.arange(mine.numel()))):
                other.vid = node.record(torch.reshape, (written_ref, layout[1]))
            else:
                other.vid = node.record(_ops.gather_positions,
                                        (written_ref, source.reshape(layout[1])))
        else:
            targets = hit.nonzero().reshape(-1)
            other.vid = node.record(_ops.scatter_positions,
                                    (_core.value_ref(other.vid), targets, written_ref,
                                     source[hit]))


def _foreign_write(receiver: torch.Tensor, carrier: _core.Carrier, member: torch.Tensor,
                   other: Any) -> None:
    """A write whose alias belongs to another node: a published value changed
    in place loses its port; a tracing node's input changed from outside it
    cannot be exported as computed."""
    if not other.node.is_tracing:
        other.port = None
        return
    fatal(f"Error: an in-place write through a value of node '{carrier.node.name}' changes "
          f"memory that node '{other.node.name}' is tracing (a declared input or a value "
          f"derived from it). The exported node '{other.node.name}' would not see the write. "
          f"Write through the value annotate.input_tensors('{other.node.name}', ...) returned, "
          f"or clone() before writing.")


def twin(tensor: torch.Tensor, declared: list) -> tuple | None:
    """The (name, tensor) among declared that is another object over tensor's very
    storage and layout (the same object declared again is a new input)."""
    where = _storage(tensor)
    if where is None:
        return None
    mine = _layout(tensor)
    for name, other in declared:
        if other is not tensor and _storage(other) == where and _layout(other) == mine:
            return name, other
    return None


def check_outputs(node: _core.Node, declared: list, outputs: list, updates: list = ()) -> None:
    """Refuse an output that shares memory with a declared input the node uses
    without leapp having followed the aliasing (no common alias group): a write
    through one would not be seen through the other in the export.

    updates are the node's other results (state updates): an input none of the
    outputs and updates reads is pruned from the node, so it cannot conflict.
    """
    live = None  # the node's live values, computed at the first candidate
    for name, value in outputs:
        carrier = _core.carrier_of(value)
        where = _storage(value) if carrier is not None else None
        if where is None:
            continue
        layout = _layout(value)
        for port_name, tensor in declared:
            port_carrier = _core.carrier_of(tensor)
            if (port_carrier is None or port_carrier.node is not node
                    or _storage(tensor) != where or _layout(tensor) != layout
                    or port_carrier.vid == carrier.vid):
                continue
            if carrier.group is not None and port_carrier.group is carrier.group:
                continue  # followed views: every write reached both
            port = next((p for p in node.inputs if p.name == port_name), None)
            if port is None:
                continue  # pruned: the output is the only view of those bytes
            if live is None:
                live = _live_values(node, [v for _, v in outputs] + list(updates))
            if not live[port.vid]:
                continue  # unused: pruned when the node finishes
            if _kept_as_is(node, carrier.vid, port.vid):
                continue  # dropout that keeps every value: a view of the input, no write
            fatal(f"Error: output '{name}' of node '{node.name}' shares memory with declared "
                  f"input '{port_name}', but they carry different tracing roots. An in-place "
                  f"write through one of them is not seen by the other in the exported graph. "
                  f"Use the value annotate.input_tensors() returned, or clone() the output.")


_IDENTITY_DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d",
                                 "alpha_dropout", "feature_alpha_dropout", "feature_dropout"})


def _kept_as_is(node: _core.Node, vid: int, source: int) -> bool:
    """Whether value vid is a dropout of value source that keeps every value (eval mode, or
    p = 0): torch returns the input, or a view of it (an unbatched dropout3d's unsqueeze
    and squeeze), which shares its memory by design."""
    for func, args, kwargs, outs in node.ops:
        if outs != vid:
            continue
        first = args[0] if args else None
        if _ops.random_name(func) not in _IDENTITY_DROPOUTS or not (
                isinstance(first, _core.Ref) and first.kind == _core.REF_VALUE
                and first.index == source):
            return False
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2
                                                    else True))
        return not training or p == 0
    return False


def _live_values(node: _core.Node, results: list) -> bytes:
    """Node.prune's live-value flags for the node's results (traced tensors)."""
    vids = []
    for value in results:
        carrier = _core.carrier_of(value)
        if carrier is not None and carrier.node is node:
            vids.append(carrier.vid)
    return node.prune(vids)[1]


_core._bind_alias(link, write)
