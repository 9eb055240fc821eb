"""State kept in Python between calls: a recurrent state the library keeps for itself.

Real clients keep their recurrent state where the trace cannot feed it back:
rsl-rl-lib's memory module keeps `hidden_state` (None before the first call),
rl_games' player keeps `player.states` on a plain object no module reaches, and
a GRU written as `y, self.hidden = self.rnn(x, self.hidden)` keeps it on
itself.  Exported the plain way (input, the model, output; nothing declared),
the bundle replays the first pass's state as a constant on every step.

* one traced pass: the attribute is named at WARNING with its path from the
  root module and `annotate.state_tensors` (where a module's own code stores it
  and reads it back), and the one-pass note of compile_graph names it;
* two passes: the read of the kept value on the second pass is named with its
  line; validation refuses the bundle and its hint names the value and
  `state_tensors`; under `leapp.start(strict=True)` the read is refused;
* declared the documented way, each exports exactly (replayed 10 steps against
  eager) without a word;
* a tensor written for the environment and never read stays quiet.
"""
from __future__ import annotations

import copy
import importlib.util
import inspect
import logging
import os
from typing import Any, Iterator

import pytest
import torch

import leapp
from leapp import annotate

import client_exports as ce

BACKENDS = ["jit", "onnx"]
REPLAY = 10
TOL = 1e-5


def _needs(*modules: str) -> pytest.MarkDecorator:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                              "(the 'test' extra)")


@pytest.fixture
def jit_disabled() -> Iterator[None]:
    """TorchScript off, as Isaac Lab's export entry points do."""
    with ce.torchscript_disabled():
        yield


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "leapp" and r.levelno == logging.WARNING]


def _kept_warnings(caplog) -> list[str]:
    return [m for m in _warnings(caplog) if "annotate.state_tensors(" in m]


def _refused(compile_kwargs: dict | None = None) -> str:
    """compile_graph's validation failure (it raises): its message."""
    with pytest.raises(Exception, match="validation failed") as err:
        leapp.compile_graph(visualize=False, **(compile_kwargs or {}))
    return str(err.value)


# ---- a GRU that keeps its hidden state on itself -------------------------------------

class GRUPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.rnn = torch.nn.GRU(3, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 2)
        self.hidden = None
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, self.hidden = self.rnn(x.unsqueeze(1), self.hidden)  # kept
        return self.head(y[:, -1])


def _gru_site() -> str:
    lines, first = inspect.getsourcelines(GRUPolicy)
    (offset,) = [i for i, text in enumerate(lines) if text.rstrip().endswith("# kept")]
    return f"{os.path.abspath(__file__)}:{first + offset}"


def _obs(step: int) -> torch.Tensor:
    return torch.randn(2, 3, generator=torch.Generator().manual_seed(100 + step))


