"""Inferred cross-node feedback: two nodes, run twice, memory flows back.

    python examples/feedback_example.py [OUTPUT_DIR]

policy_step mixes an observation with a memory value; feedback_update blends
the policy's context into that memory.  On the second iteration the memory
produced by feedback_update enters policy_step again, so LEAPP records the
connection under feedback_flow.  The bundle goes to
OUTPUT_DIR/sample_feedback_graph (OUTPUT_DIR defaults to the current directory).
"""
import os
import sys

import torch

import leapp
from leapp import annotate


def mix_with_feedback(data, feedback):
    centered = data - 0.5
    return torch.tanh(centered + 0.25 * feedback)


def blend_feedback(hidden, previous_feedback):
    return 0.8 * previous_feedback + 0.2 * hidden


def main(output_dir: str = ".") -> str:
    leapp.start(name="sample_feedback_graph", save_path=output_dir)

    policy_memory = torch.tensor([0.0])

    for _ in range(2):  # needed for inferred cross-node feedback
        policy_inputs = annotate.input_tensors("policy_step", {
            "observation_scalar": torch.tensor([1.0]),
            "policy_memory_in": policy_memory,
        })
        policy_context = mix_with_feedback(policy_inputs[0], policy_inputs[1])
        control_action = torch.clamp(policy_context * 2.0, min=-1.0, max=1.0)
        annotate.output_tensors(
            "policy_step",
            {"policy_context": policy_context,
             "control_action": control_action},
            export_with="jit",
        )

        feedback_inputs = annotate.input_tensors("feedback_update", {
            "policy_context": policy_context,
            "policy_memory_prev": policy_memory,
        })
        policy_memory = blend_feedback(feedback_inputs[0], feedback_inputs[1])
        annotate.output_tensors(
            "feedback_update",
            {"policy_memory_out": policy_memory},
            export_with="jit",
        )

    leapp.stop()
    leapp.compile_graph()
    bundle = os.path.abspath(os.path.join(output_dir, "sample_feedback_graph"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
