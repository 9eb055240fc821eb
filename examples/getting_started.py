"""Getting started: the README's two-node pipeline.

`preprocess` takes two observations declared from two helper functions
(two input_tensors calls feeding one node), builds features, and `predict`
runs a small linear policy on them.  Run:

    python examples/getting_started.py [save_path]
"""
from __future__ import annotations

import os
import sys

import torch

import leapp
from leapp import annotate

torch.manual_seed(0)
WEIGHTS = torch.randn(16, 4)


def get_from_env(name: str) -> torch.Tensor:
    """Stands in for a simulator or robot: an observation of 8 values."""
    return torch.randn(1, 8)


def get_obs1_from_env() -> torch.Tensor:
    obs1 = get_from_env("obs")
    obs1 = annotate.input_tensors("preprocess", {"obs1_name": obs1})
    return obs1


def get_obs2_from_env() -> torch.Tensor:
    obs2 = get_from_env("obs2")
    obs2 = annotate.input_tensors("preprocess", {"obs2_name": obs2})
    return obs2


def pipeline() -> torch.Tensor:
    obs1 = get_obs1_from_env()
    obs2 = get_obs2_from_env()
    obs1_centered = obs1 - obs1.mean()
    obs2_scaled = obs2 / (obs2.abs().max() + 1e-6)
    features = torch.cat([obs1_centered, obs2_scaled], dim=-1)
    annotate.output_tensors("preprocess", {"processed_features": features}, export_with="jit")

    features = annotate.input_tensors("predict", {"features": features})
    output = torch.relu(features @ WEIGHTS)
    annotate.output_tensors("predict", {"output": output},
                            export_with=os.environ.get("LEAPP_EXAMPLE_BACKEND", "onnx"))
    return output


def main(save_path: str = ".") -> str:
    leapp.start(name="my_pipeline", save_path=save_path)
    pipeline()
    leapp.stop()
    leapp.compile_graph()
    bundle = os.path.abspath(os.path.join(save_path, "my_pipeline"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
