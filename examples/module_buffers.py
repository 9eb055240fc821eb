"""annotate.module(): an nn.Module's registered buffers, tracked while its node traces.

    python examples/module_buffers.py [save_path]

`RunningNormalizer` keeps a running mean of what it has seen (`running_mean`,
reassigned in forward) and the number of steps (`count`, reassigned too); its
`scale` buffer is only read.  With annotate.module("policy", model):

* a reassigned buffer becomes feedback state of the node: an input and an
  output of the same name, wired by `feedback_flow`, starting from the value it
  had when tracing began (written to `<graph>_initial_values.safetensors`);
* a buffer that is only read is baked into the exported model as a constant.

The loop runs the node several times, as a control loop would: the node
traces on the first pass, later passes are recorded as validation samples.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

import leapp
from leapp import annotate


class RunningNormalizer(nn.Module):
    def __init__(self, size: int = 4):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(1, size))
        self.register_buffer("count", torch.zeros(1, 1))
        self.register_buffer("scale", torch.linspace(0.5, 2.0, size).reshape(1, size))
        self.head = nn.Linear(size, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        count = self.count + 1.0
        self.running_mean = self.running_mean + (obs - self.running_mean) / count
        self.count = count  # reassignments: both become feedback state
        return self.head((obs - self.running_mean) * self.scale)  # scale: a constant


def observations(steps: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(1, 4, generator=generator) for _ in range(steps)]


def main(save_path: str = ".") -> str:
    torch.manual_seed(0)
    model = RunningNormalizer().eval()
    leapp.start("module_buffers", save_path=save_path)
    for obs in observations():
        obs = annotate.input_tensors("policy", {"obs": obs})
        annotate.module("policy", model)
        with torch.no_grad():
            action = model(obs)
        annotate.output_tensors("policy", {"action": action}, export_with="jit")
    leapp.stop()
    leapp.compile_graph()
    bundle = os.path.abspath(os.path.join(save_path, "module_buffers"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
