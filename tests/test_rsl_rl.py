"""A real client: exporting rsl-rl-lib policies the way Isaac Lab's LEAPP export does.

rsl-rl-lib 5 builds an actor-critic from two models, `MLPModel` (feed-forward)
or `RNNModel` (LSTM / GRU memory in front of the MLP), fed with a TensorDict of
observation groups.  Like Isaac Lab's export path, TorchScript is disabled,
every step runs under `torch.inference_mode()`, the observations entering a
node are declared with `annotate.input_tensors` (and put back into a cloned
TensorDict), a recurrent model's hidden state is declared with
`annotate.state_tensors` before the step and bound with
`annotate.update_state` after it, and the outputs (actions, value) go through
`annotate.output_tensors(..., export_with="onnx-dynamo")`.

The bundle then runs in `leapp.InferenceManager` over several steps, the
recurrent state carried by the bundle's feedback, and must match eager copies
of the same models stepped on the same observations.
"""
from __future__ import annotations

import copy
import importlib.util
import os
from typing import Any, Iterator

import pytest
import torch

import leapp
from leapp import annotate

# Looked up without importing: rsl_rl pulls in tensorboard and tensordict, which
# only the tests of this file need (they import them when they run).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rsl_rl") is None or importlib.util.find_spec("tensordict") is None,
    reason="rsl-rl-lib and tensordict are not installed (the 'test' extra)")

OBS_GROUPS = {"actor": ["policy"], "critic": ["policy", "privileged"]}
GROUP_DIMS = {"policy": 10, "privileged": 4}
NUM_ACTIONS = 4
TRACE_STEPS = 3
RUN_STEPS = 5
TOL = 1e-5


@pytest.fixture
def jit_disabled() -> Iterator[None]:
    """TorchScript off for the test, as Isaac Lab's export entry point does."""
    was_enabled = torch.jit._state._enabled.enabled
    torch.jit._state.disable()
    try:
        yield
    finally:
        if was_enabled:
            torch.jit._state.enable()


def observations(step: int) -> Any:
    """The environment's observation TensorDict at `step` (one environment)."""
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(1000 + step)
    return TensorDict({group: torch.randn(1, dim, generator=gen)
                       for group, dim in GROUP_DIMS.items()}, batch_size=[1])


def make_models(memory: str | None) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A seeded actor and critic: MLPModel, or RNNModel with `memory` ('lstm' / 'gru')."""
    from rsl_rl.models import MLPModel, RNNModel

    torch.manual_seed(7)
    obs = observations(0)
    distribution = {"class_name": "GaussianDistribution", "init_std": 1.0}
    if memory is None:
        actor = MLPModel(obs, OBS_GROUPS, "actor", NUM_ACTIONS, hidden_dims=[32, 32],
                         obs_normalization=True, distribution_cfg=distribution)
        critic = MLPModel(obs, OBS_GROUPS, "critic", 1, hidden_dims=[32, 32],
                          obs_normalization=True)
    else:
        actor = RNNModel(obs, OBS_GROUPS, "actor", NUM_ACTIONS, hidden_dims=[32],
                         obs_normalization=True, distribution_cfg=distribution,
                         rnn_type=memory, rnn_hidden_dim=16)
        critic = RNNModel(obs, OBS_GROUPS, "critic", 1, hidden_dims=[32],
                          obs_normalization=True, rnn_type="gru", rnn_hidden_dim=8)
    with torch.no_grad():  # trained-looking normalizer statistics
        for model in (actor, critic):
            model.obs_normalizer._mean.normal_(generator=torch.Generator().manual_seed(3))
            model.obs_normalizer._std.uniform_(0.5, 2.0,
                                               generator=torch.Generator().manual_seed(4))
    return actor.eval(), critic.eval()


# ---- the client side: what an exporter around rsl-rl writes -----------------

def _hidden(model: torch.nn.Module) -> Any:
    """The model's hidden state, zeros for one environment if it has none yet."""
    state = model.get_hidden_state()
    if state is None:
        rnn = model.rnn.rnn
        zeros = torch.zeros(rnn.num_layers, 1, rnn.hidden_size)
        state = (zeros.clone(), zeros.clone()) if isinstance(rnn, torch.nn.LSTM) else zeros
        model.rnn.hidden_state = state
    return state


def _state_names(state: Any, prefix: str) -> dict[str, torch.Tensor]:
    if isinstance(state, tuple):
        return {f"{prefix}_state_{i}": t for i, t in enumerate(state)}
    return {f"{prefix}_state": state}


