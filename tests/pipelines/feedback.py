"""The state-and-feedback seed's inferred-feedback example."""
import sys

import torch

import leapp
from leapp import annotate


def mix_with_feedback(data, feedback):
    centered = data - 0.5
    return torch.tanh(centered + 0.25 * feedback)


def blend_feedback(hidden, previous_feedback):
    return 0.8 * previous_feedback + 0.2 * hidden


leapp.start(name="sample_feedback_graph", save_path=sys.argv[1])
policy_memory = torch.tensor([0.0])
for _ in range(2):
    policy_inputs = annotate.input_tensors("policy_step", {
        "observation_scalar": torch.tensor([1.0]),
        "policy_memory_in": policy_memory,
    })
    policy_context = mix_with_feedback(policy_inputs[0], policy_inputs[1])
    control_action = torch.clamp(policy_context * 2.0, min=-1.0, max=1.0)
    annotate.output_tensors("policy_step", {"policy_context": policy_context,
                                            "control_action": control_action},
                            export_with="jit")
    feedback_inputs = annotate.input_tensors("feedback_update", {
        "policy_context": policy_context,
        "policy_memory_prev": policy_memory,
    })
    policy_memory = blend_feedback(feedback_inputs[0], feedback_inputs[1])
    annotate.output_tensors("feedback_update", {"policy_memory_out": policy_memory},
                            export_with="jit")
leapp.stop()
leapp.compile_graph()
