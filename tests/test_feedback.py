"""Inferred cross-node feedback, mirror_leapp_tags, re-entry checks and the seed examples."""
from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys

import pytest
import torch

import leapp
from leapp import _core, annotate
from state_helpers import (REPO, UPSTREAM_PYTHON, ExportedPipeline, compile_quiet,  # noqa: F401
                           leapp_session, load_initial, load_yaml, node)
import state_scenarios as sc

HAS_ONNX_BACKEND = os.path.exists(os.path.join(REPO, "leapp", "backends", "onnx.py"))


def _flows(tmp_path, graph):
    pipeline = load_yaml(os.path.join(str(tmp_path), graph), graph)["pipeline"]
    return pipeline["data_flow"], pipeline["feedback_flow"]


# ---- topologies --------------------------------------------------------------------------

TOPOLOGIES = {
    "two_node_loop": ({"a/mixed": ["b/mixed"]}, {"b/memory_out": ["a/memory"]}),
    "three_node_loop": ({"n1/o1": ["n2/o1"], "n2/o2": ["n3/o2"]}, {"n3/o3": ["n1/prev"]}),
    "diamond_loop": ({"left/l": ["join/l"], "right/r": ["join/r"],
                      "src/s": ["left/s", "right/s"]}, {"join/j": ["src/prev"]}),
    "two_loops": ({"p1/y1": ["q1/y1"], "p2/y2": ["q2/y2"]},
                  {"q1/m1": ["p1/m"], "q2/m2": ["p2/m"]}),
    "interleaved_forward": ({"node_b/b_out": ["node_a/from_b"]}, {}),
    "self_loop": ({}, {"a/m_out": ["a/m"]}),
    "clone_loop": ({"a/y": ["b/y"]}, {"b/m_out": ["a/m"]}),
    "state_and_inferred": ({"a/y": ["b/y"]}, {"a/h": ["a/h"], "b/ext_out": ["a/ext"]}),
}


@pytest.mark.parametrize("graph", sorted(TOPOLOGIES))
def test_feedback_topologies(tmp_path, graph):
    getattr(sc, graph)(str(tmp_path))
    data_flow, feedback_flow = _flows(tmp_path, graph)
    assert (data_flow, feedback_flow) == TOPOLOGIES[graph]
    initial = load_initial(os.path.join(str(tmp_path), graph), graph)
    targets = sorted(t for ts in feedback_flow.values() for t in ts)
    if targets:
        assert sorted(initial) == targets
    else:
        assert initial is None


def test_inferred_feedback_needs_a_second_pass(tmp_path):
    leapp.start("one_pass", save_path=str(tmp_path))
    obs, mem = annotate.input_tensors("a", {"obs": torch.ones(1, 2), "memory": torch.zeros(1, 2)})
    mixed = annotate.output_tensors("a", {"mixed": obs + mem}, export_with="jit")
    x = annotate.input_tensors("b", {"mixed": mixed})
    annotate.output_tensors("b", {"memory_out": x * 2.0}, export_with="jit")
    compile_quiet()
    data_flow, feedback_flow = _flows(tmp_path, "one_pass")
    assert data_flow == {"a/mixed": ["b/mixed"]} and feedback_flow == {}
    pipeline = load_yaml(os.path.join(str(tmp_path), "one_pass"), "one_pass")["pipeline"]
    assert pipeline["inputs"] == {"a": ["obs", "memory"]}
    assert pipeline["outputs"] == {"b": ["memory_out"]}


def test_feedback_initial_values_are_first_trace_values(tmp_path):
    leapp.start("first_values", save_path=str(tmp_path))
    memory = torch.tensor([[0.25, -0.5]])
    for step in range(3):
        obs, mem = annotate.input_tensors("a", {"obs": torch.ones(1, 2) * step, "memory": memory})
        mixed = annotate.output_tensors("a", {"mixed": obs + mem}, export_with="jit")
        x = annotate.input_tensors("b", {"mixed": mixed})
        memory = annotate.output_tensors("b", {"out": x * 2.0}, export_with="jit")
    compile_quiet()
    initial = load_initial(os.path.join(str(tmp_path), "first_values"), "first_values")
    assert list(initial) == ["a/memory"]
    assert torch.equal(initial["a/memory"], torch.tensor([[0.25, -0.5]]))


