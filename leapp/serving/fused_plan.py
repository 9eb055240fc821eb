"""What a fused model is made of: the bundle's nodes in run order, their feeds, the state
that carries feedback (the plan ``fuse`` builds both formats from), and the fuse
conventions' constants.
"""
from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from ..bundle.dtypes import BY_TORCH
from ..bundle.pipeline import (FEEDBACK, FORWARD, FUSED_FORMATS, GRAPH_INPUT, OUTPUT_SUFFIX,  # noqa: F401
                               STATE_SUFFIX)
from ..bundle.safe_load import quote


logger = logging.getLogger("leapp")

#: Version of the fused-model convention (metadata ``format_version``).
FORMAT_VERSION = 1
#: Metadata key (ONNX ``metadata_props``) holding the convention's JSON.
METADATA_KEY = "leapp_fused"
#: TorchScript ``_extra_files`` entry holding the same JSON.
TORCHSCRIPT_EXTRA_FILE = "leapp_fused.json"
# The state and output suffixes belong to the pipeline model (one renaming rule).
#: Top-level YAML key recording fused models (upstream's reader ignores it).
YAML_KEY = "fused"
#: Steps the fused model is run next to InferenceManager before it is accepted.
VALIDATION_STEPS = 12
#: Accepted ``format`` values and the file suffix of each.
FORMATS = FUSED_FORMATS


class FuseError(ValueError):
    """The bundle cannot be fused (or the fused model does not match the bundle)."""


@dataclass
class Port:
    """One input or output of the fused model."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    key: str | None = None  # the YAML's "node/port" where the name differs from it

    def describe(self) -> dict[str, Any]:
        entry = {"name": self.name, "dtype": BY_TORCH[self.dtype].name, "shape": list(self.shape)}
        if self.key is not None and self.key != self.name:
            entry["key"] = self.key
        return entry


@dataclass
class State:
    """One feedback pair: ``input`` is the target's value, ``output`` its next value."""

    input: str
    output: str
    source: tuple[str, str]
    dtype: torch.dtype
    shape: tuple[int, ...]
    initial: torch.Tensor

    def describe(self) -> dict[str, Any]:
        raw = self.initial.detach().cpu().contiguous()
        data = raw.view(torch.uint8).numpy().tobytes() if raw.numel() else b""
        return {"input": self.input, "output": self.output, "dtype": BY_TORCH[self.dtype].name,
                "shape": list(self.shape),
                "initial": {"encoding": "base64-le", "data": base64.b64encode(data).decode()}}


@dataclass
class Plan:
    """What the fused model computes, read from the bundle.

    ``feeds[node][port]`` says where each node input comes from: ``("input", name)``
    a data input, ``("state", name)`` a state input, ``("node", (src, port))``
    another node's output this step, ``("constant", tensor)`` a value no edge
    feeds (the zeros or initial value ``InferenceManager`` leaves there).
    """

    pipeline: str
    bundle_dir: str
    order: list[str]
    inputs: list[Port]
    outputs: list[Port]
    outputs_from: list[tuple[str, str]]
    states: list[State]
    feeds: dict[str, dict[str, tuple[str, Any]]]

    def metadata(self) -> dict[str, Any]:
        from .._version import __version__
        return {"format_version": FORMAT_VERSION, "pipeline": self.pipeline,
                "leapp_version": __version__,
                "inputs": [p.describe() for p in self.inputs],
                "outputs": [p.describe() for p in self.outputs],
                "state": [s.describe() for s in self.states]}


def fail(message: str) -> None:
    from ..bundle import log as _logging
    _logging.fatal(message, FuseError)


# ---- reading the bundle -----------------------------------------------------------


_FED_AS = {GRAPH_INPUT: "input", FORWARD: "node", FEEDBACK: "state"}


def _fed_twice(second: Any, target: str, first: str) -> str:
    """Why a node input fed by ``second`` (a Feed) and already by a ``first`` cannot be fused."""
    first = _FED_AS.get(first, first)
    if second.kind == FEEDBACK:
        return (f"Feedback target {quote(target)} is also fed as a {first} of the "
                "pipeline: it cannot be both state and data in the fused model. Fix the "
                "bundle's YAML.")
    return (f"Node input {quote(target)} is fed by {quote('/'.join(second.source))} and is "
            f"also a {first} of the pipeline: one step of this bundle has no single meaning, "
            "so it cannot be fused. Fix the bundle's YAML.")


def plan(manager: Any) -> Plan:
    """The fused model's interface and wiring, from a loaded ``InferenceManager``."""
    nodes, graph = manager.nodes, manager.graph
    pipeline = os.path.splitext(os.path.basename(manager.model_path))[0]

    def port_of(node: str, port: str, side: str) -> tuple[torch.dtype, tuple[int, ...]]:
        entry = nodes[node]
        names = entry.input_names if side == "input" else entry.output_names
        i = names.index(port)
        if side == "input":
            return entry.input_dtypes[i], entry.input_shapes[i]
        return entry.output_dtypes[i], entry.output_shapes[i]

    inputs = [Port(f"{node}/{port}", *port_of(node, port, "input"))
              for node, port in graph.inputs]
    states = [State(edge.target, f"{edge.target}{STATE_SUFFIX}",
                    (edge.src_node, edge.src_port), *port_of(edge.dst_node, edge.dst_port, "input"),
                    manager.value_dict[edge.dst_node][edge.dst_port].detach().cpu().clone())
              for edge in graph.feedback_edges()]
    # what feeds each node input is the pipeline model's answer (Pipeline.feeds)
    feeds: dict[str, dict[str, tuple[str, Any]]] = {name: {} for name in nodes}
    for name, ports in graph.feeds().items():
        for port, fed in ports.items():
            if len(fed) > 1:
                fail(_fed_twice(fed[1], f"{name}/{port}", fed[0].kind))
            feed = fed[0]
            if feed.kind == GRAPH_INPUT:
                feeds[name][port] = ("input", f"{name}/{port}")
            elif feed.kind == FORWARD:
                feeds[name][port] = ("node", feed.source)
            elif feed.kind == FEEDBACK:
                feeds[name][port] = ("state", f"{name}/{port}")
            else:
                value = manager.value_dict[name][port]
                feeds[name][port] = ("constant", value.detach().cpu().clone())
    taken = {p.name for p in inputs} | {s.input for s in states} | {s.output for s in states}
    outputs = []
    outputs_from = []
    names = graph.output_names()  # the one renaming rule ("__out": a port in and out)
    for node, port in graph.outputs:
        dtype, shape = port_of(node, port, "output")
        key, name = f"{node}/{port}", names[(node, port)]
        if name in taken:
            fail(f"The fused model of {quote(pipeline)} would name two of its ports "
                  f"{quote(name)}. Rename the port {quote(key)}.")
        outputs.append(Port(name, dtype, shape, key))
        outputs_from.append((node, port))
        taken.add(name)
    names = [p.name for p in inputs] + [s.input for s in states] + [s.output for s in states]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        fail(f"The fused model of {quote(pipeline)} would name two of its ports "
              f"{quote(twice[0])} (a port named like another's state output). Rename the port.")
    return Plan(pipeline, os.path.dirname(os.path.abspath(manager.model_path)),
                list(manager.run_order), inputs, outputs, outputs_from, states, feeds)


