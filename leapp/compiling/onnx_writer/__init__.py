"""The ONNX writer: a traced node's torch.fx graph written as an ONNX model with
the `onnx` package alone (no torch exporter imported).

`write_model` returns the ModelProto, or raises NoRule naming the first call the
writer has no rule for (the backend then sends that node through torch's
exporter and says so).  `LEAPP_ONNX_WRITER=torch` in the environment turns the
writer off: every ONNX node goes through torch's exporter.

Modules: `emit` (the emitter, values, the rule registry), `graph` (the walk and the
model check), `rules` (the op rules, one module per family).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from .emit import NoRule, WriterError
from .graph import Walk, check_against_eager, locate

__all__ = ["NoRule", "WriterError", "ENV", "enabled", "write_model", "locate", "MIN_OPSET",
           "MAX_OPSET"]

#: The environment variable that chooses the writer: "torch" forces torch's exporter.
ENV = "LEAPP_ONNX_WRITER"
#: The opsets the rules are written for (others go through torch's exporter).
MIN_OPSET = 14
MAX_OPSET = 22


def enabled() -> bool:
    """False when LEAPP_ONNX_WRITER=torch (torch's exporter for every node)."""
    return os.environ.get(ENV, "").strip().lower() not in ("torch", "off", "0")


def write_model(node: str, module: torch.fx.GraphModule, example_inputs: list[torch.Tensor],
                input_names: list[str], output_names: list[str], opset: int,
                producer_version: str = "", origins: dict | None = None) -> Any:
    """The node's ONNX model (onnx.ModelProto): inputs and outputs named and ordered as
    given, static shapes and dtypes as traced, one opset.  Raises NoRule (a call without
    a rule) or WriterError (the written model disagrees with eager).

    Shapes inside the graph follow the inputs at run time where the node keeps an
    input's dimensions (a reshape's leading ones, a constant sized like the data it
    meets): the same model for the traced shapes, and one a batched fused model
    stacks robots on as written (docs/fuse.md).

    origins, when given, is filled with the fx call each written value comes from
    (`locate` names the op whose value parts from eager's)."""
    import onnx
    from onnx import helper

    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise NoRule(f"opset {opset}", f"the writer's rules cover opsets {MIN_OPSET}-"
                                       f"{MAX_OPSET}")
    walk = Walk(module, example_inputs, input_names, output_names, opset, node)
    graph = walk.run()
    if origins is not None:
        origins.update(walk.origins)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="leapp",
                              producer_version=producer_version)
    model.ir_version = max(8, helper.find_min_ir_version_for(opsets))
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as exc:
        raise WriterError(f"[{node}] the written model fails onnx.checker: {exc}") from exc
    try:
        check_against_eager(model, walk.expected, node)
    except onnx.shape_inference.InferenceError as exc:
        raise WriterError(f"[{node}] ONNX shape inference rejects the written model: "
                          f"{exc}") from exc
    return model
