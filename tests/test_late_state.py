"""Declared state updated after output_tensors: the order of an export loop that
steps the environment (where the node's output_tensors happens and the next
observations are declared) before it masks the recurrent state with the done
flags and calls update_state.  Every declared state ends as feedback and the
bundle replays the eager loop, or leapp refuses at update_state."""
from __future__ import annotations

import logging
import os

import pytest
import torch
import yaml

import leapp
from leapp.bundle import analytics
from leapp import InferenceManager, annotate, _core

STEPS = 8


class RecurrentPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(4, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, obs, h, c):
        y, (h2, c2) = self.lstm(obs.unsqueeze(0), (h, c))
        return torch.tanh(self.head(y[0])), h2, c2


def declare_obs(obs):
    return annotate.input_tensors("actor", {"obs": obs.clone()})


class FakeEnv:
    """The node's outputs end in step(), which declares the next observations."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.obs = torch.linspace(-1, 1, 12).reshape(3, 4)

    def reset(self):
        return declare_obs(self.obs)

    def step(self, actions):
        annotate.output_tensors("actor", {"actions": actions}, export_with=self.backend)
        self.obs = self.obs * 0.9 + actions.detach().sum(-1, keepdim=True) * 0.1
        return declare_obs(self.obs), torch.zeros(3, 1)


def export_loop(tmp_path, backend: str, order: str, passes: int = 3) -> str:
    """Trace the loop in the given order; returns the bundle's YAML path."""
    policy = RecurrentPolicy().eval()
    env = FakeEnv(backend)
    leapp.start("late", save_path=str(tmp_path))
    h = torch.zeros(1, 3, 8)
    c = torch.zeros(1, 3, 8)
    obs = env.reset()
    for _ in range(passes):
        h_in, c_in = annotate.state_tensors("actor", {"h": h, "c": c})
        with torch.no_grad():
            actions, h, c = policy(obs, h_in, c_in)
        if order == "same call":
            annotate.update_state("actor", {"h": h, "c": c})
        obs, done = env.step(actions)
        if order == "after step":
            mask = (1.0 - done).unsqueeze(0)
            h, c = h * mask, c * mask
            annotate.update_state("actor", {"h": h, "c": c})
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    assert result == {"actor": True}
    return os.path.join(str(tmp_path), "late", "late.yaml")


def replay_difference(yaml_path: str) -> float:
    """Largest action difference of the bundle against the eager loop over STEPS."""
    policy = RecurrentPolicy().eval()
    manager = InferenceManager(yaml_path)
    h = torch.zeros(1, 3, 8)
    c = torch.zeros(1, 3, 8)
    generator = torch.Generator().manual_seed(3)
    worst = 0.0
    for _ in range(STEPS):
        obs = torch.randn(3, 4, generator=generator)
        with torch.no_grad():
            actions, h, c = policy(obs, h, c)
        out = manager.run_policy({"actor/obs": obs})
        worst = max(worst, float((out["actor/actions"] - actions).abs().max()))
    return worst


@pytest.fixture(autouse=True)
def no_session_left():
    yield
    if _core.is_tracing():
        leapp.stop()


@pytest.mark.parametrize("backend", ["jit", "onnx"])
@pytest.mark.parametrize("order", ["after step", "same call"])
def test_state_updated_after_output_tensors_is_feedback(tmp_path, backend, order):
    yaml_path = export_loop(tmp_path, backend, order)
    with open(yaml_path) as f:
        pipeline = yaml.safe_load(f)["pipeline"]
    # ONNX ports named alike on both sides are renamed _in / _out, as upstream does
    h_out, h_in, c_out, c_in = (("h", "h", "c", "c") if backend == "jit"
                                else ("h_out", "h_in", "c_out", "c_in"))
    assert pipeline["feedback_flow"] == {f"actor/{c_out}": [f"actor/{c_in}"],
                                         f"actor/{h_out}": [f"actor/{h_in}"]}
    assert pipeline["inputs"] == {"actor": ["obs"]}
    assert replay_difference(yaml_path) < 1e-5


def test_one_pass_after_step_is_feedback(tmp_path):
    yaml_path = export_loop(tmp_path, "jit", "after step", passes=1)
    assert replay_difference(yaml_path) < 1e-5


def test_late_update_samples_are_validated(tmp_path):
    """Each later pass's sample waits for its late update: all passes validated."""
    yaml_path = export_loop(tmp_path, "jit", "after step", passes=4)
    entries = analytics.read(os.path.dirname(yaml_path), "late")
    checked = {e["sample"] for e in entries if e["output"] == "h" and e["passed"]}
    assert checked == {0, 1, 2, 3}, entries


