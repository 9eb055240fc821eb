"""Bundles exported here run through InferenceManager and step exactly like the
eager pipeline over 10 steps, feedback included."""
from __future__ import annotations

import importlib.util
import os

import torch

from leapp import InferenceManager
from support import ROOT


def _example(name: str):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _manager(bundle: str) -> InferenceManager:
    graph = os.path.basename(bundle)
    return InferenceManager(os.path.join(bundle, f"{graph}.yaml"))


def test_getting_started_bundle_runs(tmp_path):
    example = _example("getting_started")
    manager = _manager(example.main(str(tmp_path)))
    assert manager.inputs == ["preprocess/obs1_name", "preprocess/obs2_name"]
    assert manager.outputs == ["predict/output"]
    for step in range(10):
        obs1, obs2 = torch.randn(1, 8), torch.randn(1, 8)
        features = torch.cat([obs1 - obs1.mean(), obs2 / (obs2.abs().max() + 1e-6)], dim=-1)
        expected = torch.relu(features @ example.WEIGHTS)
        got = manager.run_policy({"preprocess/obs1_name": obs1, "preprocess/obs2_name": obs2})
        torch.testing.assert_close(got["predict/output"], expected, rtol=1e-5, atol=1e-6)


def test_complete_pipeline_bundle_runs(tmp_path):
    example = _example("complete_pipeline")
    manager = _manager(example.main(str(tmp_path)))
    for step in range(10):
        raw = torch.randn(1, 10)
        expected = torch.argmax(torch.softmax(example.model(example.preprocess(raw)), dim=1), dim=1)
        got = manager({"preprocess/raw_data": raw})
        assert torch.equal(got["postprocess/final_output"], expected)


def test_feedback_bundle_steps_like_eager(tmp_path):
    example = _example("feedback_example")
    manager = _manager(example.main(str(tmp_path)))
    assert sorted(manager.feedback_inputs) == ["feedback_update/policy_memory_prev",
                                               "policy_step/policy_memory_in"]
    memory = torch.tensor([0.0])
    for step in range(10):
        observation = torch.tensor([float(step) * 0.3 - 1.0])
        context = example.mix_with_feedback(observation, memory)
        action = torch.clamp(context * 2.0, min=-1.0, max=1.0)
        memory = example.blend_feedback(context, memory)
        got = manager.run_policy({"policy_step/observation_scalar": observation})
        torch.testing.assert_close(got["policy_step/control_action"], action)
    manager.reset()
    first = manager.run_policy({"policy_step/observation_scalar": torch.tensor([1.0])})
    again = _manager(os.path.join(str(tmp_path), "sample_feedback_graph")).run_policy(
        {"policy_step/observation_scalar": torch.tensor([1.0])})
    torch.testing.assert_close(first["policy_step/control_action"],
                               again["policy_step/control_action"])


def test_gru_bundle_steps_like_eager(tmp_path):
    example = _example("stateful_gru_export")
    manager = _manager(example.main(str(tmp_path)))
    torch.manual_seed(0)
    model = example.GRUPolicy().eval()
    torch.manual_seed(5)
    with torch.no_grad():
        for step in range(10):
            obs = torch.randn(1, 16)
            expected = model(obs)
            got = manager.run_policy({"policy/obs": obs})
            torch.testing.assert_close(got["policy/action"], expected, rtol=1e-4, atol=1e-5)
