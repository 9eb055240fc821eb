"""TorchScript callables, direct torch.ops calls and random ops inside a node.

A torch.jit.trace-d or torch.jit.script-ed module or function called on a
traced value runs op by op from its TorchScript graph (leapp.tracing.script), so
every backend exports what the compiled code computed; each case here is
exported with every backend, loaded back with InferenceManager and run on new
inputs against eager.  The rl-games case reproduces rl-games'
ModelA2CContinuousLogStd (rl_games/algos_torch/models.py) with its scripted
RunningMeanStd observation normaliser (running_mean_std.py, same structure
and buffers) and the A2CBuilder MLP: the real package is not a test
dependency, as it pulls in tensorboard, gymnasium and wandb-era tooling.
A TorchScript instruction the interpreter does not know is refused at the
call, during tracing, with the user's file and line; validation failures of
a node with random ops name the op instead of an inlined constant.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import numpy as np
import pytest
import torch

import leapp
from leapp import annotate
from leapp.running.inference_manager import InferenceManager

BACKENDS = ["jit", "jit-trace", "onnx", "onnx-torchscript", "pt2"]


# ---------------------------------------------------------------------------
# the callables


class RunningMeanStd(torch.nn.Module):
    """rl-games' observation normaliser, as rl_games/algos_torch/running_mean_std.py."""

    def __init__(self, insize, epsilon: float = 1e-05, per_channel: bool = False,
                 norm_only: bool = False):
        super().__init__()
        self.insize = insize
        self.epsilon = epsilon
        self.norm_only = norm_only
        self.per_channel = per_channel
        self.axis = [0]
        in_size = insize
        self.register_buffer("running_mean", torch.zeros(in_size, dtype=torch.float64))
        self.register_buffer("running_var", torch.ones(in_size, dtype=torch.float64))
        self.register_buffer("count", torch.ones((), dtype=torch.float64))

    def _update_mean_var_count_from_moments(self, mean, var, count, batch_mean, batch_var,
                                            batch_count: int):
        delta = batch_mean - mean
        tot_count = count + batch_count
        new_mean = mean + delta * batch_count / tot_count
        m_a = var * count
        m_b = batch_var * batch_count
        m2 = m_a + m_b + delta ** 2 * count * batch_count / tot_count
        new_var = m2 / tot_count
        return new_mean, new_var, tot_count

    def forward(self, input, denorm: bool = False, mask: Optional[torch.Tensor] = None):
        if self.training:
            mean = input.mean(self.axis)
            var = input.var(self.axis, unbiased=False)
            self.running_mean, self.running_var, self.count = \
                self._update_mean_var_count_from_moments(
                    self.running_mean, self.running_var, self.count, mean, var, input.size(0))
        current_mean = self.running_mean
        current_var = self.running_var
        if denorm:
            y = torch.clamp(input, min=-5.0, max=5.0)
            y = torch.sqrt(current_var.float() + self.epsilon) * y + current_mean.float()
        else:
            if self.norm_only:
                y = input / torch.sqrt(current_var.float() + self.epsilon)
            else:
                y = (input - current_mean.float()) / torch.sqrt(current_var.float()
                                                                + self.epsilon)
                y = torch.clamp(y, min=-5.0, max=5.0)
        return y


def _normaliser(n: int, seed: int) -> RunningMeanStd:
    rms = RunningMeanStd((n,))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rms.running_mean.copy_(torch.randn(n, generator=g, dtype=torch.float64))
        rms.running_var.copy_(torch.rand(n, generator=g, dtype=torch.float64) + 0.5)
    return rms.eval()


