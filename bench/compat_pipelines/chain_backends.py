"""Multi-node chain, one node per export backend.

sensors (jit) -> encoder (jit-trace) -> policy (onnx, i.e. onnx-dynamo)
-> decoder (onnx-torchscript) -> actuator (pt2), run for 3 passes so the
re-entry cache (max_cached_io) is exercised by validation.
"""

import torch

import leapp
from leapp import annotate
from _util import seeded, setup

name, out = setup(__file__)

encoder = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh()).eval()
policy = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(),
                             torch.nn.Linear(32, 6)).eval()
decoder = torch.nn.Linear(6, 6).eval()
scale = torch.linspace(0.5, 1.5, 6)


def step(raw, gain):
    x, g = annotate.input_tensors("sensors", {"raw": raw, "gain": gain})
    x = torch.cat([x * g, x.abs()], dim=-1)[..., :10]
    x = annotate.output_tensors("sensors", {"features": x}, export_with="jit")

    h = annotate.input_tensors("encoder", {"features": x})
    h = encoder(h)
    h = annotate.output_tensors("encoder", {"latent": h}, export_with="jit-trace")

    p = annotate.input_tensors("policy", {"latent": h})
    p = policy(p)
    p = annotate.output_tensors("policy", {"logits": p}, export_with="onnx")

    d = annotate.input_tensors("decoder", {"logits": p})
    d = torch.tanh(decoder(d))
    d = annotate.output_tensors("decoder", {"action": d},
                                export_with="onnx-torchscript")

    a = annotate.input_tensors("actuator", {"action": d})
    a = torch.clamp(a * scale, -1.0, 1.0)
    return annotate.output_tensors("actuator", {"command": a}, export_with="pt2")


leapp.start(name, save_path=out)
with torch.no_grad():
    for i in range(3):
        step(seeded(1, 10, seed=i), seeded(1, 10, seed=100 + i).abs())
leapp.stop()
leapp.compile_graph(visualize=False)
