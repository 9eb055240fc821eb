"""leapp.fuse: the whole pipeline as one model (docs/fuse.md).

Every compat pipeline (bench/compat_pipelines/, each backend mix the project
checks against upstream) is compiled once, fused to ONNX and to TorchScript,
and the fused model is run with onnxruntime / torch.jit next to
InferenceManager on the same bundle, state carried across the steps.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import runpy
import shutil
import subprocess
import sys

import onnx
import onnxruntime as ort
import pytest
import torch
import yaml

import leapp
from leapp import annotate
from leapp.serving.fusion import STATE_SUFFIX, FusedModel, FuseError, read_metadata, validate
from leapp.running.inference_manager import InferenceManager
from support import ROOT

PIPELINES_DIR = os.path.join(ROOT, "bench", "compat_pipelines")
PIPELINES = sorted(name[:-3] for name in os.listdir(PIPELINES_DIR)
                   if name.endswith(".py") and not name.startswith("_"))
# nodes exported to ONNX only: no TorchScript fused model without a session
ONNX_ONLY = {"alias_writes": "mix", "chain_backends": "policy", "declared_state": "controller",
             "gru_module": "policy", "mixed_output_kinds": "filter",
             "numpy_round_trip": "policy"}
STEPS = 12


@contextlib.contextmanager
def _argv(args: list[str]):
    saved_argv, saved_path, threads = sys.argv, list(sys.path), torch.get_num_threads()
    sys.argv = args
    sys.path.insert(0, PIPELINES_DIR)
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """{pipeline: YAML path}: every compat pipeline compiled once, in this process."""
    root = str(tmp_path_factory.mktemp("fuse"))
    paths = {}
    for name in PIPELINES:
        script = os.path.join(PIPELINES_DIR, f"{name}.py")
        with _argv([script, root]):
            runpy.run_path(script, run_name="__main__")
        leapp._core.reset_nodes()
        paths[name] = os.path.join(root, name, f"{name}.yaml")
    return paths


def _copy(yaml_path: str, tmp_path) -> str:
    """A private copy of a bundle (tests that fuse write into it)."""
    target = tmp_path / "bundle"
    shutil.copytree(os.path.dirname(yaml_path), target)
    return str(target / os.path.basename(yaml_path))


def _inputs(manager: InferenceManager, step: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(1000 + step)
    return manager.get_mock_input()


def _run_side_by_side(fused: FusedModel, manager: InferenceManager) -> None:
    manager.reset()
    fused.reset()
    for step in range(STEPS):
        inputs = _inputs(manager, step)
        want = manager.run_policy({k: v.clone() for k, v in inputs.items()})
        got = fused.step(inputs)
        assert list(got) == manager.outputs
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5,
                                       msg=lambda m, key=key, step=step: f"{key} step {step}: {m}")
        for target in fused.state_inputs:
            node, port = target.split("/")
            torch.testing.assert_close(fused.state[target], manager.value_dict[node][port],
                                       rtol=1e-4, atol=1e-5)


def _check_interface(path: str, manager: InferenceManager) -> dict:
    """The convention: names, order, suffix, metadata."""
    meta = read_metadata(path)
    feedback = manager.feedback_inputs
    assert meta["format_version"] == 1
    assert meta["pipeline"] == os.path.basename(manager.model_path)[:-len(".yaml")]
    assert meta["leapp_version"] == leapp.__version__
    assert [p["name"] for p in meta["inputs"]] == manager.inputs
    assert [p.get("key", p["name"]) for p in meta["outputs"]] == manager.outputs
    assert [s["input"] for s in meta["state"]] == feedback
    assert [s["output"] for s in meta["state"]] == [f + STATE_SUFFIX for f in feedback]
    for entry in meta["inputs"] + meta["outputs"] + meta["state"]:
        node, port = (entry.get("key") or entry.get("name") or entry["input"]).split("/")
        item = manager.nodes[node]
        names, shapes = ((item.input_names, item.input_shapes) if "output" in entry
                         or entry in meta["inputs"] else (item.output_names, item.output_shapes))
        assert tuple(entry["shape"]) == shapes[names.index(port)]
    return meta


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_fuse_onnx_matches_inference_manager(pipeline, bundles, tmp_path):
    yaml_path = _copy(bundles[pipeline], tmp_path)
    path = leapp.fuse(yaml_path)
    assert path == os.path.join(os.path.dirname(yaml_path), f"{pipeline}_fused.onnx")
    manager = InferenceManager(yaml_path)
    meta = _check_interface(path, manager)
    model = onnx.load(path)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == \
        [p["name"] for p in meta["inputs"]] + [s["input"] for s in meta["state"]]
    assert [o.name for o in session.get_outputs()] == \
        [p["name"] for p in meta["outputs"]] + [s["output"] for s in meta["state"]]
    _run_side_by_side(FusedModel(path, providers=["CPUExecutionProvider"]), manager)
    # recorded in the YAML, which both readers still load
    with open(yaml_path) as handle:
        entry = yaml.safe_load(handle)["fused"]["onnx"]
    with open(path, "rb") as handle:
        assert entry == {"model_path": f"{pipeline}_fused.onnx", "format_version": 1,
                         "sha256sum": hashlib.sha256(handle.read()).hexdigest()}


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_fuse_torchscript(pipeline, bundles, tmp_path):
    yaml_path = _copy(bundles[pipeline], tmp_path)
    if pipeline in ONNX_ONLY:
        node = ONNX_ONLY[pipeline]
        before = sorted(os.listdir(os.path.dirname(yaml_path)))
        with pytest.raises(FuseError, match=rf"Node '{node}' exists only as an ONNX model.*"
                                            r"format='onnx'"):
            leapp.fuse(yaml_path, format="torchscript")
        assert sorted(os.listdir(os.path.dirname(yaml_path))) == before  # nothing written
        return
    path = leapp.fuse(yaml_path, format="torchscript")
    assert path.endswith(f"{pipeline}_fused.pt")
    manager = InferenceManager(yaml_path)
    _check_interface(path, manager)
    _run_side_by_side(FusedModel(path), manager)


def test_state_initial_values_travel_with_the_model(bundles, tmp_path):
    """inferred_feedback: three feedback targets, initial values from the safetensors."""
    from safetensors.torch import load_file

    yaml_path = _copy(bundles["inferred_feedback"], tmp_path)
    path = leapp.fuse(yaml_path)
    meta = read_metadata(path)
    initial = load_file(os.path.join(os.path.dirname(yaml_path),
                                     "inferred_feedback_initial_values.safetensors"))
    assert [s["input"] for s in meta["state"]] == [
        "policy_step/last_command", "policy_step/memory_in", "memory_update/memory_prev"]
    for state in meta["state"]:
        assert state["initial"]["encoding"] == "base64-le"
        raw = base64.b64decode(state["initial"]["data"])
        value = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(state["shape"])
        expected = initial.get(state["input"], torch.zeros(state["shape"]))
        assert torch.equal(value, expected)
    # the state really carries: feeding the initial state back every step differs
    fused = FusedModel(path)
    manager = InferenceManager(yaml_path)
    inputs = [_inputs(manager, s) for s in range(3)]
    carried = [fused.step(x) for x in inputs]
    stateless = []
    for x in inputs:
        fused.reset()
        stateless.append(fused.step(x))
    assert torch.equal(carried[0]["command/applied"], stateless[0]["command/applied"])
    assert not torch.equal(carried[2]["command/applied"], stateless[2]["command/applied"])


def test_validation_catches_a_model_that_differs(bundles, tmp_path):
    """Changing the bundle's initial values after fusing: validate() names the state."""
    from safetensors.torch import load_file, save_file

    yaml_path = _copy(bundles["declared_state"], tmp_path)
    path = leapp.fuse(yaml_path)
    values_path = os.path.join(os.path.dirname(yaml_path),
                               "declared_state_initial_values.safetensors")
    values = load_file(values_path)
    values = {k: v + 1.0 for k, v in values.items()} if values else {
        "memory/h": torch.ones(1, 16)}
    save_file(values, values_path)
    with pytest.raises(FuseError, match=r"differs from InferenceManager at step 0"):
        validate(path, yaml_path)