def test_two_node_loop_exported_steps_like_eager(tmp_path):
    sc.two_node_loop(str(tmp_path))
    pipe = ExportedPipeline(os.path.join(str(tmp_path), "two_node_loop"), "two_node_loop")
    memory = torch.zeros(1, 2)
    for step in range(10):
        obs = torch.full((1, 2), step + 1.0)
        mixed = obs + 0.5 * memory
        memory = torch.tanh(mixed)
        got = pipe.step({"a/obs": obs})
        assert torch.allclose(got["a/mixed"], mixed) and torch.allclose(got["b/memory_out"],
                                                                          memory)


# ---- mirror_leapp_tags -----------------------------------------------------------------

def test_mirror_after_copy_into_preallocated_buffer(tmp_path):
    sc.mirror_copy(str(tmp_path))
    data_flow, feedback_flow = _flows(tmp_path, "mirror_copy")
    assert data_flow == {"producer/y": ["consumer/z"]} and feedback_flow == {}


class DataProcessor:
    def __init__(self):
        self._buffer = torch.zeros(10)

    @annotate.method(export_with="jit")
    def process(self, input_data: torch.Tensor):
        self._buffer[:] = input_data
        annotate.mirror_leapp_tags(input_data, self._buffer)
        return self._buffer * 2.0


def test_mirror_inside_class_held_buffer(tmp_path):
    leapp.start("class_held", save_path=str(tmp_path))
    processor = DataProcessor()
    for step in range(2):
        x = annotate.input_tensors("source", {"x": torch.arange(10.0) + step})
        data = annotate.output_tensors("source", {"data": x - 1.0}, export_with="jit")
        result = processor.process(data)
        assert torch.equal(result, (torch.arange(10.0) + step - 1.0) * 2.0)
    compile_quiet()
    data_flow, _ = _flows(tmp_path, "class_held")
    assert data_flow == {"source/data": ["process/input_data"]}
    bundle = os.path.join(str(tmp_path), "class_held")
    model = torch.jit.load(os.path.join(bundle, "process.pt"))
    assert torch.equal(model(torch.ones(10)), torch.full((10,), 2.0))


def test_mirror_two_buffers_give_four_edges(tmp_path):
    leapp.start("two_buffers", save_path=str(tmp_path))
    buf_a, buf_b = torch.zeros(3), torch.zeros(3)
    x = annotate.input_tensors("prod", {"x": torch.tensor([1.0, 2.0, 3.0])})
    a, b = annotate.output_tensors("prod", {"a": x * 2.0, "b": x + 1.0}, export_with="jit")
    buf_a[:] = a
    buf_b.copy_(b)
    assert annotate.mirror_leapp_tags([a, b], [buf_a, buf_b]) is not None
    for consumer in ("c1", "c2"):
        p, q = annotate.input_tensors(consumer, {"p": buf_a, "q": buf_b})
        annotate.output_tensors(consumer, {"r": p * q}, export_with="jit")
    compile_quiet()
    data_flow, _ = _flows(tmp_path, "two_buffers")
    assert data_flow == {"prod/a": ["c1/p", "c2/p"], "prod/b": ["c1/q", "c2/q"]}
    assert sum(len(v) for v in data_flow.values()) == 4


def test_mirror_chain_of_four_nodes(tmp_path):
    leapp.start("chain", save_path=str(tmp_path))
    buffers = [torch.zeros(2) for _ in range(3)]
    value = torch.tensor([1.0, 2.0])
    for i in range(4):
        name = f"n{i}"
        x = annotate.input_tensors(name, {"x": value})
        out = annotate.output_tensors(name, {"y": x * 2.0}, export_with="jit")
        if i < 3:
            buffers[i][:] = out
            value = annotate.mirror_leapp_tags({"y": out}, {"y": buffers[i]})["y"]
            assert value is buffers[i]
    compile_quiet()
    data_flow, feedback_flow = _flows(tmp_path, "chain")
    assert data_flow == {"n0/y": ["n1/x"], "n1/y": ["n2/x"], "n2/y": ["n3/x"]}
    assert feedback_flow == {}


