"""Declared state on the GPU: a recurrent memory (jit) and a counter (onnx-torchscript,
state ports renamed h_in / h_out), two passes; the bundle carries the state across
steps on the device."""

import torch

import leapp
from leapp import annotate
from _util import seeded, setup

name, out, device = setup(__file__)

cell = torch.nn.Linear(8 + 16, 16).to(device).eval()
head = torch.nn.Linear(16, 4).to(device).eval()


def step(obs, h0, c0):
    x = annotate.input_tensors("memory", {"obs": obs})
    h = annotate.state_tensors("memory", {"h": h0})
    nh = torch.tanh(cell(torch.cat([x, h], dim=-1)))
    annotate.update_state("memory", {"h": nh})
    nh = annotate.output_tensors("memory", {"features": nh * 1.0}, export_with="jit")

    f = annotate.input_tensors("controller", {"features": nh})
    c = annotate.state_tensors("controller", {"count": c0})
    action = torch.tanh(head(f)) + 0.01 * c
    annotate.update_state("controller", {"count": c + 1.0})
    return annotate.output_tensors("controller", {"action": action},
                                   export_with="onnx-torchscript")


leapp.start(name, save_path=out)
with torch.no_grad():
    h0, c0 = torch.zeros(1, 16, device=device), torch.zeros(1, 1, device=device)
    for i in range(2):
        step(seeded(1, 8, seed=i, device=device), h0, c0)
leapp.stop()
leapp.compile_graph(visualize=False)