def test_outputs_named_like_inputs_get_a_suffix(bundles, tmp_path):
    """nested_io's reader has port base_0 as a graph input and a graph output."""
    yaml_path = _copy(bundles["nested_io"], tmp_path)
    meta = read_metadata(leapp.fuse(yaml_path))
    outputs = {p.get("key"): p["name"] for p in meta["outputs"] if "key" in p}
    assert outputs == {"reader/base_0": "reader/base_0__out",
                       "reader/base_1": "reader/base_1__out"}


def _two_nodes(out: str, fuse: bool, byom: str | None = None):
    """a (jit, declared state h) -> b (onnx-torchscript, or the BYOM file byom)."""
    linear = torch.nn.Linear(4, 4)
    leapp.start("two", save_path=out)
    with torch.no_grad():
        for i in range(2):
            x = annotate.input_tensors("a", {"obs": torch.randn(1, 4)})
            h = annotate.state_tensors("a", {"h": torch.full((1, 4), 0.5)})
            nh = torch.tanh(linear(x) + h)
            annotate.update_state("a", {"h": nh})
            y = annotate.output_tensors("a", {"y": nh * 2}, export_with="jit")
            z = annotate.input_tensors("b", {"y": y})
            params = {"model_path": byom} if byom else None
            annotate.output_tensors("b", {"z": torch.relu(z) + 1},
                                    export_with=None if byom else "onnx-torchscript",
                                    backend_params=params)
    leapp.stop()
    return leapp.compile_graph(visualize=False, fuse=fuse)