def test_full_overwrite_keeps_provenance_without_mirror(tmp_path):
    sc.overwrite_copy(str(tmp_path))
    data_flow, feedback_flow = _flows(tmp_path, "overwrite_copy")
    # dst[:] = y, dst.copy_(y) and dst[...] = y adopt y's port (upstream does the
    # same); a partial write or a dtype-changing copy gives a new, unwired value
    assert data_flow == {"a/y": ["b_full/z", "b_copied/z", "b_ellipsis/z"]}
    assert feedback_flow == {}


def test_copy_without_mirror_is_not_wired(tmp_path):
    leapp.start("no_mirror", save_path=str(tmp_path))
    buf = torch.zeros(2)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = annotate.output_tensors("a", {"y": x * 3.0}, export_with="jit")
    buf.mul_(0.0).add_(y)  # an arithmetic copy: provenance is not guessed
    z = annotate.input_tensors("b", {"z": buf})
    annotate.output_tensors("b", {"w": z + 1.0}, export_with="jit")
    compile_quiet()
    assert _flows(tmp_path, "no_mirror") == ({}, {})


def test_mirror_errors(tmp_path, caplog):
    leapp.start("mirror_errors", save_path=str(tmp_path))
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = annotate.output_tensors("a", {"y": x * 3.0}, export_with="jit")
    with pytest.raises(Exception, match="source and target do not match"):
        annotate.mirror_leapp_tags(y, torch.zeros(2))
    with pytest.raises(Exception, match="source and target do not match"):
        annotate.mirror_leapp_tags(y, torch.full((3,), 3.0))
    with pytest.raises(Exception, match="source and target do not match"):
        annotate.mirror_leapp_tags([y, y], [y.clone(), torch.zeros(2)])
    with pytest.raises(Exception, match="source and target do not match"):
        annotate.mirror_leapp_tags({"a": y}, {"b": y.clone()})
    with pytest.raises(Exception, match="unexpected error mirroring LEAPP tags"):
        annotate.mirror_leapp_tags([y, y], [y.clone()])
    leapp.stop()  # the error is in log.txt (FATAL), not printed beside the exception
    with open(os.path.join(tmp_path, "mirror_errors", "log.txt"), encoding="utf-8") as handle:
        assert "[FATAL]: unexpected error mirroring LEAPP tags" in handle.read()


# ---- re-entry -------------------------------------------------------------------------

def _pass(shape=(1, 2), dtype=torch.float32, out_shape=None, extra=None, semantics=None):
    inputs = {"obs": torch.ones(*shape, dtype=dtype)}
    inputs.update(extra or {})
    if semantics is not None:
        inputs = [leapp.TensorSemantics(name="obs", ref=inputs["obs"], kind=semantics)]
    obs = annotate.input_tensors("policy", inputs)
    obs = obs[0] if isinstance(obs, tuple) else obs
    y = obs * 2
    if out_shape is not None:
        y = torch.cat([y, y], dim=-1)
    return annotate.output_tensors("policy", {"action": y}, export_with="jit")


@pytest.mark.parametrize("second, expected", [
    (dict(shape=(1, 3)), [r"obs", r"shape: \[1, 2\]", r"shape: \[1, 3\]"]),
    (dict(dtype=torch.float64), [r"obs", r"dtype: float32", r"dtype: float64"]),
    (dict(out_shape=True), [r"action", r"shape: \[1, 2\]", r"shape: \[1, 4\]"]),
    (dict(extra={"other": torch.ones(1)}), [r"other", r"available i/o names"]),
    (dict(semantics="custom/kind"), [r"obs", r"kind: other/kind", r"kind: custom/kind"]),
])
def test_reentry_mismatch_errors(tmp_path, second, expected):
    leapp.start("reentry", save_path=str(tmp_path))
    first = dict(semantics="other/kind") if "semantics" in second else {}
    traced = _pass(**first)
    assert isinstance(traced, torch.Tensor)
    again = _pass(**first)  # a matching pass is fine and returns plain tensors
    assert type(again) is torch.Tensor and _core.carrier_of(again) is None
    with pytest.raises(Exception) as info:
        _pass(**second)
    text = str(info.value)
    assert "Validation error when reentering node" in text and "'policy'" in text
    for pattern in expected:
        assert pytest.importorskip("re").search(pattern, text), (pattern, text)


