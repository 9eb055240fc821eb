"""Real RL libraries exported the way Isaac Lab's LEAPP export backends drive leapp.

Isaac Lab ships export backends for rl_games, skrl and Stable-Baselines3 beside
its rsl-rl one (tests/test_rsl_rl.py).  Each test here builds the library's own
model classes (small networks, seeded), runs an export loop written after the
backend's (TorchScript off while rl_games builds its normalisers, the recurrent
state declared as `actor_state_0`, `actor_state_1` with `state_tensors`, the
actions captured inside `env.step`), compiles with validation for several
backends, then replays the bundle in `leapp.InferenceManager` for REPLAY_STEPS
steps (more than were traced) and compares every step's actions with the
library's own eager path (`get_action`, `act`, `predict`) to 1e-5:

* rl_games: `PpoPlayerContinuous` with an LSTM, its `states` (h, c) as declared
  state, the observation normaliser in the graph;
* skrl: `PPO` with its `RunningStandardScaler` observation preprocessor and
  instantiated Gaussian policy;
* sb3-contrib: `RecurrentPPO` with `VecNormalize` statistics, normalised in torch,
  the LSTM state masked with the done flags and bound with `update_state` AFTER
  `env.step` (after the node's `output_tensors`, and after the next call's
  observations were declared): the state must export as feedback; an episode that
  ends during the traced steps (the done mask is a constant of the node) is refused
  by validation, never exported silently;
* skrl `PPO_RNN`: the checks of Isaac Lab's recurrent-state test (LSTM state
  detected with its shapes, a GRU refused) and the LSTM policy exported and
  replayed; rl_games' LSTM detected and its GRU refused likewise;
* tianshou: its Gaussian actor (`Net` + `ContinuousActorProbabilistic`, the bounded
  mean), its recurrent actor (`RecurrentActorProb`, the `hidden` / `cell` state of
  its dict fed back) and its discrete actor (`DiscreteActor`, the greedy action).
"""
from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
import torch

import leapp
from leapp import annotate

import client_exports as ce
from support import writer_census


