"""TorchScript backends: jit-script (torch.jit.script) and jit-trace (torch.jit.trace)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from .._logging import logger
from . import Exported, prepare_inputs


@contextlib.contextmanager
def torchscript_enabled() -> Iterator[None]:
    """TorchScript switched on while the node is scripted, then put back as it was.

    A client may run with TorchScript disabled (Isaac Lab's export entry point
    calls torch.jit._state.disable()), and then torch.jit.script / trace return
    the module unchanged, which cannot be frozen or saved.
    """
    state = torch.jit._state._enabled
    was_enabled = bool(state.enabled)
    if not was_enabled:
        logger.info("TorchScript is disabled; enabling it while the node is scripted.")
        torch.jit._state.enable()
    try:
        yield
    finally:
        if not was_enabled:
            torch.jit._state.disable()


def export(node: str, name: str, params: dict, module: torch.fx.GraphModule,
           example_inputs: list[torch.Tensor], input_names: list[str],
           output_names: list[str], out_dir: str) -> Exported:
    """Script or trace the node's GraphModule and save <node>.pt (frozen)."""
    inputs = prepare_inputs(example_inputs)
    module = module.eval()
    with torchscript_enabled():
        if name == "jit-trace":
            scripted = torch.jit.trace(module, tuple(inputs), **params)
        else:
            scripted = torch.jit.script(module)
        path = os.path.join(out_dir, f"{node}.pt")
        frozen = torch.jit.freeze(scripted.eval())
        frozen.save(path)
    return Exported(model=scripted, path=path, yaml_backend="jit", input_names=input_names,
                    output_names=output_names)
