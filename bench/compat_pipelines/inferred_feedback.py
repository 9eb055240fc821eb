"""Inferred cross-node feedback: a later node's output re-enters an earlier
node on the next pass (the loop must run at least twice)."""

import torch

import leapp
from leapp import annotate
from _util import setup

name, out = setup(__file__)


def mix(data, memory):
    return torch.tanh((data - 0.5) + 0.25 * memory)


def blend(hidden, previous):
    return 0.8 * previous + 0.2 * hidden


leapp.start(name, save_path=out)
memory = torch.tensor([[0.1, -0.2, 0.3]])
last_cmd = torch.zeros(1, 3)
with torch.no_grad():
    for i in range(3):
        obs, mem_in, cmd_in = annotate.input_tensors("policy_step", {
            "observation": torch.full((1, 3), 1.0 + i),
            "memory_in": memory,
            "last_command": last_cmd,
        })
        context = mix(obs, mem_in) + 0.1 * cmd_in
        action = torch.clamp(context * 2.0, min=-1.0, max=1.0)
        context, action = annotate.output_tensors(
            "policy_step", {"context": context, "action": action}, export_with="jit")

        ctx, prev = annotate.input_tensors("memory_update", {
            "context": context, "memory_prev": memory})
        memory = annotate.output_tensors("memory_update",
                                         {"memory_out": blend(ctx, prev)},
                                         export_with="jit")

        a = annotate.input_tensors("command", {"action": action})
        last_cmd, _applied = annotate.output_tensors(
            "command", {"command": a * 0.5, "applied": a + 0.01 * a.sum()},
            export_with="pt2")
leapp.stop()
leapp.compile_graph(visualize=False)