def _needs(*modules: str) -> pytest.MarkDecorator:
    """Skip where a library of the 'test' extra is not installed (looked up, not imported)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                              "(the 'test' extra)")


TRACE_STEPS = 3
REPLAY_STEPS = 10
BACKENDS = ["jit", "onnx-dynamo"]


@pytest.fixture(autouse=True)
def _written_by_the_writer(request, tmp_path, monkeypatch):
    """Every onnx-dynamo node of these clients' bundles is written by leapp's ONNX writer
    (unless LEAPP_ONNX_WRITER=torch chose torch's exporter): no fallback.  (monkeypatch,
    the test's own, is undone after this check: a test that turns the writer back on is
    checked as one.)"""
    from leapp.compiling import onnx_writer
    yield
    written, fallbacks = writer_census(str(tmp_path))
    assert fallbacks == []
    params = getattr(request.node, "callspec", None)
    if params is not None and params.params.get("backend") == "onnx-dynamo":
        assert written >= 1 if onnx_writer.enabled() else written == 0


def _traced_loop(save_path: str, graph: str, step_fn: Any, env: ce.ExportEnv,
                 steps: int = TRACE_STEPS) -> str:
    """leapp.start, the environment reset and `steps` calls of step_fn(obs) -> obs; compile."""
    leapp.start(graph, save_path=save_path, max_cached_io=steps)
    obs = env.reset()
    for _ in range(steps):
        with torch.inference_mode():
            obs = step_fn(obs)
    return ce.compile_bundle(save_path, graph)


def _assert_lstm_feedback(doc: dict, backend: str) -> None:
    """The two declared states are fed back; the only graph input is the observation."""
    suffix = ("_out", "_in") if backend.startswith("onnx") else ("", "")
    assert ce.feedback_flow(doc) == {
        f"policy/actor_state_{i}{suffix[0]}": [f"policy/actor_state_{i}{suffix[1]}"]
        for i in range(2)}, doc["pipeline"]
    assert doc["pipeline"]["inputs"] == {"policy": ["obs"]}
    assert doc["pipeline"]["outputs"] == {"policy": ["actions"]}


# ---- rl_games ------------------------------------------------------------------

RLG_OBS, RLG_ACT, RLG_ENVS = 6, 3, 2


def _rl_games_params(rnn: str) -> dict:
    import gymnasium as gym

    return {
        "seed": 0,
        "algo": {"name": "a2c_continuous"},
        "model": {"name": "continuous_a2c_logstd"},
        "network": {
            "name": "actor_critic", "separate": False,
            "space": {"continuous": {
                "mu_activation": "None", "sigma_activation": "None",
                "mu_init": {"name": "default"},
                "sigma_init": {"name": "const_initializer", "val": 0}, "fixed_sigma": True}},
            "mlp": {"units": [32, 16], "activation": "elu", "d2rl": False,
                    "initializer": {"name": "default"}, "regularizer": {"name": "None"}},
            "rnn": {"name": rnn, "units": 8, "layers": 1, "before_mlp": False,
                    "layer_norm": False},
        },
        "config": {
            "name": "clients", "env_name": "rlgpu", "device_name": "cpu",
            "normalize_input": True, "normalize_value": True, "clip_actions": True,
            "env_info": {
                "observation_space": gym.spaces.Box(-np.inf, np.inf, shape=(RLG_OBS,)),
                "action_space": gym.spaces.Box(-2.0, 2.0, shape=(RLG_ACT,)),
            },
        },
    }


def make_rl_games_player(rnn: str = "lstm") -> Any:
    """A seeded PpoPlayerContinuous with trained-looking normaliser statistics."""
    from rl_games.algos_torch.players import PpoPlayerContinuous

    torch.manual_seed(3)
    with ce.torchscript_disabled():  # rl_games scripts its normalisers as it builds them
        player = PpoPlayerContinuous(_rl_games_params(rnn))
    with torch.no_grad():
        stats = player.model.running_mean_std
        stats.running_mean.normal_(generator=torch.Generator().manual_seed(1))
        stats.running_var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(2))
    player.reset()
    return player


def is_rl_games_lstm_policy(player: Any) -> bool:
    return bool(getattr(player, "is_rnn", False)
                and ce.is_two_tensor_lstm_state(getattr(player, "states", None)))


def check_rl_games_recurrent_support(player: Any) -> None:
    if getattr(player, "is_rnn", False) and not is_rl_games_lstm_policy(player):
        raise NotImplementedError("Only RL-Games LSTM recurrent policies can be exported: "
                                  "the recurrent state must be the two tensors (h, c).")


def export_rl_games(save_path: str, backend: str) -> str:
    player = make_rl_games_player()
    env = ce.ExportEnv(RLG_ENVS, RLG_OBS, backend)
    started = False

    def step(obs: torch.Tensor) -> torch.Tensor:
        nonlocal started
        if not started:  # the player learns its batch size from the first observations
            player.get_batch_size(obs, 1)
            player.init_rnn()
            check_rl_games_recurrent_support(player)
            started = True
        player.states = ce.declare_state(ce.POLICY_NODE, player.states)
        actions = player.get_action(player.obs_to_torch(obs), is_deterministic=True)
        annotate.update_state(ce.POLICY_NODE, ce.named_state(player.states))
        obs, _, _ = env.step(actions)
        return obs

    return _traced_loop(save_path, "rl_games_lstm", step, env)


def rl_games_eager(steps: int) -> list[torch.Tensor]:
    player = make_rl_games_player()
    player.get_batch_size(ce.observation(0, RLG_ENVS, RLG_OBS), 1)
    player.init_rnn()
    with torch.inference_mode():
        return [player.get_action(ce.observation(s, RLG_ENVS, RLG_OBS),
                                  is_deterministic=True).clone() for s in range(steps)]


def rl_games_zero_state_actions(step: int) -> torch.Tensor:
    """The actions a fresh (zero-state) player gives for `step`'s observations."""
    player = make_rl_games_player()
    obs = ce.observation(step, RLG_ENVS, RLG_OBS)
    player.get_batch_size(obs, 1)
    player.init_rnn()
    with torch.inference_mode():
        return player.get_action(obs, is_deterministic=True).clone()