def test_reentry_caches_at_most_max_cached_io_samples(tmp_path):
    leapp.start("cache", save_path=str(tmp_path), max_cached_io=3)
    for step in range(8):
        x = annotate.input_tensors("n", {"x": torch.full((2,), float(step))})
        annotate.output_tensors("n", {"y": x + 1.0}, export_with="jit")
    n = node("n")
    assert torch.equal(n.inputs[0].value, torch.zeros(2))
    assert [float(s[0]) for s in n.inputs[0].samples] == [1.0, 2.0]
    assert [float(s[0]) for s in n.outputs[0].samples] == [2.0, 3.0]
    compile_quiet()


def _rss_bytes():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_flat_over_many_reentry_passes(tmp_path):
    leapp.start("memory", save_path=str(tmp_path), max_cached_io=2)
    state = torch.zeros(1, 8)

    def one_pass(state):
        obs, mem = annotate.input_tensors("a", {"obs": torch.ones(1, 8), "mem": state})
        mixed = annotate.output_tensors("a", {"mixed": torch.tanh(obs + mem)}, export_with="jit")
        x = annotate.input_tensors("b", {"mixed": mixed})
        return annotate.output_tensors("b", {"out": x * 0.5}, export_with="jit")

    for _ in range(200):
        state = one_pass(state)
    gc.collect()
    before = _rss_bytes()
    for _ in range(3000):
        state = one_pass(state)
    gc.collect()
    grown = _rss_bytes() - before
    assert grown < 16 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 3000 passes"
    assert all(len(p.samples) <= 1 for n in _core.nodes().values()
               for p in list(n.inputs) + list(n.outputs))


# ---- the seed examples ------------------------------------------------------------------

SEED_FEEDBACK_FLOW = """\
  feedback_flow:
    feedback_update/policy_memory_out: [policy_step/policy_memory_in, feedback_update/policy_memory_prev]
"""


