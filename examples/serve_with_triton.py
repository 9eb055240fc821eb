"""Serve a bundle with feedback from Triton Inference Server, two robots at once.

    python examples/serve_with_triton.py [OUTPUT_DIR]

Exports examples/feedback_example.py's pipeline, writes a Triton model
repository for it (the fused pipeline under Triton's sequence batcher, python
backend), starts the ``tritonserver`` of the nvidia-pytriton wheel on free
loopback ports, and drives two robots, each with its own correlation ID and so
its own recurrent state on the server, for 10 interleaved steps.  Each action
is printed next to the one ``InferenceManager`` computes for that robot alone.
Needs ``pip install tritonclient[http] && pip install --no-deps nvidia-pytriton``.
"""
import importlib.util
import os
import sys

import numpy as np
import torch
import tritonclient.http as triton_http

from leapp import InferenceManager
from leapp.triton import write_repository
from leapp.triton_server import TritonServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROBOTS = (1, 2)  # correlation IDs: one sequence, one recurrent state each
STEPS = 10


def export_feedback_bundle(output_dir: str) -> str:
    """The feedback example's bundle; returns its YAML path."""
    spec = importlib.util.spec_from_file_location(
        "feedback_example", os.path.join(HERE, "feedback_example.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    bundle = example.main(output_dir)
    return os.path.join(bundle, "sample_feedback_graph.yaml")


def main(output_dir: str = ".") -> dict:
    yaml_path = export_feedback_bundle(output_dir)
    repository = write_repository(yaml_path, os.path.join(output_dir, "triton_repository"),
                                  serve_with="python")
    (observation,) = repository.inputs  # "policy_step/observation_scalar"
    (action,) = repository.outputs      # "policy_step/control_action"
    datatype, shape = repository.inputs[observation]
    references = {robot: InferenceManager(yaml_path) for robot in ROBOTS}
    generator = torch.Generator().manual_seed(0)
    actions: dict = {robot: [] for robot in ROBOTS}
    with TritonServer(repository.path) as server:
        client = triton_http.InferenceServerClient(server.http_url)
        for step in range(STEPS):
            for robot in ROBOTS:
                obs = 0.5 + 0.4 * (torch.rand(shape, generator=generator) * 2.0 - 1.0)
                request = triton_http.InferInput(observation, shape, datatype)
                request.set_data_from_numpy(obs.numpy())
                result = client.infer(repository.entry, [request], sequence_id=robot,
                                       sequence_start=step == 0,
                                       sequence_end=step == STEPS - 1)
                served = result.as_numpy(action)
                local = references[robot].run_policy({observation: obs})[action].numpy()
                np.testing.assert_allclose(served, local, rtol=1e-5, atol=1e-6)
                actions[robot].append(float(served.reshape(-1)[0]))
                print(f"step {step} robot {robot}: action {served.reshape(-1)[0]:+.6f} "
                      f"(InferenceManager {local.reshape(-1)[0]:+.6f})")
        client.close()
    return actions


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
