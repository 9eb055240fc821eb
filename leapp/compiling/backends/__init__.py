"""Export backends: one module per backend, chosen by export_with.

Every backend takes a node's torch.fx.GraphModule with its example inputs and
returns an Exported: the file it wrote, the final port names (ONNX may rename or
drop ports), the extra YAML parameters and, where one is at hand, the in-memory
model.  Validation never runs that in-memory model: it reloads the saved file
with InferenceManager's loader (leapp.models.load.load_node, through
leapp.compiling.validation.SavedModel).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ...bundle.backend_names import (BACKENDS, CANONICAL, canonical,  # noqa: F401
                                     check_backend)

# backend module -> its dotted name (spelled out so that the import graph sees it)
MODULES = {
    "jit": "leapp.compiling.backends.jit",
    "onnx": "leapp.compiling.backends.onnx",
    "pt2": "leapp.compiling.backends.pt2",
    "byom": "leapp.compiling.backends.byom",
}


#: who wrote a node's ONNX model (Exported.writer: a validation failure names it)
WRITER = "leapp's ONNX writer"
TORCH_EXPORTER = "torch's ONNX exporter"


@dataclass(frozen=True)
class ExportContext:
    """What compile_graph tells every backend about the compile (the exporters read no
    session state): the bundle directory being written and whether the session is
    verbose."""

    bundle_dir: str
    verbose: bool = False


@dataclass
class Exported:
    """What a backend produced for one node (model: in memory, None when not kept)."""

    model: Callable[..., Any] | None
    path: str | None
    yaml_backend: str | None
    input_names: list[str]
    output_names: list[str]
    parameters: dict = field(default_factory=dict)
    dropped_inputs: list[str] = field(default_factory=list)
    seconds: float | None = None  # export time, shown by compile_graph()'s result
    external: bool = False  # path lies outside the bundle by the user's choice (BYOM)
    #: why leapp's ONNX writer sent this node to torch's exporter (None: it did not)
    fallback: str | None = None
    #: who wrote an ONNX model ("leapp's ONNX writer" / "torch's ONNX exporter"; None
    #: for the other backends): a validation failure names it and the switch
    writer: str | None = None


def export_node(node: str, export_with: str | None, backend_params: dict | None,
                module: torch.fx.GraphModule, example_inputs: list[torch.Tensor],
                input_names: list[str], output_names: list[str], out_dir: str,
                context: ExportContext | None = None) -> Exported:
    """Export one node into out_dir with the backend export_with names (context: the
    bundle directory, default out_dir's parent, and the verbosity)."""
    name = check_backend(node, export_with, backend_params)
    if context is None:
        context = ExportContext(os.path.dirname(os.path.abspath(out_dir)))
    backend = importlib.import_module(MODULES[BACKENDS[name][0]])
    return backend.export(node, name, dict(backend_params or {}), module, example_inputs,
                          list(input_names), list(output_names), out_dir, context)


def prepare_inputs(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Example inputs as plain, detached tensors outside inference mode.

    Each is a fresh tensor, never a view: torch.export fakes a view's base
    too, and the fake view and base are then held from C++, out of the
    garbage collector's sight, so every export of a view input would keep
    its fake mode and ShapeEnv (fake tensors, guards, frame summaries) alive
    for good.
    """
    with torch._C.DisableTorchFunctionSubclass():
        return [_fresh_plain(t) for t in inputs]


def _fresh_plain(t: torch.Tensor) -> torch.Tensor:
    """A detached, non-view torch.Tensor copy of t."""
    copy = t.detach().clone()  # plain: torch-function subclasses are switched off
    if type(copy) is not torch.Tensor:  # a subclass that keeps its type through clone
        copy = copy.as_subclass(torch.Tensor).clone()
    return copy
