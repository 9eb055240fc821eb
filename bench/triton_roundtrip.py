"""Triton round trip per step for one robot, loopback, CPU, with the server's own statistics.

    python bench/triton_roundtrip.py [--steps N]

Exports examples/feedback_example.py's bundle into a temporary directory,
writes its Triton repository (python backend: the fused model under the
sequence batcher, the state kept per correlation ID), starts the nvidia-pytriton
wheel's ``tritonserver`` on loopback and drives one robot for ``--steps`` steps
over HTTP and then over GRPC (a new sequence each).  In the same run, as
baselines, the same steps run in-process through ``InferenceManager.run_policy``
and through ``leapp.fusion.FusedModel.step`` (the fused model the server runs).

Figures (medians over the steps, after 20 warm-up steps):

* ``http_round_trip_us`` / ``grpc_round_trip_us``: ``client.infer`` wall time;
* ``server_queue_us``, ``server_compute_input_us``, ``server_compute_infer_us``,
  ``server_compute_output_us``: Triton's own per-request averages over the
  measured steps (statistics extension, deltas around the HTTP run);
* ``inference_manager_step_us`` / ``fused_model_step_us``: the in-process baselines.

Prints one JSON line (``figures``) last on stdout; needs tritonclient and
nvidia-pytriton (see docs/triton.md).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

WARMUP = 20


def _bundle(root: str) -> str:
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "feedback_example", os.path.join(os.path.dirname(HERE), "examples", "feedback_example.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with contextlib.redirect_stdout(io.StringIO()):
        bundle = example.main(root)
    return os.path.join(bundle, "sample_feedback_graph.yaml")


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _stats(client, model: str) -> dict:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    stats = entry["inference_stats"]
    return {key: (int(stats[key]["count"]), int(stats[key]["ns"]))
            for key in ("queue", "compute_input", "compute_infer", "compute_output")}


def _drive(client, module, repository, observations, robot: int) -> list[float]:
    (name,) = repository.inputs
    datatype, shape = repository.inputs[name]
    times = []
    for step, obs in enumerate(observations):
        request = module.InferInput(name, shape, datatype)
        request.set_data_from_numpy(obs.numpy())
        started = time.perf_counter()
        client.infer(repository.entry, [request], sequence_id=robot,
                     sequence_start=step == 0, sequence_end=step == len(observations) - 1)
        times.append(time.perf_counter() - started)
    return times[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    from leapp import InferenceManager
    from leapp.fusion import FusedModel
    from leapp.triton import write_repository
    from leapp.triton_server import TritonServer

    with tempfile.TemporaryDirectory() as root:
        yaml_path = _bundle(root)
        repository = write_repository(yaml_path, os.path.join(root, "repository"),
                                      serve_with="python")
        fused = repository.path + "/" + repository.entry + "/1/fused.onnx"
        (name,) = repository.inputs
        _, shape = repository.inputs[name]
        generator = torch.Generator().manual_seed(0)
        observations = [torch.rand(shape, generator=generator)
                        for _ in range(args.steps + WARMUP)]

        manager = InferenceManager(yaml_path)
        local = []
        for obs in observations:
            started = time.perf_counter()
            manager.run_policy({name: obs})
            local.append(time.perf_counter() - started)
        model = FusedModel(fused, providers=["CPUExecutionProvider"])
        fused_times = []
        for obs in observations:
            started = time.perf_counter()
            model.step({name: obs})
            fused_times.append(time.perf_counter() - started)

        with TritonServer(repository.path) as server:
            http = triton_http.InferenceServerClient(server.http_url)
            before = _stats(http, repository.entry)
            http_times = _drive(http, triton_http, repository, observations, robot=1)
            after = _stats(http, repository.entry)
            grpc = triton_grpc.InferenceServerClient(server.grpc_url)
            grpc_times = _drive(grpc, triton_grpc, repository, observations, robot=2)
            http.close()
            grpc.close()

    figures = {
        "http_round_trip_us": _median_us(http_times),
        "grpc_round_trip_us": _median_us(grpc_times),
        "inference_manager_step_us": _median_us(local[WARMUP:]),
        "fused_model_step_us": _median_us(fused_times[WARMUP:]),
    }
    for key in before:  # Triton's averages over every step of the HTTP run, warm-up included
        count = after[key][0] - before[key][0]
        figures[f"server_{key}_us"] = (after[key][1] - before[key][1]) / max(count, 1) / 1e3
    figures["http_over_inference_manager"] = (figures["http_round_trip_us"]
                                              / figures["inference_manager_step_us"])
    print(json.dumps({"workload": "triton_roundtrip", "steps": args.steps,
                      "figures": figures}))


if __name__ == "__main__":
    main()
