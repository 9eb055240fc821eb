"""The whole path on a GPU (issue 32): trace, export, validate and run with CUDA tensors.

Every test runs on each device of DEVICES: "cpu" everywhere, "cuda" only where
torch sees a GPU (the `cuda` marker: tests/conftest.py skips it elsewhere, so CI
runs the CPU half and `make test-device` the GPU half on a GPU machine).  The
CPU half checks the same code paths, so a test of the GPU half is known to work
as written before a GPU ever runs it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import leapp
from leapp import annotate
from support import ROOT

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BACKENDS = ["jit", "jit-trace", "onnx", "onnx-torchscript", "pt2"]
TOL = 1e-5


def ort_has_cuda() -> bool:
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers()


class Encoder(nn.Module):
    """A module with parameters and a buffer, moved to the device as a whole."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 4)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * self.scale + x[:, :4].mean(-1, keepdim=True)


def observation(step: int, device: str, shape: tuple = (2, 6)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(50 + step)).to(device)


def trace_encoder(save_path: str, device: str, backend: str, steps: int = 3) -> str:
    """The encoder traced on device; the bundle's YAML path."""
    torch.manual_seed(0)
    model = Encoder().to(device).eval()
    graph = f"enc_{device}_{backend.replace('-', '_')}"
    leapp.start(graph, save_path=save_path)
    with torch.no_grad():
        for step in range(steps):
            x = annotate.input_tensors("encoder", {"obs": observation(step, device)})
            annotate.output_tensors("encoder", {"features": model(x)}, export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"encoder": True}
    return os.path.join(save_path, graph, f"{graph}.yaml")