def test_compile_graph_fuse(tmp_path):
    out = str(tmp_path)
    _two_nodes(out, fuse=True)
    bundle = os.path.join(out, "two")
    assert "two_fused.onnx" in os.listdir(bundle)
    with open(os.path.join(bundle, "two.yaml")) as handle:
        text = handle.read()
    assert yaml.safe_load(text)["fused"]["onnx"]["model_path"] == "two_fused.onnx"
    meta = read_metadata(os.path.join(bundle, "two_fused.onnx"))
    assert [s["input"] for s in meta["state"]] == ["a/h"]
    assert meta["state"][0]["initial"]["data"] == base64.b64encode(
        torch.full((1, 4), 0.5).numpy().tobytes()).decode()
    with open(os.path.join(bundle, "log.txt")) as handle:
        log = handle.read()
    assert "matches InferenceManager over 12 steps" in log and ".leapp-" not in log
    # a compile without fuse drops the key and the old fused model
    leapp._core.reset_nodes()
    _two_nodes(out, fuse=False)
    assert "two_fused.onnx" not in os.listdir(bundle)
    with open(os.path.join(bundle, "two.yaml")) as handle:
        assert "fused" not in yaml.safe_load(handle)


def test_byom_onnx_node_of_an_older_opset_is_merged(tmp_path):
    """A user's own ONNX file at opset 16 is converted to the fused model's opset."""
    path = str(tmp_path / "relu_plus_one.onnx")

    class Head(torch.nn.Module):
        def forward(self, y):
            return torch.relu(y) + 1

    torch.onnx.export(Head(), (torch.zeros(1, 4),), path, dynamo=False, opset_version=16,
                      input_names=["y"], output_names=["z"])
    _two_nodes(str(tmp_path / "out"), fuse=True, byom=path)
    fused = onnx.load(str(tmp_path / "out" / "two" / "two_fused.onnx"))
    from torch.onnx import _constants
    fused_opset = max(o.version for o in fused.opset_import if o.domain == "")
    assert fused_opset >= _constants.ONNX_DEFAULT_OPSET > 16


def _no_model(out: str, fuse: bool):
    leapp.start("nomodel", save_path=out)
    x = annotate.input_tensors("a", {"obs": torch.randn(1, 4)})
    annotate.output_tensors("a", {"y": x * 2}, export_with=None)
    leapp.stop()
    return leapp.compile_graph(visualize=False, fuse=fuse)


