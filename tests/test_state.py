"""Explicit state (state_tensors / update_state), register_buffer and annotate.module."""
from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn as nn

import leapp
from leapp import _core, annotate
from state_helpers import (ExportedPipeline, compile_quiet, leapp_session,  # noqa: F401
                           load_initial, load_yaml, node)
import state_scenarios as sc


def _bundle(tmp_path, graph):
    return os.path.join(str(tmp_path), graph)


# ---- state_tensors / update_state ------------------------------------------------

def test_state_returns_single_value_or_tuple_and_update_returns_same_objects(tmp_path):
    leapp.start("returns", save_path=str(tmp_path))
    obs = annotate.input_tensors("policy", {"obs": torch.ones(1, 2)})
    one = annotate.state_tensors("policy", {"h": torch.zeros(1, 2)})
    assert isinstance(one, torch.Tensor)
    two = annotate.state_tensors("policy", {"a": torch.zeros(1, 2), "b": torch.ones(1, 2)})
    assert isinstance(two, tuple) and len(two) == 2
    h2, a2, b2 = one + obs, two[0] * obs, two[1] - obs
    assert annotate.update_state("policy", {"h": h2}) is h2
    got = annotate.update_state("policy", {"a": a2, "b": b2})
    assert got[0] is a2 and got[1] is b2
    annotate.output_tensors("policy", {"y": h2 + a2 + b2}, export_with="jit")
    compile_quiet()
    doc = load_yaml(_bundle(tmp_path, "returns"), "returns")
    assert doc["pipeline"]["feedback_flow"] == {
        "policy/a": ["policy/a"], "policy/b": ["policy/b"], "policy/h": ["policy/h"]}


def _eager_counter(steps):
    count, out = torch.zeros(1, 1), []
    for _ in range(steps):
        count = count + 1.0
        out.append(torch.ones(1, 3) * count)
    return out


def test_counter_state_is_feedback_and_exported_model_steps_like_eager(tmp_path):
    sc.counter(str(tmp_path))
    bundle = _bundle(tmp_path, "counter")
    doc = load_yaml(bundle, "counter")
    assert doc["pipeline"]["feedback_flow"] == {"policy/counter": ["policy/counter"]}
    assert doc["pipeline"]["initial_values"] == "counter_initial_values.safetensors"
    assert doc["pipeline"]["inputs"] == {"policy": ["obs"]}
    assert doc["pipeline"]["outputs"] == {"policy": ["action"]}
    assert [p["name"] for p in doc["models"]["policy"]["inputs"]] == ["obs", "counter"]
    assert [p["name"] for p in doc["models"]["policy"]["outputs"]] == ["action", "counter"]
    initial = load_initial(bundle, "counter")
    assert list(initial) == ["policy/counter"]
    assert torch.equal(initial["policy/counter"], torch.zeros(1, 1))
    model = torch.jit.load(os.path.join(bundle, "policy.pt"))
    assert len(list(model.graph.inputs())) == 3  # self + obs + counter
    pipe = ExportedPipeline(bundle, "counter")
    for expected in _eager_counter(10):
        got = pipe.step({"policy/obs": torch.ones(1, 3)})
        assert torch.equal(got["policy/action"], expected)


def test_state_never_updated_stays_a_regular_input(tmp_path, caplog):
    sc.unupdated_state(str(tmp_path))
    bundle = _bundle(tmp_path, "unupdated_state")
    doc = load_yaml(bundle, "unupdated_state")
    assert doc["pipeline"]["feedback_flow"] == {}
    assert "initial_values" not in doc["pipeline"]
    assert doc["pipeline"]["inputs"] == {"policy": ["obs", "bias"]}
    assert [p["name"] for p in doc["models"]["policy"]["outputs"]] == ["action"]
    assert load_initial(bundle, "unupdated_state") is None
    assert "never passed to update_state" in caplog.text


def test_history_buffer_shift_append_steps_like_eager(tmp_path):
    sc.history(str(tmp_path))
    bundle = _bundle(tmp_path, "history")
    pipe = ExportedPipeline(bundle, "history")
    hist = torch.zeros(1, 8)
    for step in range(10):
        obs = torch.tensor([[float(step), -float(step)]])
        hist = torch.cat([hist[:, 2:], obs], dim=-1)
        got = pipe.step({"policy/obs": obs})
        assert torch.equal(got["policy/history"], hist)
        assert torch.allclose(got["policy/summary"], hist.mean(dim=-1, keepdim=True))


