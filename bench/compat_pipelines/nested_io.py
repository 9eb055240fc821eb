"""Nested dict/list inputs and outputs (flattened names), both annotation styles.

A node annotated with input_tensors/output_tensors on nested structures, and
an @annotate.method node taking and returning nested containers.
"""

import torch

import leapp
from leapp import annotate
from _util import seeded, setup

name, out = setup(__file__)


@annotate.method(export_with="jit", node_name="mixer")
def mixer(obs, weights):
    left = obs["arm"]["left"] * weights[0]
    right = obs["arm"]["right"] * weights[1]
    return {"mix": left + right, "parts": [left.sum(-1, keepdim=True), right.mean(-1, keepdim=True)]}


def step(i):
    obs = {"arm": {"left": seeded(1, 4, seed=i), "right": seeded(1, 4, seed=10 + i)},
           "base": [seeded(1, 3, seed=20 + i), seeded(1, 2, seed=30 + i)]}
    traced = annotate.input_tensors("reader", obs)
    arm, base = traced  # one value per top-level key, structure kept
    arm_l, arm_r = arm["left"], arm["right"]
    base0, base1 = base
    feats = {
        "arm": {"left": arm_l * 2.0, "right": arm_r - 1.0},
        "base": [torch.cat([base0, base1], dim=-1), base1.sum(-1, keepdim=True)],
    }
    arm_o, base_o = annotate.output_tensors("reader", feats, export_with="jit")
    feats = {"arm": arm_o, "base": base_o}
    weights = [torch.full((1, 4), 0.5), torch.full((1, 4), 2.0)]
    return mixer(feats, weights)


leapp.start(name, save_path=out)
with torch.no_grad():
    for i in range(2):
        step(i)
leapp.stop()
leapp.compile_graph(visualize=False)
