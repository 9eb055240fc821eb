"""What an RL library's LEAPP export script writes around the library, for the client tests.

tests/test_client_exports.py exports the real model classes of rl_games, skrl and
Stable-Baselines3 (sb3-contrib's RecurrentPPO) the way Isaac Lab's export backends
for those libraries drive leapp, then replays each bundle against the library's
own eager path.  This module holds the parts every backend shares:

* :class:`ExportEnv`, a small vectorised environment standing in for a patched
  Isaac Lab task: `reset()` and `step()` declare the observations with
  `annotate.input_tensors`, and `step(actions)` captures the actions with
  `annotate.output_tensors` *inside* the step, as the patched action manager does.
  So the policy node's call spans from one step's observations to the next
  step's actions, and anything the script does after `env.step` (an LSTM state
  masked with the done flags) happens after the node's `output_tensors`.
* the recurrent-state naming (`actor_state_0`, `actor_state_1`, ...) and the way a
  script puts the values `state_tensors` returns back into the library's tuple.
* :func:`replay`, which runs a bundle in `leapp.InferenceManager` step by step.

Observations are a fixed function of the environment index and the step, so the
eager reference sees exactly what the bundle sees.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import torch

import leapp
from leapp import annotate

POLICY_NODE = "policy"
TOL = 1e-5


@contextlib.contextmanager
def torchscript_disabled() -> Iterator[None]:
    """TorchScript off while the block runs, as the export entry points do before they
    build the library's models (rl_games scripts its normalisers at construction)."""
    was_enabled = torch.jit._state._enabled.enabled
    torch.jit._state.disable()
    try:
        yield
    finally:
        if was_enabled:
            torch.jit._state.enable()


@contextlib.contextmanager
def distribution_validation_off() -> Iterator[None]:
    """torch.distributions' argument checks off (they read values into Python booleans),
    restored afterwards: what the Stable-Baselines3 backend does while it traces."""
    previous = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)


def observation(step: int, num_envs: int, dim: int, scale: float = 1.0) -> torch.Tensor:
    """The environment's observations at `step` (float32, one row per environment)."""
    gen = torch.Generator().manual_seed(5000 + step)
    return torch.randn(num_envs, dim, generator=gen) * scale


class ExportEnv:
    """A vectorised environment that annotates its I/O for the policy node.

    `done_at` maps a step to the environments whose episode ends at that step
    (terminated); the others never end.  The actions each step received are kept in
    `actions`, detached copies of what the policy produced.
    """

    def __init__(self, num_envs: int, obs_dim: int, backend: str, *,
                 node: str = POLICY_NODE, scale: float = 1.0,
                 done_at: dict[int, Sequence[int]] | None = None) -> None:
        self.num_envs, self.obs_dim, self.backend = num_envs, obs_dim, backend
        self.node, self.scale = node, scale
        self.done_at = done_at or {}
        self.steps = 0
        self.actions: list[torch.Tensor] = []

    def _observe(self) -> torch.Tensor:
        obs = observation(self.steps, self.num_envs, self.obs_dim, self.scale)
        return annotate.input_tensors(self.node, {"obs": obs})

    def reset(self) -> torch.Tensor:
        self.steps = 0
        return self._observe()

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply `actions` (captured as the node's output); the next observations and
        the terminated / truncated flags (untraced, as a simulator's are)."""
        actions = annotate.output_tensors(self.node, {"actions": actions},
                                          export_with=self.backend)
        self.actions.append(actions.detach().clone())
        terminated = torch.zeros(self.num_envs, dtype=torch.bool)
        for env in self.done_at.get(self.steps, ()):
            terminated[env] = True
        truncated = torch.zeros(self.num_envs, dtype=torch.bool)
        self.steps += 1
        return self._observe(), terminated, truncated


# ---- recurrent state as the export scripts name it ---------------------------

def state_names(count: int, prefix: str = "actor_state") -> list[str]:
    return [f"{prefix}_{index}" for index in range(count)]


def named_state(states: Sequence[torch.Tensor], prefix: str = "actor_state") -> dict[str, torch.Tensor]:
    """The library's ordered state tensors as the named mapping leapp takes."""
    return dict(zip(state_names(len(states), prefix), states))


def declare_state(node: str, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`state_tensors` on the library's states; the returned values in the library's order."""
    registered = annotate.state_tensors(node, named_state(states))
    if isinstance(registered, dict):
        return [registered[name] for name in state_names(len(states))]
    if isinstance(registered, (list, tuple)):
        return list(registered)
    return [registered]


def is_two_tensor_lstm_state(states: object) -> bool:
    """An LSTM's `[hidden, cell]`: exactly two tensors."""
    return (isinstance(states, (list, tuple)) and len(states) == 2
            and all(isinstance(s, torch.Tensor) for s in states))


# ---- running a bundle ---------------------------------------------------------

def compile_bundle(save_path: str, graph: str) -> str:
    """Stop tracing, compile with validation; the YAML path."""
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    assert result == {POLICY_NODE: True}, result
    return os.path.join(save_path, graph, f"{graph}.yaml")


def replay(yaml_path: str, steps: int, num_envs: int, obs_dim: int,
           scale: float = 1.0) -> list[torch.Tensor]:
    """The bundle in InferenceManager over `steps` steps of the environment's observations."""
    manager = leapp.InferenceManager(yaml_path)
    assert list(manager.inputs) == [f"{POLICY_NODE}/obs"], manager.inputs
    got = []
    with torch.inference_mode():
        for step in range(steps):
            outputs = manager.run_policy(
                {f"{POLICY_NODE}/obs": observation(step, num_envs, obs_dim, scale)})
            got.append(outputs[f"{POLICY_NODE}/actions"].clone())
    return got


def assert_steps_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """Step by step, the bundle's actions equal the library's, to TOL."""
    assert len(got) == len(want)
    for step, (have, expected) in enumerate(zip(got, want)):
        assert have.shape == expected.shape, (step, have.shape, expected.shape)
        gap = (have - expected).abs().max().item()
        assert torch.allclose(have, expected, rtol=TOL, atol=TOL), (
            f"step {step}: bundle differs from the library's eager path by {gap}")


def feedback_flow(doc: dict) -> dict:
    return doc["pipeline"].get("feedback_flow") or {}


def read_yaml(path: str) -> dict:
    import yaml

    with open(path, encoding="utf-8") as handle:
        docs = list(yaml.safe_load_all(handle))
    merged: dict[str, Any] = {}
    for doc in docs:
        merged.update(doc or {})
    return merged