def test_three_states_in_one_node(tmp_path):
    sc.three_states(str(tmp_path))
    bundle = _bundle(tmp_path, "three_states")
    doc = load_yaml(bundle, "three_states")
    assert doc["pipeline"]["feedback_flow"] == {
        "policy/a": ["policy/a"], "policy/b": ["policy/b"], "policy/c": ["policy/c"]}
    initial = load_initial(bundle, "three_states")
    assert sorted(initial) == ["policy/a", "policy/b", "policy/c"]
    assert torch.equal(initial["policy/b"], torch.ones(1, 2))
    pipe = ExportedPipeline(bundle, "three_states")
    a, b, c = torch.zeros(1, 2), torch.ones(1, 2), torch.full((1, 1), 2.0)
    for _ in range(10):
        obs = torch.ones(1, 2)
        a = a + obs
        b = b * 0.5 + a
        c = c + 1.0
        got = pipe.step({"policy/obs": obs})
        assert torch.allclose(got["policy/action"], a + b * c)


def test_state_loop_traces_once_and_caches_samples(tmp_path):
    leapp.start("state_loop", save_path=str(tmp_path), max_cached_io=3)
    last = torch.zeros(1, 2)
    eager = []
    for step in range(6):
        obs = annotate.input_tensors("policy", {"obs": torch.full((1, 2), float(step))})
        prev = annotate.state_tensors("policy", {"last_action": last})
        action = torch.tanh(obs + 0.5 * prev)
        eager.append(action.clone())
        last = annotate.update_state("policy", {"last_action": action})
        assert last is action
        annotate.output_tensors("policy", {"action": action}, export_with="jit")
    policy = node("policy")
    assert policy.node_index >= 0 and not policy.is_tracing
    outputs = {p.name: p for p in policy.outputs}
    # first trace + max_cached_io - 1 re-entry samples
    assert len(outputs["action"].samples) == 2
    assert torch.equal(outputs["action"].samples[0], eager[1])
    assert torch.equal(outputs["last_action"].samples[1], eager[2])
    state_in = [p for p in policy.inputs if p.name == "last_action"][0]
    assert torch.equal(state_in.samples[0], eager[0])
    compile_quiet()
    doc = load_yaml(_bundle(tmp_path, "state_loop"), "state_loop")
    assert doc["pipeline"]["feedback_flow"] == {"policy/last_action": ["policy/last_action"]}


def test_duplicate_state_and_module_declarations(tmp_path):
    leapp.start("duplicates", save_path=str(tmp_path))
    obs = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    h = annotate.state_tensors("policy", {"h": torch.zeros(1, 3)})
    again = annotate.state_tensors("policy", {"h": torch.full((1, 3), 9.0)})
    assert torch.equal(again, torch.zeros(1, 3))  # the declared state, not the new tensor
    model = sc.PartialState()
    annotate.module("policy", model)
    annotate.module("policy", model)  # tracked once
    h2 = again + obs + model(obs)
    annotate.update_state("policy", {"h": h2})
    annotate.output_tensors("policy", {"y": h2 * 2.0}, export_with="jit")
    compile_quiet()
    doc = load_yaml(_bundle(tmp_path, "duplicates"), "duplicates")
    assert [p["name"] for p in doc["models"]["policy"]["inputs"]] == [
        "obs", "h", "running_mean", "step_count"]
    assert sorted(doc["pipeline"]["feedback_flow"]) == [
        "policy/h", "policy/running_mean", "policy/step_count"]
    assert h is not None


def test_state_errors(tmp_path):
    leapp.start("errors", save_path=str(tmp_path))
    with pytest.raises(Exception, match="input_tensors"):
        annotate.state_tensors("nowhere", {"h": torch.zeros(1)})
    obs = annotate.input_tensors("policy", {"obs": torch.ones(2)})
    h = annotate.state_tensors("policy", {"h": torch.zeros(2)})
    with pytest.raises(TypeError, match="does not support nested state structures"):
        annotate.state_tensors("policy", {"nested": {"a": torch.zeros(2)}})
    with pytest.raises(TypeError, match="does not support nested state structures"):
        annotate.update_state("policy", {"h": [h + obs]})
    with pytest.raises(Exception, match="not registered as a state"):
        annotate.update_state("policy", {"unknown": h + obs})
    with pytest.raises(Exception, match=r"shape \[3\].*expected shape \[2\]"):
        annotate.update_state("policy", {"h": torch.cat([h, obs[:1]])})
    with pytest.raises(Exception, match="dtype int64.*dtype float32"):
        annotate.update_state("policy", {"h": (h + obs).long()})
    with pytest.raises(Exception, match="non-traced"):
        annotate.update_state("policy", {"h": torch.zeros(2)})


