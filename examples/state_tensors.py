"""annotate.state_tensors() / annotate.update_state(): explicit state of a node.

    python examples/state_tensors.py [save_path]

A policy smooths its actions with the previous one.  `last_action` is declared
as state with its first value; update_state() binds the value it takes for the
next step.  The exported node has `last_action` as an input and an output, wired
back by `feedback_flow`, and the bundle's initial values start it at zeros: the
exported pipeline, run step after step (leapp.InferenceManager does the
feedback), reproduces the loop below.
"""
from __future__ import annotations

import os
import sys

import torch

import leapp
from leapp import annotate

torch.manual_seed(0)
WEIGHTS = torch.randn(6, 2)
SMOOTHING = 0.8


def policy_step(obs: torch.Tensor, last_action: torch.Tensor) -> torch.Tensor:
    """One step, as in training code: also the eager reference of the export."""
    obs = annotate.input_tensors("policy", {"obs": obs})
    previous = annotate.state_tensors("policy", {"last_action": last_action})
    action = SMOOTHING * previous + (1.0 - SMOOTHING) * torch.tanh(obs @ WEIGHTS)
    action = annotate.update_state("policy", {"last_action": action})
    annotate.output_tensors("policy", {"action": action}, export_with="jit")
    return action


def observations(steps: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randn(1, 6, generator=generator) for _ in range(steps)]


def main(save_path: str = ".") -> str:
    leapp.start("state_tensors", save_path=save_path)
    last_action = torch.zeros(1, 2)
    for obs in observations():
        last_action = policy_step(obs, last_action)
    leapp.stop()
    leapp.compile_graph()
    bundle = os.path.abspath(os.path.join(save_path, "state_tensors"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
