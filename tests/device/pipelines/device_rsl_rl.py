"""rsl-rl-lib's recurrent actor-critic on the GPU, exported as Isaac Lab does: TorchScript
disabled, inference mode, observations declared per node, the LSTM / GRU hidden state
declared with state_tensors / update_state, onnx-dynamo.  Needs rsl-rl-lib and
tensordict (tests/device/run.py leaves this pipeline out where they are missing)."""

import torch
from rsl_rl.models import RNNModel
from tensordict import TensorDict

import leapp
from leapp import annotate
from _util import setup

name, out, device = setup(__file__)
GROUPS = {"actor": ["policy"], "critic": ["policy", "privileged"]}
DIMS = {"policy": 10, "privileged": 4}


def observations(step):
    gen = torch.Generator().manual_seed(1000 + step)
    return TensorDict({g: torch.randn(1, d, generator=gen) for g, d in DIMS.items()},
                      batch_size=[1]).to(device)


torch.manual_seed(7)
distribution = {"class_name": "GaussianDistribution", "init_std": 1.0}
actor = RNNModel(observations(0), GROUPS, "actor", 4, hidden_dims=[32],
                 obs_normalization=True, distribution_cfg=distribution, rnn_type="lstm",
                 rnn_hidden_dim=16).to(device).eval()
critic = RNNModel(observations(0), GROUPS, "critic", 1, hidden_dims=[32],
                  obs_normalization=True, rnn_type="gru", rnn_hidden_dim=8).to(device).eval()


def hidden(model):
    state = model.get_hidden_state()
    if state is None:
        rnn = model.rnn.rnn
        zeros = torch.zeros(rnn.num_layers, 1, rnn.hidden_size, device=device)
        state = (zeros.clone(), zeros.clone()) if isinstance(rnn, torch.nn.LSTM) else zeros
        model.rnn.hidden_state = state
    return state


def names(state, prefix):
    if isinstance(state, tuple):
        return {"%s_state_%d" % (prefix, i): t for i, t in enumerate(state)}
    return {"%s_state" % prefix: state}


def node(label, model, obs, output):
    node_obs = obs.clone()
    declared = annotate.input_tensors(label, {g: node_obs[g] for g in GROUPS[label]})
    declared = declared if isinstance(declared, tuple) else (declared,)
    for group, value in zip(GROUPS[label], declared):
        node_obs[group] = value
    state = hidden(model)
    registered = annotate.state_tensors(label, names(state, label))
    if isinstance(state, tuple):
        registered = registered if isinstance(registered, tuple) else (registered,)
    model.rnn.hidden_state = registered
    result = model(node_obs)
    annotate.update_state(label, names(model.get_hidden_state(), label))
    return annotate.output_tensors(label, {output: result}, export_with="onnx-dynamo")


torch.jit._state.disable()
leapp.start(name, save_path=out, max_cached_io=3)
for step in range(3):
    with torch.inference_mode():
        obs = observations(step)
        node("actor", actor, obs, "actions")
        node("critic", critic, obs, "value")
leapp.stop()
leapp.compile_graph(visualize=False)