def _run_example(script, out_dir, python=sys.executable, backend=None):
    env = dict(os.environ, PYTHONPATH=REPO)
    if backend is not None:
        env["LEAPP_EXAMPLE_BACKEND"] = backend
    return subprocess.run([python, os.path.join(REPO, "examples", script), str(out_dir)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_feedback_example(tmp_path):
    proc = _run_example("feedback_example.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bundle = os.path.join(str(tmp_path), "sample_feedback_graph")
    assert f"Bundle written to {bundle}" in proc.stdout
    for name in ("policy_step.pt", "feedback_update.pt", "sample_feedback_graph.yaml",
                 "sample_feedback_graph_initial_values.safetensors"):
        assert os.path.exists(os.path.join(bundle, name)), name
    with open(os.path.join(bundle, "sample_feedback_graph.yaml"), encoding="utf-8") as handle:
        text = handle.read()
    assert SEED_FEEDBACK_FLOW in text
    pipeline = load_yaml(bundle, "sample_feedback_graph")["pipeline"]
    assert pipeline["feedback_flow"] == {"feedback_update/policy_memory_out": [
        "policy_step/policy_memory_in", "feedback_update/policy_memory_prev"]}
    assert pipeline["data_flow"] == {"policy_step/policy_context": ["feedback_update/policy_context"]}
    initial = load_initial(bundle, "sample_feedback_graph")
    assert sorted(initial) == ["feedback_update/policy_memory_prev", "policy_step/policy_memory_in"]
    assert all(torch.equal(v, torch.tensor([0.0])) for v in initial.values())
    # the exported pipeline steps like the eager functions
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import feedback_example as ex
    finally:
        sys.path.pop(0)
    pipe = ExportedPipeline(bundle, "sample_feedback_graph")
    memory = torch.tensor([0.0])
    for step in range(10):
        obs = torch.tensor([0.3 * step - 1.0])
        context = ex.mix_with_feedback(obs, memory)
        action = torch.clamp(context * 2.0, min=-1.0, max=1.0)
        memory = ex.blend_feedback(context, memory)
        got = pipe.step({"policy_step/observation_scalar": obs})
        assert torch.allclose(got["policy_step/control_action"], action)
        assert torch.allclose(got["feedback_update/policy_memory_out"], memory)


def test_stateful_gru_example(tmp_path):
    backend = "onnx-torchscript" if HAS_ONNX_BACKEND else "jit"
    proc = _run_example("stateful_gru_export.py", tmp_path, backend=backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bundle = os.path.join(str(tmp_path), "stateful_gru")
    assert f"Bundle written to {bundle}" in proc.stdout
    doc = load_yaml(bundle, "stateful_gru")
    suffix = ("_in", "_out") if backend != "jit" else ("", "")
    assert doc["pipeline"]["feedback_flow"] == {
        f"policy/h_state{suffix[1]}": [f"policy/h_state{suffix[0]}"]}
    assert doc["pipeline"]["inputs"] == {"policy": ["obs"]}
    initial = load_initial(bundle, "stateful_gru")
    assert list(initial) == [f"policy/h_state{suffix[0]}"]
    assert torch.equal(initial[f"policy/h_state{suffix[0]}"], torch.zeros(1, 1, 32))
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import stateful_gru_export as ex
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    model = ex.GRUPolicy().eval()
    pipe = ExportedPipeline(bundle, "stateful_gru")
    torch.manual_seed(3)
    for _ in range(10):
        obs = torch.randn(1, 16)
        with torch.no_grad():
            action = model(obs)
        got = pipe.step({"policy/obs": obs})
        assert torch.allclose(got["policy/action"], action, atol=1e-5)
        assert torch.allclose(got[f"policy/h_state{suffix[1]}"], model.h_state, atol=1e-5)


# ---- the same pipelines under upstream leapp -----------------------------------------------

COMPARED = [f.__name__ for f in sc.SCENARIOS] + ["sample_feedback_graph", "stateful_gru"]


@pytest.fixture(scope="module")
def upstream_bundles(tmp_path_factory):
    if not os.path.exists(UPSTREAM_PYTHON):
        pytest.skip("upstream leapp venv not installed")
    out = tmp_path_factory.mktemp("upstream")
    proc = subprocess.run([UPSTREAM_PYTHON, os.path.join(REPO, "tests", "state_scenarios.py"),
                           str(out)], capture_output=True, text=True, timeout=600,
                          cwd=str(out), env={k: v for k, v in os.environ.items()
                                             if k != "PYTHONPATH"})
    return str(out), proc


@pytest.fixture(scope="module")
def our_bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("ours")
    import _pytest.monkeypatch
    patch = _pytest.monkeypatch.MonkeyPatch()
    from state_helpers import _YamlFallback
    import leapp.compiling.compiler
    patch.setattr(leapp.compiling.compiler, "_core", _YamlFallback(_core))
    try:
        failed = sc.main(str(out), [])
    finally:
        patch.undo()
    assert failed == []
    return str(out)


def _without_hashes(doc):
    for entry in doc["models"].values():
        entry["parameters"].pop("md5sum", None)
        entry["parameters"].pop("sha256sum", None)
    return doc


@pytest.mark.parametrize("graph", COMPARED)
def test_yaml_matches_upstream(upstream_bundles, our_bundles, graph):
    up_dir, proc = upstream_bundles
    up_path = os.path.join(up_dir, graph)
    if not os.path.exists(os.path.join(up_path, f"{graph}.yaml")):
        pytest.fail(f"upstream wrote no YAML for {graph}:\n{proc.stderr[-2000:]}")
    ours = _without_hashes(load_yaml(os.path.join(our_bundles, graph), graph))
    theirs = _without_hashes(load_yaml(up_path, graph))
    assert list(ours) == list(theirs)
    for section in theirs:
        if section == "system information":
            continue
        assert list(ours[section]) == list(theirs[section]), section
        for key in theirs[section]:
            assert ours[section][key] == theirs[section][key], (section, key)
    up_initial = load_initial(up_path, graph)
    our_initial = load_initial(os.path.join(our_bundles, graph), graph)
    assert (up_initial is None) == (our_initial is None)
    if up_initial is not None:
        assert sorted(up_initial) == sorted(our_initial)
        for key in up_initial:
            assert torch.equal(up_initial[key], our_initial[key]), key