def _declare_state(node: str, model: torch.nn.Module, prefix: str) -> None:
    """state_tensors on the hidden state, the registered values put back in the model."""
    state = _hidden(model)
    registered = annotate.state_tensors(node, _state_names(state, prefix))
    if isinstance(state, tuple):
        registered = registered if isinstance(registered, tuple) else (registered,)
    model.rnn.hidden_state = registered


def _node(name: str, model: torch.nn.Module, obs: Any, groups: list[str], output: str,
          prefix: str) -> torch.Tensor:
    """One annotated step of `model` as node `name`."""
    node_obs = obs.clone()
    declared = annotate.input_tensors(name, {g: node_obs[g] for g in groups})
    declared = declared if isinstance(declared, tuple) else (declared,)
    for group, value in zip(groups, declared):
        node_obs[group] = value
    if model.is_recurrent:
        _declare_state(name, model, prefix)
    result = model(node_obs)
    if model.is_recurrent:
        annotate.update_state(name, _state_names(model.get_hidden_state(), prefix))
    return annotate.output_tensors(name, {output: result}, export_with="onnx-dynamo")


def export_actor_critic(save_path: str, memory: str | None,
                        reset_between_steps: bool = False) -> str:
    """Trace TRACE_STEPS steps of the actor-critic and compile; returns the YAML path.

    reset_between_steps calls the models' reset(dones) after each step, as an
    environment loop does (no environment is done, so nothing is zeroed).
    """
    actor, critic = make_models(memory)
    graph = f"rsl_rl_{memory or 'mlp'}"
    leapp.start(graph, save_path=save_path, max_cached_io=TRACE_STEPS)
    for step in range(TRACE_STEPS):
        with torch.inference_mode():
            obs = observations(step)
            _node("actor", actor, obs, OBS_GROUPS["actor"], "actions", "actor")
            _node("critic", critic, obs, OBS_GROUPS["critic"], "value", "critic")
            if reset_between_steps:
                dones = torch.zeros(1, dtype=torch.long)
                actor.reset(dones)
                critic.reset(dones)
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    assert result == {"actor": True, "critic": True}, result
    return os.path.join(save_path, graph, f"{graph}.yaml")


def eager_steps(memory: str | None, steps: int) -> list[dict[str, torch.Tensor]]:
    """The reference: fresh copies of the models stepped eagerly from zero state."""
    actor, critic = (copy.deepcopy(m) for m in make_models(memory))
    results = []
    with torch.inference_mode():
        for step in range(steps):
            obs = observations(step)
            results.append({"actor/actions": actor(obs).clone(),
                            "critic/value": critic(obs).clone()})
    return results


def run_bundle(yaml_path: str, steps: int) -> list[dict[str, torch.Tensor]]:
    """The bundle in leapp.InferenceManager, one call per step."""
    manager = leapp.InferenceManager(yaml_path)
    results = []
    for step in range(steps):
        obs = observations(step)
        inputs = {f"{node}/{group}": obs[group].clone()
                  for node in ("actor", "critic") for group in OBS_GROUPS[node]}
        assert sorted(inputs) == sorted(manager.inputs)
        outputs = manager.run_policy(inputs)
        results.append({key: outputs[key].clone() for key in ("actor/actions",
                                                              "critic/value")})
    return results


# ---- the tests ---------------------------------------------------------------

def _check(yaml_path: str, memory: str | None) -> None:
    expected = eager_steps(memory, RUN_STEPS)
    got = run_bundle(yaml_path, RUN_STEPS)
    for step, (want, have) in enumerate(zip(expected, got)):
        for key in want:
            assert have[key].shape == want[key].shape, (step, key)
            assert torch.allclose(have[key], want[key], rtol=TOL, atol=TOL), (
                step, key, (have[key] - want[key]).abs().max())


def _yaml(path: str) -> dict:
    import yaml
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_actor_critic_mlp(tmp_path, jit_disabled):
    yaml_path = export_actor_critic(str(tmp_path), None)
    doc = _yaml(yaml_path)
    assert doc["pipeline"]["inputs"] == {"actor": ["policy"], "critic": ["policy", "privileged"]}
    assert doc["pipeline"]["outputs"] == {"actor": ["actions"], "critic": ["value"]}
    assert doc["pipeline"]["feedback_flow"] == {}
    assert {m["parameters"]["backend"] for m in doc["models"].values()} == {"onnx"}
    _check(yaml_path, None)


