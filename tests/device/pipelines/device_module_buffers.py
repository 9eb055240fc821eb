"""annotate.module on the GPU: a GRU policy whose hidden state is a reassigned CUDA
buffer (feedback) beside a read-only buffer, exported with onnx-torchscript, and a
smoother with jit; one pass (as bench/compat_pipelines/gru_module.py, for upstream)."""

import torch
import torch.nn as nn

import leapp
from leapp import annotate
from _util import seeded, setup

name, out, device = setup(__file__)


class GRUPolicy(nn.Module):
    def __init__(self, obs_dim=6, hidden=12, act=3):
        super().__init__()
        self.gru = nn.GRU(obs_dim, hidden, num_layers=1, batch_first=False)
        self.head = nn.Sequential(nn.Linear(hidden, 16), nn.ELU(), nn.Linear(16, act))
        self.register_buffer("h_state", torch.zeros(1, 1, hidden))
        self.register_buffer("obs_scale", torch.linspace(0.5, 1.5, obs_dim))

    def forward(self, obs):
        out_, h = self.gru((obs * self.obs_scale).unsqueeze(0), self.h_state)
        self.h_state = h
        return self.head(out_.squeeze(0))


class Smoother(nn.Module):
    def __init__(self, act=3):
        super().__init__()
        self.register_buffer("prev", torch.zeros(1, act))

    def forward(self, a):
        y = 0.7 * self.prev + 0.3 * a
        self.prev = y
        return y


gru_policy = GRUPolicy().to(device).eval()
smoother = Smoother().to(device).eval()

leapp.start(name, save_path=out)
with torch.no_grad():
    obs = annotate.input_tensors("policy", {"obs": seeded(1, 6, seed=0, device=device)})
    annotate.module("policy", gru_policy)
    action = annotate.output_tensors("policy", {"action": gru_policy(obs)},
                                     export_with="onnx-torchscript")
    a = annotate.input_tensors("smooth", {"action": action})
    annotate.module("smooth", smoother)
    annotate.output_tensors("smooth", {"smoothed": smoother(a)}, export_with="jit")
leapp.stop()
leapp.compile_graph(visualize=False)
