"""TorchScript backends: jit-script (torch.jit.script) and jit-trace (torch.jit.trace)."""
from __future__ import annotations

import os

import torch

from . import Exported, prepare_inputs


def export(node: str, name: str, params: dict, module: torch.fx.GraphModule,
           example_inputs: list[torch.Tensor], input_names: list[str],
           output_names: list[str], out_dir: str) -> Exported:
    """Script or trace the node's GraphModule and save <node>.pt (frozen)."""
    inputs = prepare_inputs(example_inputs)
    module = module.eval()
    if name == "jit-trace":
        scripted = torch.jit.trace(module, tuple(inputs), **params)
    else:
        scripted = torch.jit.script(module)
    path = os.path.join(out_dir, f"{node}.pt")
    frozen = torch.jit.freeze(scripted.eval())
    frozen.save(path)
    return Exported(model=scripted, path=path, yaml_backend="jit", input_names=input_names,
                    output_names=output_names)