@pytest.mark.parametrize("memory", ["lstm", "gru"])
def test_actor_critic_recurrent(tmp_path, jit_disabled, memory):
    # With the LSTM, the environment loop also calls reset(dones) after each step,
    # a masked in-place write into the published hidden state (nothing is done).
    yaml_path = export_actor_critic(str(tmp_path), memory,
                                    reset_between_steps=memory == "lstm")
    doc = _yaml(yaml_path)
    actor_states = ["actor_state_0", "actor_state_1"] if memory == "lstm" else ["actor_state"]
    actor = doc["models"]["actor"]
    assert [p["name"] for p in actor["inputs"]] == ["policy"] + [f"{s}_in" for s in
                                                                 actor_states]
    assert [p["name"] for p in actor["outputs"]] == ["actions"] + [f"{s}_out" for s in
                                                                   actor_states]
    assert doc["pipeline"]["feedback_flow"] == {
        **{f"actor/{s}_out": [f"actor/{s}_in"] for s in actor_states},
        "critic/critic_state_out": ["critic/critic_state_in"]}
    _check(yaml_path, memory)


def _export_wrapper(tmp_path, wrapper: torch.nn.Module, backend: str) -> None:
    """Trace rsl-rl's export wrapper as node policy, its LSTM buffers declared as state
    (what the Isaac Lab export script does), and compile it."""
    leapp.start("wrapper", save_path=str(tmp_path), max_cached_io=TRACE_STEPS)
    for step in range(TRACE_STEPS):
        with torch.inference_mode():
            obs = annotate.input_tensors("policy", {"obs": observations(step)["policy"]})
            annotate.state_tensors("policy", {"h": wrapper.hidden_state,
                                              "c": wrapper.cell_state})
            actions = wrapper(obs)
            annotate.update_state("policy", {"h": wrapper.hidden_state,
                                             "c": wrapper.cell_state})
            annotate.output_tensors("policy", {"actions": actions}, export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}


@pytest.mark.parametrize("backend", ["onnx-dynamo", "jit"])
def test_export_wrapper_with_state_written_in_place(tmp_path, jit_disabled, backend):
    """rsl-rl's own TorchScript export wrapper keeps the LSTM state in buffers that its
    forward overwrites in place (hidden_state[:] = h); declared as state, they become
    feedback.  With export_with='jit' the node is scripted although TorchScript is
    disabled (it is switched on for the export only)."""
    actor, _ = make_models("lstm")
    wrapper = actor.as_jit().eval()
    reference = copy.deepcopy(wrapper)
    _export_wrapper(tmp_path, wrapper, backend)
    assert not torch.jit._state._enabled.enabled  # left as the client set it
    manager = leapp.InferenceManager(os.path.join(str(tmp_path), "wrapper", "wrapper.yaml"))
    with torch.inference_mode():
        for step in range(RUN_STEPS):
            obs = observations(step)["policy"]
            want = reference(obs.clone())
            have = manager.run_policy({"policy/obs": obs.clone()})["policy/actions"]
            assert torch.allclose(have, want, rtol=TOL, atol=TOL), (step, (have - want).abs().max())


@pytest.mark.parametrize("backend", ["onnx", "jit"])
def test_export_wrapper_state_batches_for_a_fleet(tmp_path, jit_disabled, backend, caplog,
                                                  monkeypatch):
    """The exporter wrapper's in-place state write (hidden_state[:] = h, every position
    in order) is traced as a broadcast copy of h: the node (its ONNX file, or its
    TorchScript module written again for the fused model) stacks robots, and a fleet of
    three steps each robot as its own copy of the eager wrapper does."""
    from leapp.fleet import FleetRunner

    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)  # the writer's models, this test
    actor, _ = make_models("lstm")
    wrapper = actor.as_jit().eval()
    robots = [copy.deepcopy(wrapper) for _ in range(3)]
    _export_wrapper(tmp_path, wrapper, backend)
    yaml_path = os.path.join(str(tmp_path), "wrapper", "wrapper.yaml")
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path, batch=True)  # checked robot by robot against IM
    assert "cannot be batched" not in caplog.text
    assert "converted to ONNX with torch's exporter" not in caplog.text
    fleet = FleetRunner(path, robots=3)
    with torch.inference_mode():
        for step in range(RUN_STEPS):
            obs = [observations(step + 7 * r)["policy"] for r in range(3)]
            got = fleet.step({"policy/obs": torch.cat(obs)})["policy/actions"]
            for r, robot in enumerate(robots):
                want = robot(obs[r].clone())
                assert torch.allclose(got[r:r + 1], want, rtol=TOL, atol=TOL), (step, r)
