"""exported-program backend: torch.export.export, saved as <node>.pt2."""
from __future__ import annotations

import os

import torch

from ...bundle.modes import save_via_memory
from ..export_errors import exporter_call
from . import ExportContext, Exported, prepare_inputs


def export(node: str, name: str, params: dict, module: torch.fx.GraphModule,
           example_inputs: list[torch.Tensor], input_names: list[str],
           output_names: list[str], out_dir: str, context: ExportContext) -> Exported:
    """torch.export the node's GraphModule (static shapes) and save <node>.pt2."""
    inputs = tuple(prepare_inputs(example_inputs))
    kwargs = {"strict": bool(params["strict"])} if params.get("strict") is not None else {}
    with exporter_call(node, name, module):
        program = torch.export.export(module.eval(), inputs, **kwargs)
    path = os.path.join(out_dir, f"{node}.pt2")
    save_via_memory(lambda handle: torch.export.save(program, handle), path)
    return Exported(model=program.module(), path=path, yaml_backend="pt2",
                    input_names=input_names, output_names=output_names,
                    parameters={"torch_version": str(torch.__version__)})
