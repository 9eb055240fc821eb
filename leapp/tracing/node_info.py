"""The facade's data about one traced node, kept in ``Node.info["leapp"]``.

Its own module so that the session (``_session``) and the helpers it drives
(``_buffers``) both read it without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import _core


@dataclass
class NodeInfo:
    """Per-node facade data kept in Node.info['leapp']."""

    export_with: str | None = None
    backend_params: dict = field(default_factory=dict)
    states: dict = field(default_factory=dict)          # name -> input Port
    state_updates: dict = field(default_factory=dict)   # name -> traced value
    trackers: list = field(default_factory=list)        # module buffer trackers
    graph_module: Any = None
    live_ops: list = field(default_factory=list)        # op indices reaching outputs
    origins: set = field(default_factory=set)           # where pass 1 declared inputs
    pending: dict = field(default_factory=dict)         # re-entry sample in progress
    samples: int = 0                                    # cached re-entry samples
    declared: list = field(default_factory=list)        # (input name, weakref to tensor)
    input_aliases: dict = field(default_factory=dict)   # second name of a buffer -> port
    guards: dict = field(default_factory=dict)          # (file, line) -> _guards.Guard, pass 1
    passes: int = 1                                     # traced passes seen (re-entries + 1)
    shadow: Any = None                                  # this later pass's shadow Node
    reentry_of: Any = None                              # of a shadow: the node it re-traces
    guard_counts: dict = field(default_factory=dict)    # of a shadow: (file, line) -> count
    # Pass 1's selections whose shape the data decides (nonzero, unique, x[mask], ...):
    # (file, line) -> _guards.Guard of their shapes, and each result's value id -> its
    # site; a guard once one of them reaches an output (leapp.tracing.guards).
    data_shapes: dict = field(default_factory=dict)
    data_vids: dict = field(default_factory=dict)
    random_ops: list = field(default_factory=list)      # (op label, file, line) of random ops
    validation_noted: bool = False                      # torch.distributions checks said
    # Later passes' states (or fed-back inputs) declared from a value computed outside
    # every node from an output: name -> the message (the closed loop counts them)
    changed_feedback: dict = field(default_factory=dict)
    # Declared states whose update_state comes after output_tensors (or in the
    # node's next call): pass 1's still unbound (the node is in its tail), and
    # all of them, for the later passes' samples.
    late_states: set = field(default_factory=set)
    late_bound: tuple = ()
    tail_start: int = 0                                 # the first op record of the tail
    awaiting: dict | None = None                        # a later pass's sample, until late updates
    private: bool = False                               # traced outside the session (node_trace)
    # State kept in Python (leapp.tracing.escapes): the values pass 1 computed and left
    # where the next call may read them (path, value id, weak reference, set at), and
    # the reads of such values a later pass made ((path, file, line) each).
    kept: list = field(default_factory=list)
    kept_reads: list = field(default_factory=list)

    def declared_inputs(self) -> list:
        """(name, tensor) of the declared inputs whose tensors are still alive."""
        alive = [(name, ref()) for name, ref in self.declared]
        return [(name, t) for name, t in alive if t is not None]


def info(node: _core.Node) -> NodeInfo:
    """The facade's data of a Node."""
    return node.info["leapp"]
