"""Export three small pipelines with upstream leapp 0.7.2 and record its runs.

Run with the upstream environment:

    .compat-venv/bin/python bench/make_upstream_fixtures.py [OUT_DIR]   # make upstream-venv

OUT_DIR defaults to tests/data/upstream.  For each bundle it writes the
exported directory and ``<bundle>_expected.safetensors`` holding, for steps
0..9, the inputs fed to upstream's InferenceManager (``in/<step>/<node>/<input>``)
and the outputs it returned (``out/<step>/<node>/<output>``).
"""
from __future__ import annotations

import os
import shutil
import sys

import torch
from safetensors.torch import save_file

import leapp
from leapp import InferenceManager, annotate

STEPS = 10


def export_chain(out_dir: str) -> None:
    """jit: preprocess (normalise) -> policy (linear + tanh)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 3).eval()

    @annotate.method(node_name="preprocess", export_with="jit")
    def preprocess(obs):
        return (obs - obs.mean()) / (obs.std() + 1e-6)

    leapp.start(name="chain", save_path=out_dir)
    features = preprocess(torch.randn(1, 6))
    x = annotate.input_tensors("policy", {"features": features})
    action = torch.tanh(linear(x))
    annotate.output_tensors("policy", {"action": action}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)


def export_state(out_dir: str) -> None:
    """onnx-torchscript node with a declared state (h_in/h_out after renaming)."""
    torch.manual_seed(1)
    cell = torch.nn.Linear(4 + 5, 5).eval()
    leapp.start(name="stateful", save_path=out_dir)
    obs = annotate.input_tensors("policy", {"obs": torch.randn(1, 4)})
    h = annotate.state_tensors("policy", {"h": torch.full((1, 5), 0.5)})
    h_next = torch.tanh(cell(torch.cat([obs, h], dim=-1)))
    action = h_next[:, :2] * 2.0
    annotate.update_state("policy", {"h": h_next})
    annotate.output_tensors("policy", {"action": action}, export_with="onnx-torchscript")
    leapp.stop()
    leapp.compile_graph(visualize=False)


def export_feedback(out_dir: str) -> None:
    """Two jit nodes with an inferred cross-node feedback loop (traced twice)."""
    leapp.start(name="feedback", save_path=out_dir)
    memory = torch.tensor([0.25])
    for _ in range(2):
        inputs = annotate.input_tensors("policy_step", {
            "observation_scalar": torch.tensor([1.0]),
            "policy_memory_in": memory,
        })
        context = torch.tanh((inputs[0] - 0.5) + 0.25 * inputs[1])
        action = torch.clamp(context * 2.0, min=-1.0, max=1.0)
        annotate.output_tensors("policy_step", {"policy_context": context,
                                                "control_action": action},
                                export_with="jit")
        fb = annotate.input_tensors("feedback_update", {
            "policy_context": context,
            "policy_memory_prev": memory,
        })
        memory = 0.8 * fb[1] + 0.2 * fb[0]
        annotate.output_tensors("feedback_update", {"policy_memory_out": memory},
                                export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)


def record(bundle_dir: str, name: str) -> None:
    """Run upstream's InferenceManager for STEPS steps on seeded inputs."""
    manager = InferenceManager(os.path.join(bundle_dir, f"{name}.yaml"))
    generator = torch.Generator().manual_seed(1234)
    tensors = {}
    for step in range(STEPS):
        inputs = {}
        for key in manager.inputs:
            node, port = key.split("/")
            ref = manager.value_dict[node][port]
            inputs[key] = torch.randn(ref.shape, generator=generator).to(ref.dtype)
            tensors[f"in/{step}/{key}"] = inputs[key].clone()
        outputs = manager.run_policy(inputs)
        for key, value in outputs.items():
            tensors[f"out/{step}/{key}"] = value.detach().clone().contiguous()
    save_file(tensors, os.path.join(bundle_dir, f"{name}_expected.safetensors"))


def main() -> None:
    out_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                              os.path.join(os.path.dirname(__file__), "..", "tests",
                                           "data", "upstream"))
    os.makedirs(out_dir, exist_ok=True)
    for name, export in (("chain", export_chain), ("stateful", export_state),
                         ("feedback", export_feedback)):
        bundle = os.path.join(out_dir, name)
        shutil.rmtree(bundle, ignore_errors=True)
        export(out_dir)
        record(bundle, name)
        for junk in ("log.txt", f"{name}.png"):
            path = os.path.join(bundle, junk)
            if os.path.exists(path):
                os.remove(path)
        print(f"wrote {bundle}")


if __name__ == "__main__":
    main()