def _gru_naive(root: str, backend: str, passes: int, strict: bool = False) -> None:
    policy = GRUPolicy()
    leapp.start("gru", save_path=root, strict=strict, max_cached_io=passes)
    for step in range(passes):
        x = annotate.input_tensors("policy", {"obs": _obs(step)})
        annotate.output_tensors("policy", {"actions": policy(x)}, export_with=backend)
    leapp.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gru_kept_on_itself_one_pass_is_named(bundle, backend, caplog):
    with caplog.at_level(logging.INFO, logger="leapp"):
        _gru_naive(bundle.root, backend, 1)
        assert leapp.compile_graph(visualize=False) == {"policy": True}
    (message,) = _kept_warnings(caplog)
    assert message.startswith("Node 'policy': GRUPolicy.hidden is set at " + _gru_site())
    assert "annotate.state_tensors('policy', {'hidden': hidden})" in message
    assert "annotate.update_state('policy'" in message
    note = [r.getMessage() for r in caplog.records if "traced on one pass only" in
            r.getMessage()]
    assert note and "GRUPolicy.hidden" in note[0] and "annotate.state_tensors" in note[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gru_kept_on_itself_two_passes_is_refused(bundle, backend, caplog):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _gru_naive(bundle.root, backend, 2)
    assert len(_kept_warnings(caplog)) == 1  # named once: the first pass said it
    failure = _refused()
    assert f"GRUPolicy.hidden read at {_gru_site()}" in failure
    assert "annotate.state_tensors()" in failure and "annotate.update_state()" in failure


def test_gru_kept_on_itself_strict_refuses_the_read(bundle):
    with pytest.raises(RuntimeError, match="strict mode") as err:
        _gru_naive(bundle.root, "jit", 2, strict=True)
    message = str(err.value)
    assert "GRUPolicy.hidden" in message and f"is read at {_gru_site()}" in message
    assert "annotate.state_tensors('policy', {'hidden': hidden})" in message
    leapp.stop()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", [1, 3])
def test_gru_declared_replays_exactly(bundle, backend, passes, caplog):
    """The documented way: the hidden state declared and updated; quiet, and exact."""
    policy = GRUPolicy()
    hidden = torch.zeros(1, 2, 5)
    leapp.start("gru", save_path=bundle.root, max_cached_io=passes)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for step in range(passes):
            x = annotate.input_tensors("policy", {"obs": _obs(step)})
            policy.hidden = annotate.state_tensors("policy", {"hidden": hidden})
            actions = policy(x)
            annotate.update_state("policy", {"hidden": policy.hidden})
            annotate.output_tensors("policy", {"actions": actions}, export_with=backend)
            hidden = policy.hidden
        leapp.stop()
        assert leapp.compile_graph(visualize=False) == {"policy": True}
    assert _kept_warnings(caplog) == []
    manager = leapp.InferenceManager(os.path.join(bundle.dir("gru"), "gru.yaml"))
    eager = GRUPolicy()
    for step in range(REPLAY):
        want = eager(_obs(step))
        got = manager.run_policy({"policy/obs": _obs(step)})["policy/actions"]
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)


# ---- rsl-rl-lib's recurrent model (its memory keeps hidden_state) ----------------------

def _rsl() -> Any:
    import test_rsl_rl as rsl  # its models and observations, as Isaac Lab builds them
    return rsl


def _rsl_naive(root: str, backend: str, passes: int, strict: bool = False) -> None:
    """rsl-rl-lib's recurrent actor exported the plain way: input, actor(obs), output."""
    rsl = _rsl()
    actor, _ = rsl.make_models("lstm")
    leapp.start("rsl", save_path=root, strict=strict, max_cached_io=passes)
    for step in range(passes):
        with torch.inference_mode():
            obs = rsl.observations(step).clone()
            obs["policy"] = annotate.input_tensors("actor", {"policy": obs["policy"]})
            annotate.output_tensors("actor", {"actions": actor(obs)}, export_with=backend)
    leapp.stop()


_RSL_SITE = os.path.join("rsl_rl", "modules", "rnn.py") + ":"


@_needs("rsl_rl", "tensordict")
@pytest.mark.parametrize("backend", BACKENDS)
def test_rsl_rl_recurrent_one_pass_names_hidden_state(bundle, jit_disabled, backend, caplog):
    with caplog.at_level(logging.INFO, logger="leapp"):
        _rsl_naive(bundle.root, backend, 1)
        assert leapp.compile_graph(visualize=False) == {"actor": True}
    (message,) = _kept_warnings(caplog)
    assert message.startswith("Node 'actor': RNNModel.rnn.hidden_state is set at ")
    assert _RSL_SITE in message
    assert "annotate.state_tensors('actor', {'hidden_state': hidden_state})" in message
    note = [r.getMessage() for r in caplog.records if "traced on one pass only" in
            r.getMessage()]
    assert note and "RNNModel.rnn.hidden_state" in note[0]


@_needs("rsl_rl", "tensordict")
@pytest.mark.parametrize("backend", BACKENDS)
def test_rsl_rl_recurrent_two_passes_refused_with_the_hint(bundle, jit_disabled, backend,
                                                           caplog):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _rsl_naive(bundle.root, backend, 2)
    assert len(_kept_warnings(caplog)) == 1
    failure = _refused()
    assert "RNNModel.rnn.hidden_state" in failure and _RSL_SITE in failure
    assert "annotate.state_tensors()" in failure