def test_node_without_a_model_is_refused(tmp_path):
    out = str(tmp_path)
    _no_model(out, fuse=False)
    yaml_path = os.path.join(out, "nomodel", "nomodel.yaml")
    with open(yaml_path, "rb") as handle:
        before = handle.read()
    with pytest.raises(ValueError, match=r"Node 'a' has no model_path"):
        leapp.fuse(yaml_path)
    assert not [n for n in os.listdir(os.path.dirname(yaml_path)) if "fused" in n]
    # compile_graph(fuse=True) fails before its commit: the old bundle stays
    leapp._core.reset_nodes()
    with pytest.raises(ValueError, match=r"Node 'a' has no model_path"):
        _no_model(out, fuse=True)
    with open(yaml_path, "rb") as handle:
        assert handle.read() == before
    assert not [n for n in os.listdir(out) if n.startswith(".leapp-")]


def test_bad_arguments(bundles):
    with pytest.raises(ValueError, match=r"format='tensorrt'.*onnx"):
        leapp.fuse(bundles["semantics_static"], format="tensorrt")
    with pytest.raises(ValueError, match=r"at least 10 steps"):
        leapp.fuse(bundles["semantics_static"], validate_steps=3)


def test_out_outside_the_bundle_is_not_recorded(bundles, tmp_path):
    yaml_path = _copy(bundles["semantics_static"], tmp_path)
    with open(yaml_path, "rb") as handle:
        before = handle.read()
    path = leapp.fuse(yaml_path, out=str(tmp_path / "elsewhere" / "model.pt"),
                      format="torchscript")
    assert os.path.isfile(path)
    with open(yaml_path, "rb") as handle:
        assert handle.read() == before


def _upstream_python() -> str | None:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import compat
    finally:
        sys.path.pop(0)
    return compat.find_upstream_python()


def test_upstream_reader_ignores_the_fused_key(bundles, tmp_path):
    upstream = _upstream_python()
    if upstream is None:
        pytest.skip("no upstream leapp interpreter (make compat)")
    yaml_path = _copy(bundles["declared_state"], tmp_path)
    leapp.fuse(yaml_path)
    code = ("import sys, torch; from leapp import InferenceManager; "
            "m = InferenceManager(sys.argv[1]); "
            "print(sorted(m.run_policy({k: torch.zeros(s) for k, s in "
            "[('memory/obs', (1, 8)), ('controller/frozen', (1, 1))]})))")
    result = subprocess.run([upstream, "-c", code, yaml_path], capture_output=True, text=True,
                            cwd=str(tmp_path), check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "controller/action" in result.stdout


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers()
                    or not torch.cuda.is_available(),
                    reason="onnxruntime has no CUDA provider or torch sees no GPU")
def test_fused_onnx_on_cuda(bundles, tmp_path):
    yaml_path = _copy(bundles["chain_backends"], tmp_path)
    path = leapp.fuse(yaml_path)
    fused = FusedModel(path, providers=["CUDAExecutionProvider"])
    assert fused.session.get_providers()[0] == "CUDAExecutionProvider"
    _run_side_by_side(fused, InferenceManager(yaml_path))


def test_metadata_is_json_with_the_documented_fields(bundles, tmp_path):
    yaml_path = _copy(bundles["gru_module"], tmp_path)
    model = onnx.load(leapp.fuse(yaml_path))
    props = {p.key: p.value for p in model.metadata_props}
    meta = json.loads(props["leapp_fused"])
    assert set(meta) == {"format_version", "pipeline", "leapp_version", "inputs", "outputs",
                         "state"}
    for state in meta["state"]:
        assert set(state) == {"input", "output", "dtype", "shape", "initial"}