class A2CContinuousLogStd(torch.nn.Module):
    """rl-games' ModelA2CContinuousLogStd.Network over an A2CBuilder MLP (elu), eval mode."""

    def __init__(self, obs: int, actions: int) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.running_mean_std = torch.jit.script(_normaliser(obs, 11))
        self.value_mean_std = torch.jit.script(_normaliser(1, 12))
        self.actor_mlp = torch.nn.Sequential(torch.nn.Linear(obs, 32), torch.nn.ELU(),
                                             torch.nn.Linear(32, 32), torch.nn.ELU())
        self.mu = torch.nn.Linear(32, actions)
        self.value = torch.nn.Linear(32, 1)
        self.sigma = torch.nn.Parameter(torch.full((actions,), -0.5))
        self.eval()

    def norm_obs(self, observation):
        with torch.no_grad():
            return self.running_mean_std(observation)

    def denorm_value(self, value):
        with torch.no_grad():
            return self.value_mean_std(value, denorm=True)

    def forward(self, obs):
        obs = self.norm_obs(obs)
        out = self.actor_mlp(obs)
        mu = self.mu(out)
        logstd = mu * 0.0 + self.sigma
        value = self.value(out)
        sigma = torch.exp(logstd)
        neglogp = 0.5 * (((mu - mu) / sigma) ** 2).sum(dim=-1) \
            + 0.5 * np.log(2.0 * np.pi) * mu.size(-1) + logstd.sum(dim=-1)
        return mu, sigma, self.denorm_value(value), neglogp


@torch.jit.script
def scripted_fn(x: torch.Tensor, k: int) -> torch.Tensor:
    y = x * 2.0
    for _ in range(k):
        y = torch.tanh(y) + x
    if bool(y.sum() > -1e9):
        y = y - 1.0
    return y


def _traced_fn(x):
    return torch.relu(x) * 3.0 - x.mean(dim=-1, keepdim=True)


traced_fn = torch.jit.trace(_traced_fn, torch.randn(2, 4))


@torch.jit.script
def printing_fn(x: torch.Tensor) -> torch.Tensor:
    print("value", x)
    return x + 1


def _traced_module() -> torch.jit.ScriptModule:
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(inplace=True),
                              torch.nn.Linear(6, 3)).eval()
    return torch.jit.trace(net, torch.randn(2, 4))


TRACED = _traced_module()
SCRIPTED = torch.jit.script(_normaliser(4, 7))
POLICY = A2CContinuousLogStd(4, 2)


def _aten(x):
    y = torch.ops.aten.add.Tensor(x, torch.ops.aten.relu(x), alpha=2)
    z = torch.ops.aten.mul.Scalar(y, 0.5)
    z = torch.ops.aten.relu_(z)
    return torch.ops.aten.sum.dim_IntList(z, [1], True) + z


class _ViewWrites(torch.nn.Module):
    """In-place writes through views (aten.slice, aten.select) and through a detached
    alias, tensors built from a Python list (aten::tensor, with and without dtype=)
    inside TorchScript."""

    def forward(self, x):
        y = x.clone()
        y[:, 0:2].mul_(2.0)
        y[0].add_(1.0)
        d = y.detach()  # shares y's storage: the write below changes y
        d[1].mul_(0.5)
        scale = torch.tensor([1.0, 0.5, 2.0, 3.0], dtype=torch.float64)
        return y + torch.tensor([1.0, 2.0, 3.0, 4.0]) + scale.float()


VIEW_WRITES = torch.jit.script(_ViewWrites())


CASES = {
    "traced_module": lambda x: TRACED(x) + 1.0,
    "scripted_view_writes": lambda x: VIEW_WRITES(x),
    "scripted_module": lambda x: SCRIPTED(x) * 2.0,
    "scripted_fn": lambda x: scripted_fn(x, 3),
    "traced_fn": lambda x: traced_fn(x),
    "aten": _aten,
    "rl_games": lambda x: POLICY(x),
}


def _outputs(result):
    if isinstance(result, tuple):
        return {f"out{i}": r for i, r in enumerate(result)}
    return {"out": result}


def _export(bundle, fn, backend: str, graph: str = "g") -> str:
    leapp.start(graph, save_path=bundle.root)
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
        x = annotate.input_tensors("n", {"x": x})
        annotate.output_tensors("n", _outputs(fn(x)), export_with=backend)
    leapp.stop()
    leapp.compile_graph(visualize=False, verbose=False)
    return os.path.join(bundle.dir(graph), f"{graph}.yaml")