@_needs("rsl_rl", "tensordict")
def test_rsl_rl_recurrent_strict_refuses_on_the_second_pass(bundle, jit_disabled):
    _rsl_naive(bundle.root, "jit", 1, strict=True)  # one pass: named, not refused
    with pytest.raises(RuntimeError, match="strict mode") as err:
        _rsl_naive(bundle.root, "jit", 2, strict=True)
    message = str(err.value)
    assert "RNNModel.rnn.hidden_state" in message and _RSL_SITE in message
    assert "annotate.state_tensors('actor'" in message
    leapp.stop()


@_needs("rsl_rl", "tensordict")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", [1, 3])
def test_rsl_rl_recurrent_declared_replays_10_steps(bundle, jit_disabled, backend, passes,
                                                   caplog):
    """The documented way (docs/tracing.md): hidden_state declared before the step and
    its new value bound after it; quiet, and exact over 10 steps."""
    rsl = _rsl()
    actor, _ = rsl.make_models("lstm")
    eager = copy.deepcopy(actor)
    leapp.start("rsl", save_path=bundle.root, max_cached_io=passes)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for step in range(passes):
            with torch.inference_mode():
                obs = rsl.observations(step).clone()
                obs["policy"] = annotate.input_tensors("actor", {"policy": obs["policy"]})
                zeros = (torch.zeros(1, 1, 16), torch.zeros(1, 1, 16))
                h, c = actor.get_hidden_state() or zeros
                actor.rnn.hidden_state = annotate.state_tensors("actor", {"h": h, "c": c})
                actions = actor(obs)
                h, c = actor.get_hidden_state()
                annotate.update_state("actor", {"h": h, "c": c})
                annotate.output_tensors("actor", {"actions": actions}, export_with=backend)
        leapp.stop()
        assert leapp.compile_graph(visualize=False) == {"actor": True}
    assert _kept_warnings(caplog) == []
    manager = leapp.InferenceManager(os.path.join(bundle.dir("rsl"), "rsl.yaml"))
    with torch.inference_mode():
        for step in range(REPLAY):
            obs = rsl.observations(step)
            want = eager(obs)
            got = manager.run_policy({"actor/policy": obs["policy"].clone()})["actor/actions"]
            torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)


# ---- rl_games' LSTM player (its state on the player, no module reaches it) -------------

def _rl_games() -> tuple[Any, Any]:
    import test_client_exports as clients
    return ce, clients


def _rl_games_naive(root: str, backend: str, passes: int, strict: bool = False) -> None:
    ce, clients = _rl_games()
    player = clients.make_rl_games_player()
    leapp.start("rlg", save_path=root, strict=strict, max_cached_io=passes)
    for step in range(passes):
        with torch.inference_mode():
            obs = ce.observation(step, clients.RLG_ENVS, clients.RLG_OBS)
            if step == 0:
                player.get_batch_size(obs, 1)
                player.init_rnn()
            obs = annotate.input_tensors("policy", {"obs": obs})
            actions = player.get_action(player.obs_to_torch(obs), is_deterministic=True)
            annotate.output_tensors("policy", {"actions": actions}, export_with=backend)
    leapp.stop()


