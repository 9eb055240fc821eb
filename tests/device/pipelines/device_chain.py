"""Five nodes, one per export backend, traced on the GPU: CUDA inputs, parameters and
a buffer; three passes (the re-entry samples are validated on the traced device)."""

import torch

import leapp
from leapp import annotate
from _util import seeded, setup

name, out, device = setup(__file__)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(10, 32)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 32))

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.scale


encoder = Encoder().to(device).eval()
policy = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ELU(),
                             torch.nn.Linear(32, 6)).to(device).eval()
decoder = torch.nn.Linear(6, 6).to(device).eval()
limits = torch.linspace(0.5, 1.5, 6, device=device)


def step(raw, gain):
    x, g = annotate.input_tensors("sensors", {"raw": raw, "gain": gain})
    x = torch.cat([x * g, x.abs()], dim=-1)[..., :10]
    x = annotate.output_tensors("sensors", {"features": x}, export_with="jit")

    h = annotate.input_tensors("encoder", {"features": x})
    h = annotate.output_tensors("encoder", {"latent": encoder(h)}, export_with="jit-trace")

    p = annotate.input_tensors("policy", {"latent": h})
    p = annotate.output_tensors("policy", {"logits": policy(p)}, export_with="onnx")

    d = annotate.input_tensors("decoder", {"logits": p})
    d = annotate.output_tensors("decoder", {"action": torch.tanh(decoder(d))},
                                export_with="onnx-torchscript")

    a = annotate.input_tensors("actuator", {"action": d})
    return annotate.output_tensors("actuator", {"command": torch.clamp(a * limits, -1, 1)},
                                   export_with="pt2")


leapp.start(name, save_path=out)
with torch.no_grad():
    for i in range(3):
        step(seeded(1, 10, seed=i, device=device),
             seeded(1, 10, seed=100 + i, device=device).abs())
leapp.stop()
leapp.compile_graph(visualize=False)