def eager_encoder(device: str, steps: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Encoder().to(device).eval()
    with torch.no_grad():
        return [model(observation(step, device)) for step in range(steps)]


def runtime_device(backend: str) -> str:
    """Where InferenceManager (and compile_graph's validation) runs a model, whatever
    device it was traced on: CUDA when torch sees a GPU, as upstream; ONNX models there
    only where onnxruntime has its CUDA provider (else the CPU, with a warning)."""
    if not torch.cuda.is_available():
        return "cpu"
    if backend.startswith("onnx") and not ort_has_cuda():
        return "cpu"
    return "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_every_backend_exports_a_trace_on_the_device(tmp_path, device, backend):
    """CUDA inputs, parameters and buffers traced; exported; validated by compile_graph
    and run by InferenceManager on the GPU when there is one (as upstream)."""
    yaml_path = trace_encoder(str(tmp_path), device, backend)
    manager = leapp.InferenceManager(yaml_path)
    runs_on = runtime_device(backend)
    assert manager.nodes["encoder"].device == runs_on
    expected = eager_encoder(device, 4)
    for step, want in enumerate(expected):
        got = manager.run_policy({"encoder/obs": observation(step, device)})["encoder/features"]
        assert got.device.type == runs_on
        torch.testing.assert_close(got.to(device), want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_on_another_device_than_the_bundles(tmp_path, device):
    """A bundle traced on device takes inputs from the other device (moved to its own),
    and runs in a process that sees no GPU (CUDA_VISIBLE_DEVICES='')."""
    yaml_path = trace_encoder(str(tmp_path), device, "jit")
    other = "cpu" if device == "cuda" else ("cuda" if torch.cuda.is_available() else "cpu")
    manager = leapp.InferenceManager(yaml_path)
    got = manager.run_policy({"encoder/obs": observation(0, other)})["encoder/features"]
    assert got.device.type == runtime_device("jit")
    want = eager_encoder(device, 1)[0]
    torch.testing.assert_close(got.to(device), want, rtol=TOL, atol=TOL)
    script = ("import json, sys, torch, leapp\n"
              "m = leapp.InferenceManager(sys.argv[1])\n"
              "x = torch.tensor(json.loads(sys.argv[2]))\n"
              "y = m.run_policy({'encoder/obs': x})['encoder/features']\n"
              "print(json.dumps({'device': y.device.type, 'cuda': torch.cuda.is_available(),"
              " 'y': y.tolist()}))\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", script, yaml_path,
                          json.dumps(observation(0, "cpu").tolist())], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["device"] == "cpu" and answer["cuda"] is False
    torch.testing.assert_close(torch.tensor(answer["y"]), want.cpu(), rtol=TOL, atol=TOL)


@pytest.mark.cuda
def test_mixed_devices_in_one_node_are_refused_clearly(tmp_path):
    """A CPU weight applied to a CUDA input inside a node: torch's own refusal, at the op
    that mixes them, while tracing (as eager and upstream)."""
    weight = torch.randn(6, 4)
    leapp.start("mixed", save_path=str(tmp_path))
    x = annotate.input_tensors("mixed", {"obs": observation(0, "cuda")})
    with pytest.raises(RuntimeError, match="device"):
        x @ weight
    leapp.stop()


@pytest.mark.cuda
def test_a_node_that_moves_its_value_to_the_cpu(tmp_path):
    """A node computing on the GPU and returning a CPU tensor exports and runs, or is
    refused with an error naming the node (never torch's internal error)."""
    torch.manual_seed(0)
    model = Encoder().cuda().eval()
    leapp.start("to_cpu", save_path=str(tmp_path))
    with torch.no_grad():
        for step in range(2):
            x = annotate.input_tensors("to_cpu", {"obs": observation(step, "cuda")})
            annotate.output_tensors("to_cpu", {"features": model(x).cpu()}, export_with="jit")
    leapp.stop()
    try:
        result = leapp.compile_graph(visualize=False)
    except Exception as exc:  # noqa: BLE001  (a refusal must name the node)
        assert "to_cpu" in str(exc), exc
    else:
        assert result == {"to_cpu": True}


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple:
        h = self.cell(x, h)
        return self.head(h), h


def trace_recurrent(save_path: str, device: str, backend: str) -> str:
    """A GRU policy whose hidden state is node state (feedback), traced on device."""
    torch.manual_seed(1)
    model = Recurrent().to(device).eval()
    graph = f"rec_{device}_{backend.replace('-', '_')}"
    hidden = torch.zeros(1, 8, device=device)  # one robot: the fleet stacks robots on axis 0
    leapp.start(graph, save_path=save_path)
    with torch.no_grad():
        for step in range(3):
            x = annotate.input_tensors("policy", {"obs": observation(step, device, (1, 6))})
            h = annotate.state_tensors("policy", {"hidden": hidden})
            actions, hidden = model(x, h)
            annotate.update_state("policy", {"hidden": hidden})
            annotate.output_tensors("policy", {"actions": actions}, export_with=backend)
            hidden = hidden.detach().clone()
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}
    return os.path.join(save_path, graph, f"{graph}.yaml")


def eager_recurrent(device: str, steps: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    model = Recurrent().to(device).eval()
    hidden = torch.zeros(1, 8, device=device)
    found = []
    with torch.no_grad():
        for step in range(steps):
            actions, hidden = model(observation(step, device, (1, 6)), hidden)
            found.append(actions)
    return found


@pytest.mark.parametrize("backend", ["jit", "onnx"])
@pytest.mark.parametrize("device", DEVICES)
def test_state_stays_on_the_device_across_steps(tmp_path, device, backend):
    yaml_path = trace_recurrent(str(tmp_path), device, backend)
    manager = leapp.InferenceManager(yaml_path)
    runs_on = runtime_device(backend)
    for step, want in enumerate(eager_recurrent(device, 6)):
        got = manager.run_policy({"policy/obs": observation(step, device, (1, 6))})[
            "policy/actions"]
        assert got.device.type == runs_on
        torch.testing.assert_close(got.to(device), want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_model_and_fleet_on_the_device(tmp_path, device):
    """The bundle fused into one model (CUDA provider where onnxruntime has it) and the
    fleet runner, fed with tensors of the device, match InferenceManager."""
    from leapp.serving.fleet import FleetRunner
    from leapp.serving.fusion import FusedModel

    yaml_path = trace_recurrent(str(tmp_path), device, "onnx")
    fused = FusedModel(leapp.fuse(yaml_path))
    assert fused.device == runtime_device("onnx")
    fleet = FleetRunner(yaml_path, robots=["a", "b"])
    manager = leapp.InferenceManager(yaml_path)
    for step in range(4):
        x = observation(step, device, (1, 6))
        want = manager.run_policy({"policy/obs": x})["policy/actions"]
        got = fused.step({"policy/obs": x})["policy/actions"]
        torch.testing.assert_close(torch.as_tensor(got).to(want.device), want, rtol=TOL,
                                   atol=TOL)
        rows = fleet.step_robots({"a": {"policy/obs": x}, "b": {"policy/obs": x}})
        for robot in ("a", "b"):
            torch.testing.assert_close(rows[robot]["policy/actions"].to(want.device), want,
                                       rtol=TOL, atol=TOL)


@pytest.mark.skipif(importlib.util.find_spec("rsl_rl") is None
                    or importlib.util.find_spec("tensordict") is None,
                    reason="rsl-rl-lib and tensordict are not installed (the 'test' extra)")
@pytest.mark.parametrize("device", DEVICES)
def test_rsl_rl_actor_critic_on_the_device(tmp_path, device):
    """rsl-rl-lib's MLP actor-critic traced on the device (TorchScript off, inference
    mode, onnx-dynamo, as Isaac Lab exports), run by InferenceManager, equal to eager."""
    import test_rsl_rl as rsl

    actor, critic = (m.to(device) for m in rsl.make_models(None))
    was_enabled = torch.jit._state._enabled.enabled
    torch.jit._state.disable()
    try:
        leapp.start("rsl_rl_device", save_path=str(tmp_path))
        for step in range(rsl.TRACE_STEPS):
            with torch.inference_mode():
                obs = rsl.observations(step).to(device)
                rsl._node("actor", actor, obs, rsl.OBS_GROUPS["actor"], "actions", "actor")
                rsl._node("critic", critic, obs, rsl.OBS_GROUPS["critic"], "value", "critic")
        leapp.stop()
        assert leapp.compile_graph(visualize=False) == {"actor": True, "critic": True}
    finally:
        if was_enabled:
            torch.jit._state.enable()
    manager = leapp.InferenceManager(os.path.join(tmp_path, "rsl_rl_device",
                                                  "rsl_rl_device.yaml"))
    eager_actor, eager_critic = (m.to(device) for m in rsl.make_models(None))
    with torch.inference_mode():
        for step in range(rsl.RUN_STEPS):
            obs = rsl.observations(step).to(device)
            got = manager.run_policy({f"{n}/{g}": obs[g].clone() for n in ("actor", "critic")
                                      for g in rsl.OBS_GROUPS[n]})
            torch.testing.assert_close(got["actor/actions"].to(device), eager_actor(obs),
                                       rtol=TOL, atol=TOL)
            torch.testing.assert_close(got["critic/value"].to(device), eager_critic(obs),
                                       rtol=TOL, atol=TOL)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["jit", "pt2"])
def test_the_runtime_loop_does_not_synchronise_the_gpu(tmp_path, backend):
    """InferenceManager's C step program with CUDA tensors: no host synchronisation
    where the eager model has none (torch's sync debug mode turns one into an error)."""
    yaml_path = trace_encoder(str(tmp_path), "cuda", backend)
    manager = leapp.InferenceManager(yaml_path)
    torch.manual_seed(0)
    model = Encoder().cuda().eval()
    inputs = [observation(step, "cuda") for step in range(3)]
    manager.run_policy({"encoder/obs": inputs[0]})  # first call: loading, warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            for x in inputs:
                model(x)  # eager: no synchronisation
            for x in inputs:
                manager.run_policy({"encoder/obs": x})
    finally:
        torch.cuda.set_sync_debug_mode("default")