@_needs("rl_games", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
def test_rl_games_player_states_two_passes_refused(bundle, backend, caplog):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _rl_games_naive(bundle.root, backend, 2)
    (message,) = _kept_warnings(caplog)
    assert message.startswith("Node 'policy': PpoPlayerContinuous.states[0] (a tensor of "
                              "shape [1, 2, 8]), computed")
    assert "on the node's previous pass and kept in Python, is read at " in message
    assert os.path.join("rl_games", "") in message.split("is read at ")[1]
    assert "annotate.state_tensors('policy', {'states': states})" in message
    failure = _refused()
    assert "PpoPlayerContinuous.states[0] read at " in failure
    assert "annotate.state_tensors()" in failure


@_needs("rl_games", "gymnasium")
def test_rl_games_player_states_strict_refuses_the_read(bundle):
    with pytest.raises(RuntimeError, match="strict mode") as err:
        _rl_games_naive(bundle.root, "jit", 2, strict=True)
    assert "PpoPlayerContinuous.states[0]" in str(err.value)
    assert "annotate.state_tensors('policy'" in str(err.value)
    leapp.stop()


@_needs("rl_games", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("passes", [1, 3])
def test_rl_games_player_declared_replays_10_steps(bundle, backend, passes, caplog):
    """Isaac Lab's rl_games order: the player's states declared before get_action and
    updated after it; quiet, and exact over 10 steps."""
    ce, clients = _rl_games()
    player = clients.make_rl_games_player()
    env = ce.ExportEnv(clients.RLG_ENVS, clients.RLG_OBS, backend)
    leapp.start("rlg", save_path=bundle.root, max_cached_io=passes)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        obs = env.reset()
        for step in range(passes):
            with torch.inference_mode():
                if step == 0:
                    player.get_batch_size(obs, 1)
                    player.init_rnn()
                player.states = ce.declare_state(ce.POLICY_NODE, player.states)
                actions = player.get_action(player.obs_to_torch(obs), is_deterministic=True)
                annotate.update_state(ce.POLICY_NODE, ce.named_state(player.states))
                obs, _, _ = env.step(actions)
        leapp.stop()
        assert leapp.compile_graph(visualize=False) == {"policy": True}
    assert _kept_warnings(caplog) == []
    yaml_path = os.path.join(bundle.dir("rlg"), "rlg.yaml")
    ce.assert_steps_equal(ce.replay(yaml_path, REPLAY, clients.RLG_ENVS, clients.RLG_OBS),
                          clients.rl_games_eager(REPLAY))


# ---- a plain object a module holds; a tensor written for the environment ---------------

class Memory:
    """A plain object (not a module) that a module keeps its state in."""

    def __init__(self) -> None:
        self.h = None


class KeepsInAPlainObject(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.memory = Memory()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.memory.h if self.memory.h is not None else torch.zeros(2)
        out = torch.tanh(x + h)  # read
        self.memory.h = out * 0.5
        return out


def _read_site() -> str:
    lines, first = inspect.getsourcelines(KeepsInAPlainObject)
    (offset,) = [i for i, text in enumerate(lines) if text.rstrip().endswith("# read")]
    return f"{os.path.abspath(__file__)}:{first + offset}"


STEPS = [torch.tensor([1.0, 2.0]), torch.tensor([-1.0, 0.5]), torch.tensor([3.0, -2.0])]


def _run(module: torch.nn.Module, passes: int, root: str) -> None:
    leapp.start("g", save_path=root, max_cached_io=passes)
    for x in STEPS[:passes]:
        x = annotate.input_tensors("n", {"x": x.clone()})
        annotate.output_tensors("n", {"y": module(x)}, export_with="jit")
    leapp.stop()


def test_plain_object_held_by_a_module(bundle, caplog):
    with caplog.at_level(logging.INFO, logger="leapp"):
        _run(KeepsInAPlainObject(), 1, bundle.root)
        assert leapp.compile_graph(visualize=False) == {"n": True}
    assert _kept_warnings(caplog) == []  # one pass: no proof it is read again ...
    note = [r.getMessage() for r in caplog.records if "traced on one pass only" in
            r.getMessage()]
    assert note and "KeepsInAPlainObject.memory.h" in note[0]  # ... but it is named
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(KeepsInAPlainObject(), 2, bundle.root)
    (message,) = _kept_warnings(caplog)
    assert message.startswith("Node 'n': KeepsInAPlainObject.memory.h (a tensor of shape "
                              "[2]), computed by 'mul' on the node's previous pass")
    assert f"is read at {_read_site()}" in message
    assert f"KeepsInAPlainObject.memory.h read at {_read_site()}" in _refused()


class WritesForTheEnvironment(torch.nn.Module):
    """Keeps the last action in a buffer for the environment; never reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("last_action", torch.zeros(2))
        self.copies = torch.zeros(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        action = torch.tanh(x) * 2.0
        self.last_action.copy_(action)
        self.copies[:] = action
        return action


@pytest.mark.parametrize("passes", [2, 3])
def test_written_for_the_environment_and_never_read_is_quiet(bundle, caplog, passes):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(WritesForTheEnvironment(), passes, bundle.root)
        assert leapp.compile_graph(visualize=False) == {"n": True}
    assert _warnings(caplog) == []