def test_plain_update_after_output_tensors_is_refused(tmp_path):
    leapp.start("late", save_path=str(tmp_path))
    obs = annotate.input_tensors("actor", {"obs": torch.ones(1, 4)})
    (h,) = annotate.state_tensors("actor", {"h": torch.zeros(1, 4)})
    annotate.output_tensors("actor", {"y": obs + h})
    with pytest.raises(RuntimeError) as raised:
        annotate.update_state("actor", {"h": torch.ones(1, 4)})  # line of the refusal
    message = str(raised.value)
    assert "state 'h' of node 'actor'" in message
    assert f"{os.path.basename(__file__)}:" in message
    assert "call update_state before the environment step" in message.lower()


def test_update_after_next_state_tensors_is_refused(tmp_path, caplog):
    leapp.start("late", save_path=str(tmp_path))
    h = torch.zeros(1, 4)
    for step in range(2):
        obs = annotate.input_tensors("actor", {"obs": torch.ones(1, 4)})
        (h_in,) = annotate.state_tensors("actor", {"h": h})
        y = obs + h_in
        annotate.output_tensors("actor", {"y": y})
        if step == 1:
            with pytest.raises(RuntimeError, match="state 'h' of node 'actor'.*cannot be tied"):
                annotate.update_state("actor", {"h": y})
    assert "declared but never passed to update_state" in caplog.text


def test_state_never_updated_is_named(tmp_path, caplog):
    """Upstream keeps it a plain input without a word; leapp says so once."""
    leapp.start("late", save_path=str(tmp_path))
    for _ in range(2):
        obs = annotate.input_tensors("actor", {"obs": torch.ones(1, 4)})
        (h,) = annotate.state_tensors("actor", {"h": torch.zeros(1, 4)})
        annotate.output_tensors("actor", {"y": obs * 2 + h})
    with caplog.at_level(logging.WARNING, logger="leapp"):
        leapp.stop()
    named = [r for r in caplog.records if "State 'h' of node 'actor' was declared but never"
             in r.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.WARNING
    node = _core.find_node("actor")
    assert [p.name for p in node.inputs] == ["obs", "h"]
    assert not any(p.is_state for p in node.inputs)


def test_tail_values_in_another_node_are_constants(tmp_path):
    """An internal value of a node in its tail, read by another node that traces,
    is a constant of that node, as any finished node's value (no mixing error)."""
    leapp.start("late", save_path=str(tmp_path))
    obs = annotate.input_tensors("a", {"obs": torch.ones(1, 4)})
    (h,) = annotate.state_tensors("a", {"h": torch.zeros(1, 4)})
    inner = obs * 3 + h
    annotate.output_tensors("a", {"y": inner + 1})
    x = annotate.input_tensors("b", {"x": torch.ones(1, 4)})
    z = x * inner  # inner: a value of 'a' in its tail
    annotate.output_tensors("b", {"z": z})
    annotate.update_state("a", {"h": inner * 0.5})
    leapp.stop()
    a, b = _core.find_node("a"), _core.find_node("b")
    assert [p.name for p in a.outputs] == ["y", "h"] and a.outputs[1].is_state
    graph = b.info["leapp"].graph_module.module
    assert torch.equal(graph(torch.full((1, 4), 2.0)), torch.full((1, 4), 6.0))


def test_late_update_from_a_published_output_is_named(tmp_path):
    leapp.start("late", save_path=str(tmp_path))
    obs = annotate.input_tensors("actor", {"obs": torch.ones(1, 4)})
    (h,) = annotate.state_tensors("actor", {"h": torch.zeros(1, 4)})
    y = obs + h
    annotate.output_tensors("actor", {"y": y})
    with pytest.raises(RuntimeError, match="from its published output 'y'"):
        annotate.update_state("actor", {"h": y * 0.9})


def test_set_input_value_never_writes_into_a_models_output(tmp_path):
    """A static output fed back is the TorchScript model's own constant after a step;
    set_input_value gives the input a copy instead of writing into that tensor."""
    leapp.start("g", save_path=str(tmp_path))
    for i in range(2):
        x = annotate.input_tensors("n", {"x": torch.full((1, 3), float(i + 1))})
        (h,) = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
        annotate.update_state("n", {"h": h + x})
        annotate.output_tensors("n", {"y": x * 2 + h},
                                static_outputs={"h": torch.full((1, 3), 7.0)},
                                export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    manager = InferenceManager(os.path.join(str(tmp_path), "g", "g.yaml"))
    manager.run_policy({"n/x": torch.ones(1, 3)})
    manager.set_input_value("n", "h", torch.zeros(1, 3))
    assert torch.equal(manager.run_policy({"n/x": torch.ones(1, 3)})["n/y"],
                       torch.full((1, 3), 2.0))
    assert torch.equal(manager.value_dict["n"]["h"], torch.full((1, 3), 7.0))
