"""A GRU policy whose hidden state is a registered buffer, exported as feedback.

    python examples/stateful_gru_export.py [OUTPUT_DIR]

annotate.module() tracks the model's registered buffers while the node
traces: h_state is reassigned in forward(), so it becomes a feedback state of
the exported node (input and output of the same name, wired through
feedback_flow, first value in stateful_gru_initial_values.safetensors).  The
bundle goes to OUTPUT_DIR/stateful_gru (OUTPUT_DIR defaults to the current
directory).

The node is exported with export_with="onnx-torchscript", which suits
recurrent layers.  LEAPP_EXAMPLE_BACKEND=<backend> overrides it (for example
"jit" on an installation without the ONNX backend).
"""
import os
import sys

import torch
import torch.nn as nn

import leapp
from leapp import annotate

EXPORT_WITH = os.environ.get("LEAPP_EXAMPLE_BACKEND", "onnx-torchscript")


class GRUPolicy(nn.Module):
    def __init__(self, obs_dim=16, hidden_dim=32, action_dim=8):
        super().__init__()
        self.gru = nn.GRU(obs_dim, hidden_dim, num_layers=1,
                          batch_first=False)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_dim, 32),
            nn.ELU(),
            nn.Linear(32, action_dim),
        )
        self.register_buffer("h_state", torch.zeros(1, 1, hidden_dim))

    def forward(self, obs):
        gru_out, h_out = self.gru(obs.unsqueeze(0), self.h_state)
        self.h_state = h_out  # reassignment detected by LEAPP
        return self.mlp(gru_out.squeeze(0))


def main(output_dir: str = ".", export_with: str = EXPORT_WITH) -> str:
    torch.manual_seed(0)
    model = GRUPolicy().eval()
    obs = torch.randn(1, 16)

    leapp.start("stateful_gru", save_path=output_dir)

    obs_traced = annotate.input_tensors("policy", {"obs": obs})
    annotate.module("policy", model)
    action = model(obs_traced)

    annotate.output_tensors(
        "policy",
        {"action": action},
        export_with=export_with,
    )

    leapp.stop()
    leapp.compile_graph(visualize=False)
    bundle = os.path.abspath(os.path.join(output_dir, "stateful_gru"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