def test_nested_state_rejected_without_session():
    with pytest.raises(TypeError, match="does not support nested state structures"):
        annotate.state_tensors("policy", {"h": {"x": torch.zeros(1)}})
    with pytest.raises(TypeError, match="does not support nested state structures"):
        annotate.update_state("policy", {"h": (torch.zeros(1),)})


# ---- register_buffer ------------------------------------------------------------------

def test_register_buffer_in_place_write_is_recorded(tmp_path):
    sc.register_buffer(str(tmp_path))
    bundle = _bundle(tmp_path, "register_buffer")
    doc = load_yaml(bundle, "register_buffer")
    assert [p["name"] for p in doc["models"]["scale"]["inputs"]] == ["x"]
    assert doc["pipeline"]["feedback_flow"] == {}
    model = torch.jit.load(os.path.join(bundle, "scale.pt"))
    # the write of the input into the buffer is part of the model, not a baked value
    x = torch.tensor([4.0, -1.0, 0.5])
    assert torch.equal(model(x), x * 100.0)


def test_register_buffer_forms_and_partial_write(tmp_path):
    leapp.start("buffers", save_path=str(tmp_path))
    x = annotate.input_tensors("n", {"x": torch.tensor([1.0, 2.0])})
    single = annotate.register_buffer("n", torch.zeros(4))
    pair = annotate.register_buffer("n", [torch.ones(2), torch.full((2,), 3.0)])
    assert isinstance(single, torch.Tensor) and len(pair) == 2
    single[1:3] = x          # a partial in-place write keeps the rest of the buffer
    y = single.sum() + pair[0] * pair[1]
    with pytest.raises(Exception, match="raw tensors"):
        annotate.register_buffer("n", {"bad": x})
    annotate.output_tensors("n", {"y": y}, export_with="jit")
    compile_quiet()
    model = torch.jit.load(os.path.join(_bundle(tmp_path, "buffers"), "n.pt"))
    assert torch.equal(model(torch.tensor([5.0, 6.0])), torch.full((2,), 11.0 + 3.0))


# ---- annotate.module -----------------------------------------------------------------

def _step_module(bundle, graph, model, obs_seq, state_names):
    """Exported pipeline vs eager model over obs_seq; model starts from its initial state."""
    pipe = ExportedPipeline(bundle, graph)
    for obs in obs_seq:
        with torch.no_grad():
            expected = model(obs)
        got = pipe.step({"policy/obs": obs})
        assert torch.allclose(got["policy/action"], expected, atol=1e-6)
        for name in state_names:
            assert torch.allclose(got[f"policy/{name}"], getattr(model, name), atol=1e-6)


def test_gru_module_hidden_state_is_feedback(tmp_path):
    sc.gru_module(str(tmp_path))
    bundle = _bundle(tmp_path, "gru_module")
    doc = load_yaml(bundle, "gru_module")
    assert doc["pipeline"]["feedback_flow"] == {"policy/h": ["policy/h"]}
    assert torch.equal(load_initial(bundle, "gru_module")["policy/h"], torch.zeros(1, 1, 6))
    torch.manual_seed(0)
    model = sc.GRUCell().eval()
    torch.manual_seed(1)
    _step_module(bundle, "gru_module", model, [torch.randn(1, 4) for _ in range(10)], ["h"])


def test_lstm_module_two_states_over_reentry(tmp_path):
    sc.lstm_module(str(tmp_path))
    bundle = _bundle(tmp_path, "lstm_module")
    doc = load_yaml(bundle, "lstm_module")
    assert doc["pipeline"]["feedback_flow"] == {"policy/c": ["policy/c"],
                                                "policy/h": ["policy/h"]}
    initial = load_initial(bundle, "lstm_module")
    assert sorted(initial) == ["policy/c", "policy/h"]
    torch.manual_seed(0)
    model = sc.LSTMCell().eval()
    torch.manual_seed(1)
    _step_module(bundle, "lstm_module", model, [torch.randn(1, 4) for _ in range(10)],
                 ["h", "c"])


