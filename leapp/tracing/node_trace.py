"""A callable traced as one node outside every session: the private trace behind
the fused ONNX model's TorchScript and pt2 nodes (leapp.serving.fused_onnx, through
leapp.compiling.backends.onnx).

:func:`trace_callable` runs a callable (a TorchScript module, whose graph the
tracer runs op by op: leapp.tracing.script) once on example inputs, with the
core recording its ops into a node of its own that is never registered in the
session: the session's node registry, configuration, patches and logging stay
as they were.  It refuses, with :class:`NotTraceable` naming why, whatever would
make the recorded graph differ from the callable on other inputs: a running
session (the core's tracing flag belongs to it), a traced value read into Python
(control flow, a shape read from a data-dependent value: leapp.tracing.guards
raises for a node whose NodeInfo is private), a random op, an output that is not
a tensor, or one computed when no op reached the tracer (a scripted function
runs its graph in C++).  A data-dependent op itself (nonzero) is recorded; the
writer has no rule for it.  The caller then takes another way (torch's
exporter) and says so.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .. import _core
from .fx import build_graph_module
from .guards import DataDependent
from .node_info import NodeInfo, info
from .session_checks import describe
from .traced import clone_plain


class NotTraceable(Exception):
    """Why a callable cannot be traced privately into an exact graph."""


def _flat_outputs(result: Any) -> list[Any]:
    if isinstance(result, (tuple, list)):
        return list(result)
    if isinstance(result, dict):
        return list(result.values())
    return [result]


def trace_callable(name: str, fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
                   input_names: Sequence[str], output_names: Sequence[str]
                   ) -> torch.fx.GraphModule:
    """fn(*inputs) traced as one node: the torch.fx graph of its ops (inputs as
    placeholders in order, outputs as returned, a tuple when there are several).

    Raises NotTraceable (the reason) when the recorded graph would not be fn."""
    if _core.is_tracing():
        raise NotTraceable("a leapp tracing session is running in this process (its "
                           "tracer is not shared)")
    if len(inputs) != len(input_names):
        raise ValueError(f"{len(inputs)} example inputs for {len(input_names)} input names")
    node = _core.Node(name)
    node.info["leapp"] = NodeInfo(private=True)
    ports = []
    values = []
    for port_name, example in zip(input_names, inputs):
        value = clone_plain(example)
        dtype, shape = describe(value)
        vid = node.new_value()
        port = _core.Port(port_name, dtype, shape, vid, clone_plain(example), None)
        node.add_input(port)
        ports.append(port)
        values.append(value)
    _core.set_tracing(True)
    try:
        for value, port in zip(values, ports):
            _core.set_carrier(value, node, port.vid, None, True)
        with torch.no_grad():
            try:
                result = fn(*values)
            except DataDependent as exc:
                raise NotTraceable(str(exc)) from None
        outputs = _flat_outputs(result)
        if len(outputs) != len(output_names):
            raise NotTraceable(f"it returned {len(outputs)} outputs where the node declares "
                               f"{len(output_names)}")
        vids = []
        for port_name, out in zip(output_names, outputs):
            if not isinstance(out, torch.Tensor):
                raise NotTraceable(f"output {port_name!r} is a {type(out).__name__}, not a "
                                   "tensor")
            carrier = _core.carrier_of(out)
            if carrier is None and ports and not node.ops:
                # nothing reached the tracer (a scripted function runs its graph in C++):
                # a constant here would freeze what the callable computes
                raise NotTraceable(f"output {port_name!r} was computed without any op "
                                   "reaching leapp's tracer")
            if carrier is None:  # computed from no input: a constant of the node
                vids.append(node.bind_const(clone_plain(out)))
            elif carrier.node is not node:
                raise NotTraceable(f"output {port_name!r} belongs to another node")
            else:
                vids.append(carrier.vid)
        random_ops = info(node).random_ops
        if random_ops:
            raise NotTraceable(f"it draws random numbers ({random_ops[0][0]})")
        live_ops, _ = node.prune(vids)
    finally:
        _core.set_tracing(False)
        _core.release_traced()
        node.finish(0)  # closed: a tensor still carrying it records nothing
    return build_graph_module(node, live_ops, ports, vids).module
