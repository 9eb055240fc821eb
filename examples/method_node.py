"""@annotate.method: a whole function, or a method, traced as one node.

    python examples/method_node.py [save_path]

The node's inputs are the function's parameters (named as in its signature)
and its outputs are named after the variables of its `return` statement.
`normalize` is a plain function; `Policy.act` is a method, decorated in the
class body, and runs as a node on every instance; `self` is not an input.
Outside a session both are the plain functions.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

import leapp
from leapp import annotate


@annotate.method(export_with="jit")
def normalize(obs: torch.Tensor) -> torch.Tensor:
    centered = obs - obs.mean(dim=-1, keepdim=True)
    features = centered / (centered.std(dim=-1, keepdim=True) + 1e-6)
    return features


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))

    @annotate.method(node_name="policy", export_with="onnx")
    def act(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(features)
        action = torch.argmax(logits, dim=-1)
        return logits, action


def run(policy: Policy, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return policy.act(normalize(obs))


def main(save_path: str = ".") -> str:
    torch.manual_seed(0)
    policy = Policy().eval()
    leapp.start("method_node", save_path=save_path)
    with torch.no_grad():
        run(policy, torch.randn(1, 8))
    leapp.stop()
    leapp.compile_graph()
    bundle = os.path.abspath(os.path.join(save_path, "method_node"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