@pytest.mark.parametrize("writer", ["leapp", "torch"])
def test_jit_gru_cell_reaches_onnx(tmp_path, monkeypatch, writer):
    """aten::gru_cell: leapp's writer writes it as one ONNX GRU; with the writer off
    (LEAPP_ONNX_WRITER=torch), torch's TorchScript exporter has no symbolic for it and
    the converter path through torch.export decomposes it."""
    gru = torch.nn.GRUCell(6, 8).eval()
    leapp.start("gru", save_path=str(tmp_path))
    with torch.no_grad():
        hidden = torch.zeros(1, 8)
        for _ in range(2):
            x = annotate.input_tensors("memory", {"obs": torch.randn(1, 6)})
            h = annotate.state_tensors("memory", {"hidden": hidden})
            h_new = gru(x, h)
            hidden = annotate.update_state("memory", {"hidden": h_new})
            annotate.output_tensors("memory", {"latent": h_new * 1.0}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    yaml_path = str(tmp_path / "gru" / "gru.yaml")
    if writer == "torch":
        monkeypatch.setenv("LEAPP_ONNX_WRITER", "torch")
    else:  # this test is about the writer, also in a suite run that turns it off
        monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    path = leapp.fuse(yaml_path)
    ops = {node.op_type for node in onnx.load(path).graph.node}
    if writer == "torch":
        assert "Sigmoid" in ops and "Tanh" in ops and "GRU" not in ops  # the cell, decomposed
    else:
        assert "GRU" in ops
    _run_side_by_side(FusedModel(path), InferenceManager(yaml_path))


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_input_no_edge_feeds_is_a_constant(bundles, tmp_path, format):
    """An input the YAML leaves unfed keeps InferenceManager's zeros: a constant."""
    yaml_path = _copy(bundles["nested_io" if format == "torchscript" else "declared_state"],
                      tmp_path)
    with open(yaml_path) as handle:
        text = handle.read()
    if format == "torchscript":
        edited = text.replace("reader: [arm_left, arm_right, base_0, base_1]",
                              "reader: [arm_left, arm_right, base_1]")
        dropped = "reader/base_0"
    else:
        edited = text.replace("    controller: [frozen]\n", "")
        dropped = "controller/frozen"
    assert edited != text
    with open(yaml_path, "w") as handle:
        handle.write(edited)
    meta = read_metadata(leapp.fuse(yaml_path, format=format))  # validated against IM
    assert dropped not in [p["name"] for p in meta["inputs"]]


# ---------------------------------------------------------------------------
# jit and pt2 nodes through leapp's ONNX writer (a private trace of each node's module)

WRITTEN = "written to ONNX by leapp's ONNX writer"
CONVERTED = "converted to ONNX with torch's exporter, not leapp's ONNX writer"


def _mixed_pipeline(out: str, scale: float = 0.5, obs_fn=None) -> str:
    """obs (jit: slicing, normalisation) -> memory (jit, GRU cell state fed back) ->
    policy (pt2: MLP) -> head (onnx-dynamo); returns the YAML path."""
    torch.manual_seed(7)
    gru = torch.nn.GRUCell(6, 8).eval()
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ELU(),
                              torch.nn.Linear(16, 3)).eval()
    mean, std = torch.randn(6), torch.rand(6) + 0.5
    obs_fn = obs_fn or (lambda raw: torch.cat([(raw[:, :4] - mean[:4]) / std[:4],
                                               raw[:, -2:] * 0.1], dim=-1))
    leapp.start("mixed", save_path=out)
    with torch.no_grad():
        hidden = torch.zeros(1, 8)
        for _ in range(3):
            raw = annotate.input_tensors("obs", {"raw": torch.randn(1, 9)})
            o = annotate.output_tensors("obs", {"o": obs_fn(raw)}, export_with="jit")
            x = annotate.input_tensors("memory", {"o": o})
            h = annotate.state_tensors("memory", {"hidden": hidden})
            h_new = gru(x, h)
            hidden = annotate.update_state("memory", {"hidden": h_new})
            latent = annotate.output_tensors("memory", {"latent": h_new.clone()},
                                             export_with="jit")
            z = annotate.input_tensors("policy", {"latent": latent})
            a = annotate.output_tensors("policy", {"a": mlp(z)}, export_with="pt2")
            y = annotate.input_tensors("head", {"a": a})
            annotate.output_tensors("head", {"action": torch.tanh(y) * scale},
                                    export_with="onnx-dynamo")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    return os.path.join(out, "mixed", "mixed.yaml")


def _no_torch_exporter(*args, **kwargs):
    raise AssertionError("torch.onnx.export was called")