@_needs("rl_games", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
def test_rl_games_lstm_states_fed_back(tmp_path, backend):
    yaml_path = export_rl_games(str(tmp_path), backend)
    _assert_lstm_feedback(ce.read_yaml(yaml_path), backend)
    got = ce.replay(yaml_path, REPLAY_STEPS, RLG_ENVS, RLG_OBS)
    want = rl_games_eager(REPLAY_STEPS)
    # the state matters: the second step's actions differ from a zero-state start
    assert not torch.allclose(want[1], rl_games_zero_state_actions(1), atol=1e-4)
    ce.assert_steps_equal(got, want)


@_needs("rl_games", "gymnasium")
@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_rl_games_recurrent_state_detection(rnn):
    """An LSTM player's (h, c) is found with its shape; a GRU player is refused."""
    player = make_rl_games_player(rnn)
    if rnn == "gru":
        assert not is_rl_games_lstm_policy(player)
        with pytest.raises(NotImplementedError, match="Only RL-Games LSTM"):
            check_rl_games_recurrent_support(player)
        return
    assert is_rl_games_lstm_policy(player)
    with torch.inference_mode():
        player.get_action(torch.zeros(RLG_OBS), is_deterministic=True)
    assert [tuple(s.shape) for s in player.states] == [(1, 1, 8), (1, 1, 8)]


# ---- skrl: PPO with its observation preprocessor --------------------------------

SKRL_OBS, SKRL_ACT, SKRL_ENVS = 6, 3, 2


def _skrl_spaces(obs: int, act: int) -> tuple[Any, Any]:
    import gymnasium as gym

    return (gym.spaces.Box(-np.inf, np.inf, shape=(obs,), dtype=np.float32),
            gym.spaces.Box(-1.0, 1.0, shape=(act,), dtype=np.float32))


_SKRL_EXPERIMENT = {"write_interval": 0, "checkpoint_interval": 0, "directory": "",
                    "experiment_name": ""}


def make_skrl_ppo() -> Any:
    """skrl's PPO with instantiated models and a RunningStandardScaler with statistics."""
    from skrl.agents.torch.ppo import PPO
    from skrl.resources.preprocessors.torch import RunningStandardScaler
    from skrl.utils.model_instantiators.torch import deterministic_model, gaussian_model

    obs_space, act_space = _skrl_spaces(SKRL_OBS, SKRL_ACT)
    torch.manual_seed(4)
    network = [{"name": "net", "input": "OBSERVATIONS", "layers": [32, 16],
                "activations": "elu"}]
    policy = gaussian_model(observation_space=obs_space, action_space=act_space, device="cpu",
                            network=network, output="ACTIONS", initial_log_std=-0.5)
    value = deterministic_model(observation_space=obs_space, action_space=act_space,
                                device="cpu", network=network, output="ONE")
    agent = PPO(models={"policy": policy, "value": value}, observation_space=obs_space,
                action_space=act_space, device="cpu",
                cfg={"observation_preprocessor": RunningStandardScaler,
                     "observation_preprocessor_kwargs": {"size": obs_space, "device": "cpu"},
                     "experiment": dict(_SKRL_EXPERIMENT)})
    agent.init()
    agent.enable_training_mode(False, apply_to_models=True)
    scaler = agent._observation_preprocessor
    with torch.no_grad():
        scaler.running_mean.normal_(generator=torch.Generator().manual_seed(1))
        scaler.running_variance.uniform_(0.3, 3.0, generator=torch.Generator().manual_seed(2))
    return agent


def skrl_eager(agent: Any, steps: int, num_envs: int, obs_dim: int,
               recurrent: bool = False) -> list[torch.Tensor]:
    """skrl's own act(): its mean actions; a recurrent agent carries its final states on."""
    got = []
    with torch.inference_mode():
        for step in range(steps):
            _, outputs = agent.act(ce.observation(step, num_envs, obs_dim), None,
                                   timestep=step, timesteps=steps)
            got.append(outputs["mean_actions"].clone())
            if recurrent:  # what the agent's record_transition does between steps
                agent._rnn_initial_states["policy"] = agent._rnn_final_states["policy"]
    return got


@_needs("skrl", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
def test_skrl_ppo_with_preprocessor(tmp_path, backend):
    agent = make_skrl_ppo()
    env = ce.ExportEnv(SKRL_ENVS, SKRL_OBS, backend)

    def step(obs: torch.Tensor) -> torch.Tensor:
        actions, outputs = agent.act(obs, None, timestep=0, timesteps=0)
        obs, _, _ = env.step(outputs.get("mean_actions", actions))
        return obs

    yaml_path = _traced_loop(str(tmp_path), "skrl_ppo", step, env)
    doc = ce.read_yaml(yaml_path)
    assert doc["pipeline"]["inputs"] == {"policy": ["obs"]}
    assert ce.feedback_flow(doc) == {}
    got = ce.replay(yaml_path, REPLAY_STEPS, SKRL_ENVS, SKRL_OBS)
    reference = make_skrl_ppo()
    want = skrl_eager(reference, REPLAY_STEPS, SKRL_ENVS, SKRL_OBS)
    # the preprocessor matters: the policy on raw observations acts otherwise
    with torch.inference_mode():
        raw = reference.policy.act({"observations": ce.observation(0, SKRL_ENVS, SKRL_OBS)},
                                   role="policy")[1]["mean_actions"]
    assert not torch.allclose(raw, want[0], atol=1e-3)
    ce.assert_steps_equal(got, want)


# ---- skrl: PPO_RNN (Isaac Lab's recurrent-state checks, then the export) ---------

SKRL_RNN_OBS, SKRL_RNN_ACT, SKRL_RNN_HIDDEN = 3, 2, 5


def make_skrl_recurrent_agent(rnn: str = "lstm") -> Any:
    """skrl's PPO_RNN over a small recurrent Gaussian policy written against skrl's Model."""
    from skrl.agents.torch.ppo import PPO_RNN
    from skrl.models.torch import DeterministicMixin, GaussianMixin, Model

    class RecurrentPolicy(GaussianMixin, Model):
        def __init__(self, observation_space: Any, action_space: Any) -> None:
            Model.__init__(self, observation_space=observation_space,
                           action_space=action_space, device="cpu")
            GaussianMixin.__init__(self, clip_actions=False, clip_log_std=True,
                                   min_log_std=-20, max_log_std=2, reduction="sum",
                                   role="policy")
            layer = torch.nn.LSTM if rnn == "lstm" else torch.nn.GRU
            self.memory = layer(self.num_observations, SKRL_RNN_HIDDEN, 1)
            self.head = torch.nn.Linear(SKRL_RNN_HIDDEN, self.num_actions)
            self.log_std_parameter = torch.nn.Parameter(torch.full((self.num_actions,), -0.5))

        def get_specification(self) -> dict:
            count = 2 if rnn == "lstm" else 1
            return {"rnn": {"sizes": [(1, 1, SKRL_RNN_HIDDEN)] * count, "sequence_length": 1}}

        def compute(self, inputs: dict, role: str) -> tuple[torch.Tensor, dict]:
            carried = tuple(inputs["rnn"]) if rnn == "lstm" else inputs["rnn"][0]
            out, carried = self.memory(inputs["observations"].unsqueeze(0), carried)
            states = list(carried) if rnn == "lstm" else [carried]
            return self.head(out.squeeze(0)), {"log_std": self.log_std_parameter, "rnn": states}

    class Value(DeterministicMixin, Model):
        def __init__(self, observation_space: Any, action_space: Any) -> None:
            Model.__init__(self, observation_space=observation_space,
                           action_space=action_space, device="cpu")
            DeterministicMixin.__init__(self)
            self.net = torch.nn.Linear(self.num_observations, 1)

        def compute(self, inputs: dict, role: str) -> tuple[torch.Tensor, dict]:
            return self.net(inputs["observations"]), {}

    obs_space, act_space = _skrl_spaces(SKRL_RNN_OBS, SKRL_RNN_ACT)
    torch.manual_seed(6)
    agent = PPO_RNN(models={"policy": RecurrentPolicy(obs_space, act_space),
                            "value": Value(obs_space, act_space)},
                    observation_space=obs_space, action_space=act_space, device="cpu",
                    cfg={"experiment": dict(_SKRL_EXPERIMENT)})
    agent.init()
    agent.enable_training_mode(False, apply_to_models=True)
    return agent


def skrl_policy_states(agent: Any) -> list[torch.Tensor]:
    return getattr(agent, "_rnn_initial_states", {}).get("policy", [])


def skrl_output_states(agent: Any, outputs: dict) -> list[torch.Tensor]:
    states = outputs.get("rnn")
    return states if states is not None else agent._rnn_final_states.get("policy", [])


def is_skrl_lstm_policy(agent: Any) -> bool:
    sizes = agent.policy.get_specification().get("rnn", {}).get("sizes", [])
    return bool(getattr(agent, "_rnn", False)
                and ce.is_two_tensor_lstm_state(skrl_policy_states(agent)) and len(sizes) == 2)


def check_skrl_recurrent_support(agent: Any) -> None:
    if getattr(agent, "_rnn", False) and not is_skrl_lstm_policy(agent):
        raise NotImplementedError("Only skrl LSTM recurrent policies can be exported: "
                                  "the policy's recurrent state must be (h, c).")


@_needs("skrl", "gymnasium")
def test_skrl_lstm_state_detected_and_updated_from_act():
    agent = make_skrl_recurrent_agent()
    assert is_skrl_lstm_policy(agent)
    check_skrl_recurrent_support(agent)
    assert [tuple(t.shape) for t in skrl_policy_states(agent)] == [(1, 1, 5), (1, 1, 5)]
    with torch.inference_mode():
        actions, outputs = agent.act(torch.zeros(1, SKRL_RNN_OBS), None, timestep=0,
                                     timesteps=1)
    states = skrl_output_states(agent, outputs)
    assert tuple(actions.shape) == (1, SKRL_RNN_ACT)
    assert [tuple(t.shape) for t in states] == [(1, 1, 5), (1, 1, 5)]
    # the state advanced: the cell state after one step is no longer zero
    assert states[1].abs().sum() > 0


@_needs("skrl", "gymnasium")
def test_skrl_recurrent_non_lstm_refused():
    agent = make_skrl_recurrent_agent("gru")
    assert agent._rnn and len(skrl_policy_states(agent)) == 1
    assert not is_skrl_lstm_policy(agent)
    with pytest.raises(NotImplementedError, match="Only skrl LSTM"):
        check_skrl_recurrent_support(agent)


@_needs("skrl", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
def test_skrl_lstm_export_replays(tmp_path, backend):
    agent = make_skrl_recurrent_agent()
    check_skrl_recurrent_support(agent)
    env = ce.ExportEnv(1, SKRL_RNN_OBS, backend)

    def step(obs: torch.Tensor) -> torch.Tensor:
        agent._rnn_initial_states["policy"] = ce.declare_state(
            ce.POLICY_NODE, skrl_policy_states(agent))
        actions, outputs = agent.act(obs, None, timestep=0, timesteps=0)
        after = skrl_output_states(agent, outputs)
        annotate.update_state(ce.POLICY_NODE, ce.named_state(after))
        agent._rnn_initial_states["policy"] = list(after)
        obs, _, _ = env.step(outputs.get("mean_actions", actions))
        return obs

    yaml_path = _traced_loop(str(tmp_path), "skrl_lstm", step, env)
    _assert_lstm_feedback(ce.read_yaml(yaml_path), backend)
    got = ce.replay(yaml_path, REPLAY_STEPS, 1, SKRL_RNN_OBS)
    want = skrl_eager(make_skrl_recurrent_agent(), REPLAY_STEPS, 1, SKRL_RNN_OBS,
                      recurrent=True)
    ce.assert_steps_equal(got, want)


# ---- Stable-Baselines3: RecurrentPPO + VecNormalize, state updated after the step --

SB3_OBS, SB3_ACT, SB3_ENVS = 5, 2, 2


def _sb3_env_class() -> type:
    import gymnasium as gym

    class BoxEnv(gym.Env):
        """Only its spaces matter: the model is built against it, never trained."""
        observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(SB3_OBS,), dtype=np.float32)
        action_space = gym.spaces.Box(-2.0, 2.0, shape=(SB3_ACT,), dtype=np.float32)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
            return np.zeros(SB3_OBS, dtype=np.float32), {}

        def step(self, action: np.ndarray) -> tuple:
            return np.zeros(SB3_OBS, dtype=np.float32), 0.0, False, False, {}

    return BoxEnv


def make_recurrent_ppo() -> tuple[Any, Any]:
    """A seeded RecurrentPPO (MlpLstmPolicy) and VecNormalize with saved-looking statistics."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    normalize = VecNormalize(DummyVecEnv([_sb3_env_class()] * SB3_ENVS), norm_reward=False,
                             clip_obs=4.0)
    normalize.obs_rms.mean = np.random.default_rng(1).normal(size=SB3_OBS)
    normalize.obs_rms.var = np.random.default_rng(2).uniform(0.3, 3.0, size=SB3_OBS)
    normalize.training = False
    model = RecurrentPPO("MlpLstmPolicy", normalize, n_steps=4, batch_size=8, seed=0,
                         device="cpu",
                         policy_kwargs={"lstm_hidden_size": 8,
                                        "net_arch": {"pi": [16], "vf": [16]}})
    return model, normalize


def normalize_in_torch(obs: torch.Tensor, normalize: Any) -> torch.Tensor:
    """VecNormalize's observation normalisation from its statistics, as torch ops."""
    mean = torch.as_tensor(normalize.obs_rms.mean, dtype=obs.dtype)
    var = torch.as_tensor(normalize.obs_rms.var, dtype=obs.dtype)
    return torch.clamp((obs - mean) / torch.sqrt(var + normalize.epsilon),
                       -normalize.clip_obs, normalize.clip_obs)


def clip_to_action_space(policy: Any, actions: torch.Tensor) -> torch.Tensor:
    """What BasePolicy.predict does to Box actions (no squashing here): clip to the bounds."""
    low = torch.as_tensor(policy.action_space.low, dtype=actions.dtype)
    high = torch.as_tensor(policy.action_space.high, dtype=actions.dtype)
    return torch.maximum(torch.minimum(actions, high), low)


def export_recurrent_ppo(save_path: str, backend: str,
                         done_at: dict[int, list[int]] | None = None,
                         env: ce.ExportEnv | None = None,
                         graph: str = "sb3_recurrent_ppo") -> str:
    """Isaac Lab's Stable-Baselines3 export order: the LSTM state declared, _predict,
    env.step (inside which the action is captured and the next observations declared),
    the new LSTM state masked with the done flags, then update_state."""
    model, normalize = make_recurrent_ppo()
    policy = model.policy
    policy.set_training_mode(False)
    if env is None:
        env = ce.ExportEnv(SB3_ENVS, SB3_OBS, backend, done_at=done_at)
    layers, _, hidden = policy.lstm_hidden_state_shape
    carried = [torch.zeros(layers, SB3_ENVS, hidden) for _ in range(2)]

    def step(obs: torch.Tensor) -> torch.Tensor:
        nonlocal carried
        state = tuple(ce.declare_state(ce.POLICY_NODE, carried))
        actions, next_state = policy._predict(normalize_in_torch(obs, normalize),
                                              lstm_states=state,
                                              episode_starts=torch.zeros(SB3_ENVS),
                                              deterministic=True)
        # the node's output_tensors happens in here, and the next observations are declared
        obs, terminated, truncated = env.step(clip_to_action_space(policy, actions))
        not_done = (~(terminated | truncated)).to(next_state[0].dtype).reshape(1, -1, 1)
        carried = [s * not_done for s in next_state]
        annotate.update_state(ce.POLICY_NODE, ce.named_state(carried))
        return obs

    with ce.distribution_validation_off():
        return _traced_loop(save_path, graph, step, env)


def recurrent_ppo_eager(steps: int) -> list[torch.Tensor]:
    """The library's own path: VecNormalize.normalize_obs, then RecurrentPPO.predict."""
    model, normalize = make_recurrent_ppo()
    state, starts = None, np.ones(SB3_ENVS, dtype=bool)
    got = []
    for step in range(steps):
        obs = normalize.normalize_obs(ce.observation(step, SB3_ENVS, SB3_OBS).numpy())
        actions, state = model.predict(obs, state=state, episode_start=starts,
                                       deterministic=True)
        starts = np.zeros(SB3_ENVS, dtype=bool)
        got.append(torch.as_tensor(actions))
    return got


@_needs("sb3_contrib", "stable_baselines3", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrent_ppo_state_updated_after_step(tmp_path, backend):
    """The LSTM state, declared before the policy and bound after env.step, is feedback:
    the bundle's state advances and its actions follow predict() step by step."""
    yaml_path = export_recurrent_ppo(str(tmp_path), backend)
    _assert_lstm_feedback(ce.read_yaml(yaml_path), backend)
    got = ce.replay(yaml_path, REPLAY_STEPS, SB3_ENVS, SB3_OBS)
    want = recurrent_ppo_eager(REPLAY_STEPS)
    ce.assert_steps_equal(got, want)


class _IsaacObservations(ce.ExportEnv):
    """Isaac Lab's observation terms inside the environment: the raw reading an input,
    the last action and a history of the raw reading state of the node, declared with
    state_tensors while the next observations are computed (inside env.step); the
    policy's observation is their concatenation (SB3_OBS = 1 + SB3_ACT + 2)."""

    def __init__(self, backend: str) -> None:
        super().__init__(SB3_ENVS, 1, backend)
        self.last_action = torch.zeros(SB3_ENVS, SB3_ACT)
        self.history = torch.zeros(SB3_ENVS, 2)

    def _observe(self) -> torch.Tensor:
        raw = annotate.input_tensors(self.node, {"raw": observation_raw(self.steps)})
        last, history = annotate.state_tensors(self.node, {"last_action": self.last_action,
                                                           "history": self.history})
        history = torch.cat([history[:, 1:], raw], dim=1)
        annotate.update_state(self.node, {"history": history})
        self.history = history
        return torch.cat([raw, last, history], dim=1)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        annotate.update_state(self.node, {"last_action": actions})
        self.last_action = actions
        return super().step(actions)


def observation_raw(step: int) -> torch.Tensor:
    return ce.observation(step, SB3_ENVS, 1)


@_needs("sb3_contrib", "stable_baselines3", "gymnasium")
@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrent_ppo_in_isaac_labs_order_replays_predict(tmp_path, caplog, backend):
    """The update_state of the LSTM state is tied to the call that declared it, though the
    next call declared its other states (last action, history) inside env.step first;
    the bundle replays VecNormalize + RecurrentPPO.predict over 10 steps, and the done
    mask, baked, is named."""
    import logging

    with caplog.at_level(logging.WARNING, logger="leapp"):
        yaml_path = export_recurrent_ppo(str(tmp_path), backend, env=_IsaacObservations(backend),
                                         graph="sb3_isaac_order")
    assert any("update_state for state 'actor_state_0' of node 'policy'" in r.getMessage()
               and "with a tensor from outside the node" in r.getMessage()
               for r in caplog.records)
    flow = ce.feedback_flow(ce.read_yaml(yaml_path))
    assert {key.split("/")[1].removesuffix("_out") for key in flow} == \
        {"actor_state_0", "actor_state_1", "last_action", "history"}, flow
    manager = leapp.InferenceManager(yaml_path)
    assert list(manager.inputs) == [f"{ce.POLICY_NODE}/raw"], manager.inputs
    model, normalize = make_recurrent_ppo()
    state, starts = None, np.ones(SB3_ENVS, dtype=bool)
    last, history = np.zeros((SB3_ENVS, SB3_ACT), np.float32), np.zeros((SB3_ENVS, 2),
                                                                        np.float32)
    with torch.inference_mode():
        for step in range(REPLAY_STEPS):
            raw = observation_raw(step)
            got = manager.run_policy({f"{ce.POLICY_NODE}/raw": raw})[
                f"{ce.POLICY_NODE}/actions"]
            history = np.concatenate([history[:, 1:], raw.numpy()], axis=1)
            obs = np.concatenate([raw.numpy(), last, history], axis=1)
            actions, state = model.predict(normalize.normalize_obs(obs), state=state,
                                           episode_start=starts, deterministic=True)
            starts = np.zeros(SB3_ENVS, dtype=bool)
            last = actions.astype(np.float32)
            assert torch.allclose(got, torch.as_tensor(actions), rtol=1e-5, atol=1e-5), \
                (step, got, actions)


@_needs("sb3_contrib", "stable_baselines3", "gymnasium")
def test_recurrent_ppo_done_during_trace_is_refused(tmp_path):
    """The done flags come from outside the trace, so the mask is a constant of the node
    (the first pass's: nobody done).  An episode that ends during the traced steps makes
    the later pass's masked state differ from that constant: validation refuses the
    bundle rather than export a state that never resets, or resets always."""
    with pytest.raises(Exception, match="validation failed"):
        export_recurrent_ppo(str(tmp_path), "jit", done_at={1: [0]})


# ---- tianshou: Gaussian, recurrent and discrete actors -------------------------

TS_OBS, TS_ACT, TS_ENVS, TS_HIDDEN = 5, 3, 2, 8


def make_tianshou_actor(kind: str) -> Any:
    """A seeded tianshou actor: "gaussian", "recurrent" or "discrete"."""
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic, RecurrentActorProb
    from tianshou.utils.net.discrete import DiscreteActor

    torch.manual_seed(6)
    if kind == "gaussian":
        net = Net(state_shape=TS_OBS, hidden_sizes=[32, 16], activation=torch.nn.Tanh)
        actor = ContinuousActorProbabilistic(preprocess_net=net, action_shape=TS_ACT,
                                             max_action=2.0, conditioned_sigma=True)
    elif kind == "recurrent":
        actor = RecurrentActorProb(layer_num=1, state_shape=(TS_OBS,), action_shape=(TS_ACT,),
                                   hidden_layer_size=TS_HIDDEN, max_action=1.5)
    else:
        net = Net(state_shape=TS_OBS, hidden_sizes=[32])
        actor = DiscreteActor(preprocess_net=net, action_shape=TS_ACT)
    return actor.eval()


def _tianshou_zero_state() -> dict[str, torch.Tensor]:
    """RecurrentActorProb's state: [batch, layers, hidden] for hidden and cell."""
    return {key: torch.zeros(TS_ENVS, 1, TS_HIDDEN) for key in ("hidden", "cell")}


def _tianshou_act(actor: Any, kind: str, obs: torch.Tensor,
                  state: dict | None) -> tuple[torch.Tensor, dict | None]:
    """The deterministic action the way tianshou's policies take it: the Gaussian's mean
    (already squashed to max_action), the discrete actor's most probable action."""
    if kind == "discrete":
        probs, _ = actor(obs)
        return probs.argmax(-1), None
    (mu, _sigma), state = actor(obs, state)
    return mu, state


def tianshou_eager(kind: str, steps: int) -> list[torch.Tensor]:
    actor = make_tianshou_actor(kind)
    state = _tianshou_zero_state() if kind == "recurrent" else None
    got = []
    with torch.inference_mode():
        for step in range(steps):
            action, state = _tianshou_act(actor, kind, ce.observation(step, TS_ENVS, TS_OBS),
                                          state)
            got.append(action.clone())
    return got


@_needs("tianshou")
@pytest.mark.parametrize("kind", ["gaussian", "recurrent", "discrete"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tianshou_actors(tmp_path, backend, kind):
    actor = make_tianshou_actor(kind)
    env = ce.ExportEnv(TS_ENVS, TS_OBS, backend)
    state = _tianshou_zero_state() if kind == "recurrent" else None

    def step(obs: torch.Tensor) -> torch.Tensor:
        nonlocal state
        if state is not None:
            hidden, cell = ce.declare_state(ce.POLICY_NODE, [state["hidden"], state["cell"]])
            state = {"hidden": hidden, "cell": cell}
        action, state = _tianshou_act(actor, kind, obs, state)
        if state is not None:
            annotate.update_state(ce.POLICY_NODE,
                                  ce.named_state([state["hidden"], state["cell"]]))
        obs, _, _ = env.step(action)
        return obs

    yaml_path = _traced_loop(str(tmp_path), f"tianshou_{kind}", step, env)
    doc = ce.read_yaml(yaml_path)
    if kind == "recurrent":
        _assert_lstm_feedback(doc, backend)
    else:
        assert ce.feedback_flow(doc) == {}
    got = ce.replay(yaml_path, REPLAY_STEPS, TS_ENVS, TS_OBS)
    want = tianshou_eager(kind, REPLAY_STEPS)
    if kind == "discrete":
        assert [g.dtype for g in got] == [torch.int64] * REPLAY_STEPS
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert len({tuple(w.tolist()) for w in want}) > 1  # the action changes with obs
    else:
        ce.assert_steps_equal(got, want)
    if kind == "recurrent":  # the state matters: step 1 from a zero state acts otherwise
        with torch.inference_mode():
            fresh, _ = _tianshou_act(make_tianshou_actor(kind), kind,
                                     ce.observation(1, TS_ENVS, TS_OBS), _tianshou_zero_state())
        assert not torch.allclose(fresh, want[1], atol=1e-4)


# ---- one robot's export, batched for a fleet -----------------------------------


@pytest.mark.parametrize("library", [
    pytest.param("rl_games", marks=_needs("rl_games", "gymnasium")),
    pytest.param("sb3", marks=_needs("sb3_contrib", "stable_baselines3", "gymnasium"))])
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_robot_export_batches_as_written(tmp_path, monkeypatch, caplog, backend,
                                             library):
    """rl_games' LSTM player and SB3's RecurrentPPO, exported for one environment as the
    export scripts drive them, fused with batch=True: every node leapp's ONNX writer
    wrote (the onnx file, or the jit module written again) stacks robots as written,
    with no second try through torch's exporters, and the batched model steps each of
    three robots as one InferenceManager per robot does (fuse checks it)."""
    from leapp.serving.fusion import read_metadata

    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)  # the writer's models, this test
    monkeypatch.setitem(globals(), "RLG_ENVS", 1)
    monkeypatch.setitem(globals(), "SB3_ENVS", 1)
    export = export_rl_games if library == "rl_games" else export_recurrent_ppo
    yaml_path = export(str(tmp_path), backend)
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path, batch=True)
    assert "cannot be batched" not in caplog.text
    assert "converted to ONNX with torch's exporter" not in caplog.text
    metadata = read_metadata(path)
    assert metadata["batched"] is True
    assert {s["robot_axis"] for s in metadata["state"]} == {1}  # [layers, robot, hidden]


@pytest.mark.parametrize("backend", ["jit", "onnx"])
@pytest.mark.parametrize("passes", [1, 2])
def test_sb3_ppo_exported_plainly_is_quiet(tmp_path, caplog, monkeypatch, backend, passes):
    """SB3's PPO exported the plain way, with torch's default argument checks on: its
    Normal distribution checks its parameters by reading traced values, which decides
    nothing the policy computes; one INFO line, no WARNING or ERROR, and the bundle
    replays predict."""
    import logging

    import gymnasium as gym
    from stable_baselines3 import PPO

    # torch's default (another test's library may have turned it off for the process)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    policy = PPO("MlpPolicy", gym.make("Pendulum-v1"), device="cpu", seed=0).policy.eval()
    gen = torch.Generator().manual_seed(0)
    with caplog.at_level(logging.INFO, logger="leapp"):
        leapp.start("sb3", save_path=str(tmp_path))
        for _ in range(passes):
            obs = annotate.input_tensors("policy", {"obs": torch.randn(1, 3, generator=gen)})
            actions, _, _ = policy(obs, deterministic=True)
            annotate.output_tensors("policy", {"actions": actions}, export_with=backend)
        leapp.stop()
        assert leapp.compile_graph(visualize=False) == {"policy": True}
    loud = [r.getMessage() for r in caplog.records
            if r.levelname in ("WARNING", "ERROR", "CRITICAL") and r.name.startswith("leapp")]
    assert loud == []
    said = [r.getMessage() for r in caplog.records if "torch.distributions checks" in
            r.getMessage()]
    assert len(said) == 1 and "set_default_validate_args(False)" in said[0]
    manager = leapp.InferenceManager(str(tmp_path / "sb3" / "sb3.yaml"))
    for _ in range(5):
        obs = torch.randn(1, 3, generator=gen)
        with torch.no_grad():
            want = policy(obs, deterministic=True)[0]
        torch.testing.assert_close(manager.run_policy({"policy/obs": obs})["policy/actions"], want,
                                   rtol=1e-5, atol=1e-6)
