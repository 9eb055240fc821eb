"""Nodes mixing the three kinds of outputs: regular outputs, updated state
(declared with state_tensors/update_state, and reassigned annotate.module
buffers) and static_outputs, whose order in the YAML and in the exported
model must be upstream's (regular, then state in declaration order, then
static).  The first node also returns an output named like one of its inputs
and exports with ONNX, so both sides rename it cmd_in / cmd_out next to the
state's ema_in / ema_out.  Two traced passes, except for the node with
module buffers: upstream 0.7.2 fails validation of re-entry samples for
module-buffer state (see gru_module.py), so that node traces once."""

import torch
import torch.nn as nn

import leapp
from leapp import annotate
from _util import seeded, setup

name, out = setup(__file__)


class Smoother(nn.Module):
    """Exponential smoothing: a reassigned buffer (state) and a read-only gain."""

    def __init__(self, act=3):
        super().__init__()
        self.register_buffer("prev", torch.zeros(1, act))
        self.register_buffer("gain", torch.linspace(0.2, 0.6, act).unsqueeze(0))

    def forward(self, a):
        y = self.prev + self.gain * (a - self.prev)
        self.prev = y
        return y


encoder = nn.Linear(6, 8).eval()
head = nn.Sequential(nn.Linear(8, 16), nn.ELU(), nn.Linear(16, 3)).eval()
smoother = Smoother().eval()

leapp.start(name, save_path=out)
with torch.no_grad():
    for i in range(2):
        cmd, obs = annotate.input_tensors("filter", {"cmd": seeded(1, 3, seed=i),
                                                      "obs": seeded(1, 6, seed=10 + i)})
        ema = annotate.state_tensors("filter", {"ema": torch.zeros(1, 6)})
        ema_new = 0.9 * ema + 0.1 * obs
        annotate.update_state("filter", {"ema": ema_new})
        cmd_f, feat = annotate.output_tensors(
            "filter", {"cmd": torch.clamp(cmd, -1.0, 1.0), "feat": encoder(ema_new)},
            static_outputs={"obs_scale": torch.full((1, 6), 0.25)},
            export_with="onnx-torchscript")

        f, c = annotate.input_tensors("policy", {"feat": feat, "cmd": cmd_f})
        prev, count = annotate.state_tensors("policy", {"prev": torch.zeros(1, 3),
                                                        "count": torch.zeros(1, 1)})
        action = torch.tanh(head(f)) + 0.1 * c + 0.05 * prev
        annotate.update_state("policy", {"count": count + 1.0})  # updated in reverse order
        annotate.update_state("policy", {"prev": action})
        action, _ = annotate.output_tensors(
            "policy", {"action": action, "action_sq": (action * action).sum(dim=-1, keepdim=True)},
            static_outputs={"kp": torch.full((1, 3), 40.0), "kd": torch.full((1, 3), 2.0)},
            export_with="onnx-dynamo")

        if i == 0:  # see the module docstring
            a = annotate.input_tensors("smooth", {"action": action})
            annotate.module("smooth", smoother)
            annotate.output_tensors("smooth", {"smoothed": smoother(a)},
                                    static_outputs={"limits": torch.tensor([1.0, 2.0, 3.0])},
                                    export_with="jit")
leapp.stop()
leapp.compile_graph(visualize=False)
