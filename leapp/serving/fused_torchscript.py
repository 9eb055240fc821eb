"""The TorchScript fused model: one scripted module calling every node's program in
run order.
"""
from __future__ import annotations

from typing import Any

import torch

from ..bundle.safe_load import quote
from ..models.load import load
from .fused_onnx import example_inputs, has_control_flow, traced_pt2
from .fused_plan import Plan, fail


class _Pipeline(torch.nn.Module):
    """Runs the nodes in order; traced once into the fused TorchScript module."""

    def __init__(self, the_plan: Plan, modules: dict[str, torch.nn.Module],
                 manager: Any) -> None:
        super().__init__()
        self.plan = the_plan
        self.manager = manager
        self.steps = torch.nn.ModuleDict()
        self._keys = {}
        for i, name in enumerate(the_plan.order):
            key = f"n{i}"
            self.steps[key] = modules[name]
            self._keys[name] = key
        self._constants: dict[tuple[str, str], str] = {}
        for name, feeds in the_plan.feeds.items():
            for port, (kind, what) in feeds.items():
                if kind == "constant":
                    buffer = f"c_{self._keys[name]}_{len(self._constants)}"
                    self.register_buffer(buffer, what)
                    self._constants[(name, port)] = buffer

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        the_plan = self.plan
        values = {p.name: a for p, a in zip(the_plan.inputs, args)}
        values.update({s.input: a for s, a in zip(the_plan.states,
                                                  args[len(the_plan.inputs):])})
        produced: dict[tuple[str, str], torch.Tensor] = {}
        for name in the_plan.order:
            entry = self.manager.nodes[name]
            call_args = []
            for port in entry.input_names:
                kind, what = the_plan.feeds[name][port]
                if kind in ("input", "state"):
                    call_args.append(values[what])
                elif kind == "node":
                    call_args.append(produced[what])
                else:
                    call_args.append(getattr(self, self._constants[(name, port)]))
            result = self.steps[self._keys[name]](*call_args)
            if isinstance(result, torch.Tensor):
                result = (result,)
            for port, value in zip(entry.output_names, result):
                produced[(name, port)] = value
        # every output is a distinct tensor: TorchScript returns them as given
        return tuple([produced[s] for s in the_plan.outputs_from]
                     + [produced[s.source] for s in the_plan.states])


def build_torchscript(the_plan: Plan, manager: Any) -> Any:
    """The fused ``torch.jit.ScriptModule`` for ``the_plan``."""
    from ..bundle.pt2_reader import load_pt2

    modules: dict[str, torch.nn.Module] = {}
    for name in the_plan.order:
        entry = manager.nodes[name]
        if entry.backend == "jit":
            modules[name] = load("jit", entry.model_path, device="cpu")[0]
        elif entry.backend == "pt2":
            program = load_pt2(entry.model_path)
            if has_control_flow(program):
                fail(f"Node {quote(name)} (pt2) holds control flow (torch.cond or a loop), "
                      "which tracing into TorchScript would cut to one branch. Fuse to "
                      "format='onnx' instead.")
            try:
                modules[name] = traced_pt2(program, example_inputs(entry))
            except Exception as exc:
                fail(f"Node {quote(name)} (pt2) could not be traced into TorchScript for the "
                      f"fused model: {type(exc).__name__}: {quote(str(exc), 400)}. Fuse to "
                      "format='onnx' instead.")
        else:
            fail(f"Node {quote(name)} exists only as an ONNX model ({quote(entry.model_path)}), "
                  "which cannot be turned into TorchScript. Fuse this bundle to format='onnx' "
                  f"(leapp.fuse(..., format='onnx')), or export node {quote(name)} with "
                  "export_with='jit' and compile again.")
    wrapper = _Pipeline(the_plan, modules, manager).eval()
    example = tuple(torch.zeros(p.shape, dtype=p.dtype) for p in the_plan.inputs) + tuple(
        s.initial.clone() for s in the_plan.states)
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, example, check_trace=False, strict=False)
    return traced