def test_module_reentry_caches_buffer_state_samples(tmp_path):
    torch.manual_seed(0)
    model = sc.LSTMCell().eval()
    leapp.start("lstm_reentry", save_path=str(tmp_path), max_cached_io=4)
    hs = []
    for _ in range(5):
        hs.append(model.h.clone())
        obs = annotate.input_tensors("policy", {"obs": torch.randn(1, 4)})
        annotate.module("policy", model)
        annotate.output_tensors("policy", {"action": model(obs)}, export_with="jit")
        assert type(model.h) is torch.Tensor and _core.carrier_of(model.h) is None
    policy = node("policy")
    h_in = [p for p in policy.inputs if p.name == "h"][0]
    h_out = [p for p in policy.outputs if p.name == "h"][0]
    assert len(h_in.samples) == 3 and len(h_out.samples) == 3
    for i in range(3):
        assert torch.equal(h_in.samples[i], hs[i + 1])
        assert torch.equal(h_out.samples[i], hs[i + 2])
    compile_quiet()


def test_partial_mutation_feedback_and_baked_constant(tmp_path):
    sc.partial_module(str(tmp_path))
    bundle = _bundle(tmp_path, "partial_module")
    doc = load_yaml(bundle, "partial_module")
    assert doc["pipeline"]["feedback_flow"] == {
        "policy/running_mean": ["policy/running_mean"],
        "policy/step_count": ["policy/step_count"]}
    assert [p["name"] for p in doc["models"]["policy"]["inputs"]] == [
        "obs", "running_mean", "step_count"]
    dtypes = {p["name"]: p["dtype"] for p in doc["models"]["policy"]["inputs"]}
    assert dtypes["step_count"] == "int64"
    assert sorted(load_initial(bundle, "partial_module")) == ["policy/running_mean",
                                                              "policy/step_count"]
    model = sc.PartialState()
    _step_module(bundle, "partial_module", model,
                 [torch.tensor([[1.0, 2.0, 3.0]]) * k for k in range(10)],
                 ["running_mean", "step_count"])


def test_buffer_names_filter(tmp_path):
    sc.filtered_module(str(tmp_path))
    doc = load_yaml(_bundle(tmp_path, "filtered_module"), "filtered_module")
    assert doc["pipeline"]["feedback_flow"] == {"policy/running_mean": ["policy/running_mean"]}
    leapp.start("unknown_names", save_path=str(tmp_path))
    model = sc.PartialState()
    obs = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    annotate.module("policy", model, buffer_names=["does_not_exist"])
    annotate.output_tensors("policy", {"action": model(obs)}, export_with="jit")
    compile_quiet()
    doc = load_yaml(_bundle(tmp_path, "unknown_names"), "unknown_names")
    assert doc["pipeline"]["feedback_flow"] == {}


def test_nested_submodule_buffers(tmp_path):
    sc.nested_module(str(tmp_path))
    bundle = _bundle(tmp_path, "nested_module")
    doc = load_yaml(bundle, "nested_module")
    assert doc["pipeline"]["feedback_flow"] == {"policy/calls": ["policy/calls"],
                                                "policy/inner_acc": ["policy/inner_acc"]}
    model = sc.Outer()
    pipe = ExportedPipeline(bundle, "nested_module")
    for k in range(10):
        obs = torch.tensor([[1.0, 2.0, 3.0]]) * k
        expected = model(obs)
        got = pipe.step({"policy/obs": obs})
        assert torch.allclose(got["policy/action"], expected)
        assert torch.allclose(got["policy/inner_acc"], model.inner.acc)


class _NoMutation(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.tensor([[1.0, -1.0]]))

    def forward(self, x):
        return x + self.offset


def test_read_only_buffer_baked_and_module_without_buffers(tmp_path):
    leapp.start("baked", save_path=str(tmp_path))
    model, plain_model = _NoMutation(), nn.Linear(2, 2)
    x = annotate.input_tensors("policy", {"obs": torch.zeros(1, 2)})
    annotate.module("policy", model)
    annotate.module("policy", plain_model)
    y = plain_model(model(x))
    annotate.output_tensors("policy", {"action": y}, export_with="jit")
    compile_quiet()
    bundle = _bundle(tmp_path, "baked")
    doc = load_yaml(bundle, "baked")
    assert doc["pipeline"]["feedback_flow"] == {}
    assert [p["name"] for p in doc["models"]["policy"]["inputs"]] == ["obs"]
    exported = torch.jit.load(os.path.join(bundle, "policy.pt"))
    obs = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(exported(obs), plain_model(model(obs)))


class _CopyInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(1, 2))

    def forward(self, x):
        y = x + self.h
        self.h.copy_(y)
        return y * 2.0