def _replay(path: str, fn) -> None:
    manager = InferenceManager(path)
    for seed in (10, 11, 12):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = _outputs(fn(x))
        got = manager.run_policy({"n/x": x})
        for name, value in want.items():
            torch.testing.assert_close(got[f"n/{name}"], value, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# traced through, exported with every backend, replayed on new inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_like_eager(bundle, case, backend):
    fn = CASES[case]
    path = _export(bundle, fn, backend)
    _replay(path, fn)


def test_ops_of_the_scripted_module_are_in_the_node(bundle):
    """The node's graph holds the normaliser's ops, not a call of its ScriptMethod."""
    from leapp._core import find_node
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.randn(3, 4)})
    annotate.output_tensors("n", {"out": SCRIPTED(x)}, export_with="jit")
    funcs = [record[0] for record in find_node("n").ops]
    leapp.stop()
    assert not any(isinstance(f, (torch._C.ScriptMethod, torch._C.ScriptFunction))
                   for f in funcs)
    names = {getattr(f, "__name__", "") for f in funcs}
    assert {"sub.Tensor", "div.Tensor", "clamp.default"} <= names, names


def test_traced_module_environment_constant(bundle):
    """@annotate.method naming a torch.jit.trace-d module as environment constant."""
    model = TRACED

    @annotate.method(node_name="n", export_with="jit", environment_constants=["model"])
    def policy(x):
        out = model(x) * 2.0
        return out

    for backend in BACKENDS:
        graph = f"g_{backend.replace('-', '_')}"
        policy_b = annotate.method(node_name="n", export_with=backend,
                                   environment_constants=["model"])(
            lambda x: model(x) * 2.0)
        leapp.start(graph, save_path=bundle.root)
        policy_b(torch.randn(3, 4))
        leapp.stop()
        leapp.compile_graph(visualize=False, verbose=False)
        manager = InferenceManager(os.path.join(bundle.dir(graph), f"{graph}.yaml"))
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
        (got,) = manager.run_policy({"n/x": x}).values()
        with torch.no_grad():
            torch.testing.assert_close(got, model(x) * 2.0, rtol=1e-4, atol=1e-5)
    leapp.start("g_def", save_path=bundle.root)
    policy(torch.randn(3, 4))
    leapp.stop()
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}
    manager = InferenceManager(os.path.join(bundle.dir("g_def"), "g_def.yaml"))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    (got,) = manager.run_policy({"n/x": x}).values()
    with torch.no_grad():
        torch.testing.assert_close(got, model(x) * 2.0, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# refused at the call


def test_unsupported_instruction_refused_at_the_call(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.randn(2, 4)})
    with pytest.raises(NotImplementedError) as err:
        printing_fn(x)  # the line the message names
    message = str(err.value)
    assert "printing_fn" in message and "prim::Print" in message
    assert f"{__file__}:" in message
    here = next(i for i, text in enumerate(open(__file__), 1)
                if "printing_fn(x)  # the line" in text)
    assert f"{__file__}:{here}" in message
    assert "Python code" in message


# ---------------------------------------------------------------------------
# random ops


RANDOM = {
    "randn_like": ("torch.randn_like", lambda x: x + torch.randn_like(x)),
    "dropout": ("torch.nn.functional.dropout",
                lambda x: torch.nn.functional.dropout(x, 0.5, training=True)),
    "normal_sample": ("torch.normal",
                      lambda x: torch.distributions.Normal(x, torch.ones_like(x)).sample()),
}


@pytest.mark.parametrize("case", sorted(RANDOM))
def test_random_op_named_by_validation(bundle, case):
    label, fn = RANDOM[case]
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.randn(8, 16)})
    annotate.output_tensors("n", {"out": fn(x)}, export_with="jit")
    leapp.stop()
    with pytest.raises(Exception) as err:
        leapp.compile_graph(visualize=False, verbose=False)
    message = str(err.value)
    assert f"node n uses the random op {label} at {__file__}:" in message, message
    assert "cannot compare them exactly" in message
    assert "inlined" not in message


