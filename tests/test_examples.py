"""The seed examples run, and their bundles hold what the seeds promise."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import onnxruntime as ort
import pytest
import torch
import yaml

from support import ROOT


def _load(name: str):
    path = os.path.join(ROOT, "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _yaml(bundle_dir: str, graph: str) -> dict:
    with open(os.path.join(bundle_dir, f"{graph}.yaml")) as handle:
        return yaml.safe_load(handle)


def test_getting_started_bundle(tmp_path):
    example = _load("getting_started")
    torch.manual_seed(7)
    bundle = example.main(str(tmp_path))
    assert sorted(os.listdir(bundle)) == [".leapp_cache.json", "log.txt", "my_pipeline.html",
                                          "my_pipeline.png", "my_pipeline.yaml",
                                          "my_pipeline_analytics.json", "predict.onnx",
                                          "preprocess.pt"]
    spec = _yaml(bundle, "my_pipeline")
    assert list(spec) == ["models", "pipeline", "system information"]
    assert list(spec["models"]) == ["preprocess", "predict"]
    pre = spec["models"]["preprocess"]
    assert [p["name"] for p in pre["inputs"]] == ["obs1_name", "obs2_name"]
    assert pre["outputs"] == [{"name": "processed_features", "dtype": "float32",
                               "shape": [1, 16], "type": "tensor"}]
    assert pre["parameters"]["model_path"] == "preprocess.pt"
    assert spec["models"]["predict"]["parameters"]["backend"] == "onnx"
    assert spec["pipeline"]["data_flow"] == {"preprocess/processed_features": ["predict/features"]}
    assert spec["pipeline"]["inputs"] == {"preprocess": ["obs1_name", "obs2_name"]}
    assert spec["pipeline"]["outputs"] == {"predict": ["output"]}
    assert spec["pipeline"]["feedback_flow"] == {}
    # the exported models reproduce the eager pipeline
    torch.manual_seed(7)
    obs1, obs2 = torch.randn(1, 8), torch.randn(1, 8)
    features = torch.cat([obs1 - obs1.mean(), obs2 / (obs2.abs().max() + 1e-6)], dim=-1)
    expected = torch.relu(features @ example.WEIGHTS)
    pre_model = torch.jit.load(os.path.join(bundle, "preprocess.pt"))
    got_features = pre_model(obs1, obs2)
    assert torch.equal(got_features, features)
    session = ort.InferenceSession(os.path.join(bundle, "predict.onnx"),
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"features": got_features.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-6)
    log = open(os.path.join(bundle, "log.txt")).read()
    for line in ("- Computation nodes: 2", "- Dangling inputs: 2", "- Dangling outputs: 1",
                 "- Internal connections: 1", "- Total edges: 4"):
        assert line in log


def test_complete_pipeline_bundle(tmp_path):
    example = _load("complete_pipeline")
    torch.manual_seed(11)
    bundle = example.main(str(tmp_path))
    for name in ("complete_pipeline.yaml", "complete_pipeline.png", "preprocess.pt",
                 "inference.pt", "postprocess.pt", "log.txt"):
        assert os.path.exists(os.path.join(bundle, name)), name
    spec = _yaml(bundle, "complete_pipeline")
    assert list(spec["models"]) == ["preprocess", "inference", "postprocess"]
    assert spec["models"]["preprocess"]["inputs"][0]["name"] == "raw_data"
    assert spec["models"]["preprocess"]["outputs"][0]["name"] == "normalized"
    assert spec["models"]["postprocess"]["outputs"][0]["dtype"] == "int64"
    assert spec["pipeline"]["data_flow"] == {
        "inference/predictions": ["postprocess/predictions"],
        "preprocess/normalized": ["inference/features"],
    }
    torch.manual_seed(11)
    raw = torch.randn(1, 10)
    normalized = example.preprocess(raw)  # no session: the plain function
    predictions = example.model(normalized)
    final = torch.argmax(torch.softmax(predictions, dim=1), dim=1)
    models = {n: torch.jit.load(os.path.join(bundle, f"{n}.pt"))
              for n in ("preprocess", "inference", "postprocess")}
    assert torch.equal(models["preprocess"](raw), normalized)
    assert torch.equal(models["inference"](normalized), predictions.detach())
    assert torch.equal(models["postprocess"](predictions.detach()), final)


def test_getting_started_runs_as_a_script(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "getting_started.py"),
                             str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    assert f"Bundle written to {tmp_path}/my_pipeline" in result.stdout


# ---- the worked examples: each bundle, run by leapp.InferenceManager, is the eager code --


def test_module_buffers_bundle(tmp_path):
    from leapp import InferenceManager

    example = _load("module_buffers")
    bundle = example.main(str(tmp_path))
    spec = _yaml(bundle, "module_buffers")
    policy = spec["models"]["policy"]
    assert [p["name"] for p in policy["inputs"]] == ["obs", "running_mean", "count"]
    assert [p["name"] for p in policy["outputs"]] == ["action", "running_mean", "count"]
    assert spec["pipeline"]["feedback_flow"] == {"policy/count": ["policy/count"],
                                                 "policy/running_mean": ["policy/running_mean"]}
    assert spec["pipeline"]["initial_values"] == "module_buffers_initial_values.safetensors"
    torch.manual_seed(0)
    eager = example.RunningNormalizer().eval()  # fresh: the buffers' first values
    manager = InferenceManager(os.path.join(bundle, "module_buffers.yaml"))
    for obs in example.observations(10):  # beyond the traced passes
        with torch.no_grad():
            expected = eager(obs)
        got = manager.run_policy({"policy/obs": obs})
        torch.testing.assert_close(got["policy/action"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eager.count, torch.full((1, 1), 10.0))


def test_state_tensors_bundle(tmp_path):
    from leapp import InferenceManager

    example = _load("state_tensors")
    bundle = example.main(str(tmp_path))
    spec = _yaml(bundle, "state_tensors")
    assert spec["pipeline"]["feedback_flow"] == {"policy/last_action": ["policy/last_action"]}
    assert [p["name"] for p in spec["models"]["policy"]["outputs"]] == ["action", "last_action"]
    manager = InferenceManager(os.path.join(bundle, "state_tensors.yaml"))
    last = torch.zeros(1, 2)
    for obs in example.observations(10):
        last = example.policy_step(obs, last)  # no session: plain eager code
        got = manager.run_policy({"policy/obs": obs})
        torch.testing.assert_close(got["policy/action"], last, rtol=1e-5, atol=1e-6)


def test_method_node_bundle(tmp_path):
    from leapp import InferenceManager

    example = _load("method_node")
    bundle = example.main(str(tmp_path))
    spec = _yaml(bundle, "method_node")
    assert list(spec["models"]) == ["normalize", "policy"]
    assert [p["name"] for p in spec["models"]["normalize"]["inputs"]] == ["obs"]
    assert [p["name"] for p in spec["models"]["policy"]["outputs"]] == ["logits", "action"]
    assert spec["models"]["policy"]["parameters"]["backend"] == "onnx"
    assert spec["pipeline"]["data_flow"] == {"normalize/features": ["policy/features"]}
    torch.manual_seed(0)
    policy = example.Policy().eval()
    manager = InferenceManager(os.path.join(bundle, "method_node.yaml"))
    generator = torch.Generator().manual_seed(9)
    for _ in range(5):
        obs = torch.randn(1, 8, generator=generator)
        with torch.no_grad():
            logits, action = example.run(policy, obs)  # no session: plain eager code
        got = manager.run_policy({"normalize/obs": obs})
        torch.testing.assert_close(got["policy/logits"], logits, rtol=1e-4, atol=1e-5)
        assert torch.equal(got["policy/action"], action)


def test_getting_started_notebook_is_valid_and_runs_as_code(tmp_path):
    import json

    with open(os.path.join(ROOT, "examples", "getting_started.ipynb")) as handle:
        notebook = json.load(handle)
    assert notebook["nbformat"] == 4 and notebook["nbformat_minor"] >= 4
    assert notebook["metadata"]["kernelspec"]["language"] == "python"
    for cell in notebook["cells"]:
        assert cell["cell_type"] in ("markdown", "code") and isinstance(cell["source"], list)
        assert "id" in cell
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None
    try:
        import nbformat
    except ImportError:
        nbformat = None
    if nbformat is not None:
        nbformat.validate(nbformat.reads(json.dumps(notebook), as_version=4))
    code = "\n\n".join("".join(cell["source"]) for cell in notebook["cells"]
                       if cell["cell_type"] == "code")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "my_pipeline" / "my_pipeline.yaml").exists()


def test_serve_with_triton_example(tmp_path):
    """Two robots served by a real tritonserver, every action equal to InferenceManager's."""
    from support import under_sanitizer
    if under_sanitizer():
        pytest.skip("the ASan preload is inherited by tritonserver and its python stubs")
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed")
    from leapp.triton_server import TritonUnavailable, find_tritonserver
    try:
        find_tritonserver()
    except TritonUnavailable as exc:  # the one skip: no binary; a server that exits fails
        pytest.skip(f"no tritonserver binary here: {exc}")
    example = _load("serve_with_triton")
    actions = example.main(str(tmp_path))  # asserts each action against InferenceManager
    assert sorted(actions) == [1, 2] and all(len(a) == 10 for a in actions.values())
    assert actions[1] != actions[2]  # two observation streams, two states on the server
    assert os.path.exists(tmp_path / "triton_repository" / "sample_feedback_graph"
                          / "config.pbtxt")