def test_copy_into_buffer_is_a_state_update(tmp_path):
    """An in-place write (copy_) into a tracked buffer updates the state, as a
    reassignment does (tests/test_mutations.py covers the other in-place forms)."""
    model = _CopyInPlace()
    leapp.start("copy_inplace", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 2)})
    annotate.module("policy", model)
    annotate.output_tensors("policy", {"action": model(x)}, export_with="jit")
    compile_quiet()
    doc = load_yaml(_bundle(tmp_path, "copy_inplace"), "copy_inplace")
    assert doc["pipeline"]["feedback_flow"] == {"policy/h": ["policy/h"]}
    assert [p["name"] for p in doc["models"]["policy"]["inputs"]] == ["obs", "h"]
    # eager semantics kept: the buffer holds the copied value, as a plain tensor
    assert type(model.h) is torch.Tensor and torch.equal(model.h, torch.ones(1, 2))
    # the exported model reads the state and returns its update
    exported = torch.jit.load(os.path.join(_bundle(tmp_path, "copy_inplace"), "policy.pt"))
    action, h = exported(torch.full((1, 2), 5.0), torch.ones(1, 2))
    assert torch.equal(action, torch.full((1, 2), 12.0)) and torch.equal(h, torch.full((1, 2), 6.0))


def _assert_real_buffers(model):
    for name, buf in model.named_buffers():
        assert type(buf) is torch.Tensor, name
        assert _core.carrier_of(buf) is None, name


def test_buffers_restored_after_output_tensors(tmp_path):
    model = sc.PartialState()
    leapp.start("restored", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    annotate.module("policy", model)
    y = model(x)
    annotate.output_tensors("policy", {"action": y}, export_with="jit")
    _assert_real_buffers(model)
    assert torch.allclose(model.running_mean, torch.full((1, 3), 0.1))
    assert int(model.step_count) == 1
    leapp.stop()
    _assert_real_buffers(model)
    # the model keeps working eagerly with its updated state
    model(torch.ones(1, 3))
    assert int(model.step_count) == 2


def test_buffers_restored_by_stop_without_output_tensors(tmp_path):
    model = sc.Outer()
    leapp.start("no_output", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    annotate.module("policy", model)
    assert type(model.inner.acc) is not torch.Tensor  # traced while the node runs
    model(x)
    leapp.stop()
    _assert_real_buffers(model)
    assert torch.allclose(model.inner.acc, torch.full((1, 3), 0.5))


class _Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(1, 2))

    def forward(self, x):
        self.h = self.h + x
        raise RuntimeError("user code failed")


def test_buffers_restored_after_user_code_raised(tmp_path):
    model = _Raises()
    leapp.start("raised", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 2)})
    annotate.module("policy", model)
    with pytest.raises(RuntimeError, match="user code failed"):
        model(x)
    leapp.stop()
    _assert_real_buffers(model)
    # a new session works, and traces the module again from its current buffers
    sc.counter(str(tmp_path))
    assert load_yaml(_bundle(tmp_path, "counter"), "counter")["pipeline"]["feedback_flow"]


def test_module_before_input_tensors_raises(tmp_path):
    leapp.start("module_first", save_path=str(tmp_path))
    with pytest.raises(RuntimeError, match=re.escape(
            "module() called for node 'policy' but node not found. Call "
            "annotate.input_tensors('policy', ...) first to open the node.")):
        annotate.module("policy", sc.PartialState())


# ---- no session: every API passes its values through -----------------------------------

def test_no_session_passthrough_returns_same_objects():
    assert not _core.is_tracing()
    a, b = torch.ones(2), torch.zeros(3)
    assert annotate.input_tensors("n", {"a": a}) is a
    got = annotate.input_tensors("n", {"a": a, "b": b})
    assert got[0] is a and got[1] is b
    assert annotate.output_tensors("n", {"a": a}, export_with="jit") is a
    assert annotate.state_tensors("n", {"a": a}) is a
    got = annotate.state_tensors("n", {"a": a, "b": b})
    assert got[0] is a and got[1] is b
    assert annotate.update_state("n", {"b": b}) is b
    assert annotate.register_buffer("n", {"a": a}) is a
    assert annotate.register_buffer("n", a) is a
    got = annotate.register_buffer("n", [a, b])
    assert got[0] is a and got[1] is b
    assert annotate.mirror_leapp_tags(a, b) is b
    model = sc.PartialState()
    before = dict(model.named_buffers())
    assert annotate.module("n", model) is None
    assert all(before[k] is v for k, v in model.named_buffers())
    assert type(a) is torch.Tensor and type(b) is torch.Tensor