def test_dropout_in_eval_mode_is_not_random(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.randn(4, 4)})
    y = torch.nn.functional.dropout(x, 0.5, training=False) + 1.0
    annotate.output_tensors("n", {"out": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(6))
    (got,) = manager.run_policy({"n/x": x}).values()
    torch.testing.assert_close(got, x + 1.0, rtol=0, atol=0)  # dropout off: the identity


# ---------------------------------------------------------------------------
# control flow inside a TorchScript callable: guarded like Python control flow


class _Gate(torch.nn.Module):
    def forward(self, h):
        if bool(h.sum() > 0):  # scripted branch
            return h * 2.0
        return h * 3.0


class _Repeat(torch.nn.Module):
    def forward(self, h):
        out = h
        for _ in range(int(h.abs().sum())):  # scripted trip count
            out = out + 1.0
        return out


class _Until(torch.nn.Module):
    def forward(self, h):
        out = h
        while bool(out.sum() < 10.0):  # scripted loop condition
            out = out + 1.0
        return out


SCRIPTED_FLOW = {"branch": (_Gate, "# scripted branch"),
                 "trip_count": (_Repeat, "# scripted trip count"),
                 "loop_condition": (_Until, "# scripted loop condition")}
FLOW_INPUTS = {"branch": (torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -3.0])),
               "trip_count": (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])),
               "loop_condition": (torch.tensor([1.0, 2.0]), torch.tensor([4.0, 5.0]))}


def _line_of(marker: str) -> str:
    here = next(i for i, text in enumerate(open(__file__), 1)
                if text.rstrip().endswith(marker))
    return f"{__file__}:{here}"


def _flow_pass(module, x):
    x = annotate.input_tensors("n", {"x": x.clone()})
    out = module(x)  # scripted call
    return annotate.output_tensors("n", {"y": out}, export_with="jit")


@pytest.mark.parametrize("case", sorted(SCRIPTED_FLOW))
def test_scripted_control_flow_is_reported_once_with_its_lines(bundle, case, caplog):
    cls, marker = SCRIPTED_FLOW[case]
    module = torch.jit.script(cls())
    first, _ = FLOW_INPUTS[case]
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _flow_pass(module, first)
    site = _line_of(marker)
    records = [r for r in caplog.records if site in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in caplog.records]
    message = records[0].getMessage()
    assert "TorchScript method" in message and f"{cls.__name__}.forward" in message
    assert f"called at {_line_of('# scripted call')}" in message
    assert "baked" in message and "torch.where" in message
    if case == "branch":
        assert records[0].levelno == logging.ERROR
        assert message.startswith("Attempted to use TracedTensor")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}


@pytest.mark.parametrize("case", sorted(SCRIPTED_FLOW))
def test_scripted_control_flow_taking_another_way_on_a_later_pass_is_refused(bundle, case):
    cls, marker = SCRIPTED_FLOW[case]
    module = torch.jit.script(cls())
    first, other = FLOW_INPUTS[case]
    leapp.start("g", save_path=bundle.root)
    _flow_pass(module, first)
    _flow_pass(module, first + 0.0)  # the same way: accepted
    with pytest.raises(RuntimeError, match="the trace took another branch at "
                       + _line_of(marker).replace(".", r"\.")) as err:
        _flow_pass(module, other)
    assert f"{cls.__name__}.forward" in str(err.value)


@pytest.mark.parametrize("case", sorted(SCRIPTED_FLOW))
def test_scripted_control_flow_refused_under_strict_guards(bundle, case):
    cls, marker = SCRIPTED_FLOW[case]
    leapp.start("g", save_path=bundle.root, strict_guards=True)
    with pytest.raises(RuntimeError, match="strict_guards=True") as err:
        _flow_pass(torch.jit.script(cls()), FLOW_INPUTS[case][0])
    assert _line_of(marker) in str(err.value)


def test_scripted_branch_exports_the_branch_it_took(bundle):
    """Two passes the same way: the bundle replays that branch, exactly."""
    module = torch.jit.script(_Gate())
    leapp.start("g", save_path=bundle.root)
    for x in (torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.5])):
        _flow_pass(module, x)
    leapp.stop()
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    x = torch.tensor([0.25, 4.0])
    torch.testing.assert_close(manager.run_policy({"n/x": x})["n/y"], module(x))


def test_scripted_code_without_data_dependent_flow_reports_nothing(bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for seed in range(2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
            x = annotate.input_tensors("n", {"x": x})
            annotate.output_tensors("n", _outputs(POLICY(x)), export_with="jit")
    assert not [r for r in caplog.records if r.name == "leapp"], \
        [r.getMessage() for r in caplog.records]