@pytest.fixture
def writer_on(monkeypatch):
    """These tests are about the writer, also in a suite run with LEAPP_ONNX_WRITER=torch."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)


def test_jit_and_pt2_nodes_are_written_by_leapps_writer(tmp_path, monkeypatch, caplog, writer_on):
    yaml_path = _mixed_pipeline(str(tmp_path))
    nodes_before = dict(leapp._core.nodes())
    monkeypatch.setattr(torch.onnx, "export", _no_torch_exporter)  # no torch exporter runs
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path)
    for node, backend in (("obs", "jit"), ("memory", "jit"), ("policy", "pt2")):
        assert f"Node '{node}' ({backend}): {WRITTEN}" in caplog.text
    assert CONVERTED not in caplog.text
    # the private traces left the session's nodes as they were, tracing off
    assert list(nodes_before) == ["obs", "memory", "policy", "head"]
    assert dict(leapp._core.nodes()) == nodes_before and not leapp._core.is_tracing()
    model = onnx.load(path)
    onnx.checker.check_model(model)
    ops = {n.op_type for n in model.graph.node}
    assert "GRU" in ops and "Slice" in ops  # the writer's GRU rule, aten.slice's rule
    manager = InferenceManager(yaml_path)
    assert read_metadata(path)["state"][0]["input"] == "memory/hidden"
    _run_side_by_side(FusedModel(path, providers=["CPUExecutionProvider"]), manager)


def test_a_node_without_a_writer_rule_falls_back_with_its_reason(tmp_path, caplog, writer_on):
    """torch.nn.functional.hardshrink has no rule: torch's exporter converts that node,
    the warning names the node and the op; the others are still written."""
    yaml_path = _mixed_pipeline(
        str(tmp_path), obs_fn=lambda raw: torch.nn.functional.hardshrink(raw[:, 1:7], 0.3))
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path)  # validated against InferenceManager
    warned = [r for r in caplog.records if r.levelname == "WARNING" and CONVERTED in r.message]
    assert len(warned) == 1 and warned[0].message.startswith("Node 'obs' (jit)")
    assert "no ONNX rule for" in warned[0].message and "hardshrink" in warned[0].message
    assert f"Node 'memory' (jit): {WRITTEN}" in caplog.text
    assert f"Node 'policy' (pt2): {WRITTEN}" in caplog.text
    _run_side_by_side(FusedModel(path, providers=["CPUExecutionProvider"]),
                      InferenceManager(yaml_path))


class _Branches(torch.nn.Module):
    def forward(self, y):
        if bool(y.sum() > 0):
            return torch.relu(y) + 1
        return y - 1


def test_control_flow_in_a_jit_file_falls_back(tmp_path, caplog, writer_on):
    """A user's own TorchScript file branching on its input: the private trace refuses
    (a value read into Python), torch's exporter keeps both branches (an ONNX If)."""
    byom = str(tmp_path / "branches.pt")
    torch.jit.save(torch.jit.script(_Branches()), byom)
    _two_nodes(str(tmp_path / "out"), fuse=False, byom=byom)
    leapp._core.reset_nodes()
    yaml_path = str(tmp_path / "out" / "two" / "two.yaml")
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path)  # validated: both branches are taken over the steps
    assert "Node 'a' (jit): " + WRITTEN in caplog.text
    message = next(r.message for r in caplog.records if r.message.startswith("Node 'b' (jit)"))
    assert CONVERTED in message and "read into Python by bool()" in message, message
    assert "If" in {n.op_type for n in onnx.load(path).graph.node}  # both branches kept
    _run_side_by_side(FusedModel(path, providers=["CPUExecutionProvider"]),
                      InferenceManager(yaml_path))


def test_a_running_session_is_left_alone(tmp_path, caplog, writer_on):
    """leapp.fuse while the user traces: the tracer is theirs, so every jit / pt2 node
    goes through torch's exporter, and the session's nodes stay as they were."""
    yaml_path = _mixed_pipeline(str(tmp_path / "bundle"))
    leapp.start("user", save_path=str(tmp_path))
    try:
        x = annotate.input_tensors("user_node", {"x": torch.randn(1, 3)})
        annotate.output_tensors("user_node", {"y": x * 3}, export_with="jit")
        with caplog.at_level("INFO", logger="leapp"):
            leapp.fuse(yaml_path)
        assert leapp._core.is_tracing() and list(leapp._core.nodes()) == ["user_node"]
    finally:
        leapp.stop()
    reasons = [r.message for r in caplog.records if CONVERTED in r.message]
    assert len(reasons) == 3 and all("a leapp tracing session is running" in m
                                     for m in reasons), reasons
