"""InferenceManager: loading, validation, routing, feedback, and the C program.

Bundles are written here by hand (TorchScript, ONNX, torch.export models plus a
YAML in the exported layout), and tests/data/upstream holds bundles exported by
upstream leapp 0.7.2 with its recorded outputs (bench/make_upstream_fixtures.py).
"""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import weakref

import pytest
import support
import torch
import yaml
from safetensors.torch import load_file, save_file

from leapp import _core
from leapp.running.inference_manager import OUTPUT_KEY, InferenceManager

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.path.join(HERE, "data", "upstream")
DTYPE_NAMES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool",
               torch.float64: "float64", torch.int32: "int32"}


# ---- bundle writing ---------------------------------------------------------


class Affine(torch.nn.Module):
    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Mix(torch.nn.Module):
    """(obs, h) -> (action, h_next): a recurrent step."""

    def forward(self, obs: torch.Tensor, h: torch.Tensor):
        h_next = torch.tanh(0.5 * h + obs)
        return h_next * 2.0, h_next


class Blend(torch.nn.Module):
    """(a, prev) -> (out, mem)"""

    def forward(self, a: torch.Tensor, prev: torch.Tensor):
        mem = 0.8 * prev + 0.2 * a
        return mem + 1.0, mem


class TwoOut(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return x + 1.0, x * 3.0


class Typed(torch.nn.Module):
    """float, int64 and bool inputs."""

    def forward(self, x: torch.Tensor, n: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        return torch.where(flag, x * n.to(x.dtype), x)


def port(name: str, shape, dtype=torch.float32) -> dict:
    return {"name": name, "dtype": DTYPE_NAMES[dtype], "shape": list(shape), "type": "tensor"}


def save_model(directory: str, name: str, module: torch.nn.Module, backend: str,
               example: tuple, in_names: list[str], out_names: list[str]) -> str:
    module = module.eval()
    if backend == "jit":
        filename = f"{name}.pt"
        torch.jit.script(module).save(os.path.join(directory, filename))
    elif backend == "onnx":
        filename = f"{name}.onnx"
        torch.onnx.export(module, example, os.path.join(directory, filename),
                          input_names=in_names, output_names=out_names, dynamo=False)
    elif backend == "pt2":
        filename = f"{name}.pt2"
        torch.export.save(torch.export.export(module, example),
                          os.path.join(directory, filename))
    else:
        raise ValueError(backend)
    return filename


def make_bundle(directory, name: str, nodes: list[dict], pipeline: dict,
                initial_values: dict | None = None, version: str = "1.3") -> str:
    """nodes: dicts with name, module, backend, inputs [(n, shape, dtype)], outputs."""
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    models = {}
    for node in nodes:
        example = tuple(
            (torch.randn(s) if d.is_floating_point else
             torch.zeros(s, dtype=d) if d != torch.bool else torch.zeros(s, dtype=torch.bool))
            for _, s, d in node["inputs"])
        filename = save_model(directory, node["name"], node["module"], node["backend"],
                              example, [n for n, _, _ in node["inputs"]],
                              [n for n, _, _ in node["outputs"]])
        data = open(os.path.join(directory, filename), "rb").read()
        models[node["name"]] = {
            "inputs": [port(n, s, d) for n, s, d in node["inputs"]],
            "outputs": [port(n, s, d) for n, s, d in node["outputs"]],
            "parameters": {"model_path": filename,
                           "md5sum": hashlib.md5(data).hexdigest(),
                           "sha256sum": hashlib.sha256(data).hexdigest(),
                           "backend": node["backend"], "warp_segments": 0},
        }
    pipeline = dict(pipeline)
    if initial_values is not None:
        save_file(initial_values, os.path.join(directory, f"{name}_initial_values.safetensors"))
        pipeline["initial_values"] = f"{name}_initial_values.safetensors"
    system = {"leapp config version": version, "leapp version": "test", "os": "Linux",
              "python version": "3", "torch version": "2"}
    path = os.path.join(directory, f"{name}.yaml")
    write_yaml(path, {"models": models, "pipeline": pipeline, "system information": system})
    return path


def write_yaml(path: str, description: dict) -> None:
    with open(path, "w") as handle:
        for key, value in description.items():
            handle.write(yaml.dump({key: value}, sort_keys=(key != "models")) + "\n")


def read_yaml(path: str) -> dict:
    with open(path) as handle:
        return yaml.safe_load(handle)


def chain_bundle(directory, **kwargs) -> str:
    """pre (jit, x*2+1) -> post (jit, x*0.5-3), graph I/O pre/x, post/y."""
    nodes = [
        {"name": "pre", "module": Affine(2.0, 1.0), "backend": "jit",
         "inputs": [("x", (1, 4), torch.float32)], "outputs": [("y", (1, 4), torch.float32)]},
        {"name": "post", "module": Affine(0.5, -3.0), "backend": "jit",
         "inputs": [("x", (1, 4), torch.float32)], "outputs": [("y", (1, 4), torch.float32)]},
    ]
    pipeline = {"data_flow": {"pre/y": ["post/x"]}, "feedback_flow": {},
                "inputs": {"pre": ["x"]}, "outputs": {"post": ["y"]}}
    return make_bundle(directory, "chain", nodes, pipeline, **kwargs)


def mixed_bundle(directory) -> str:
    """jit -> onnx (state h) -> pt2 with feedback blend/mem -> blend/prev."""
    nodes = [
        {"name": "pre", "module": Affine(2.0, 1.0), "backend": "jit",
         "inputs": [("x", (1, 3), torch.float32)], "outputs": [("y", (1, 3), torch.float32)]},
        {"name": "policy", "module": Mix(), "backend": "onnx",
         "inputs": [("obs", (1, 3), torch.float32), ("h_in", (1, 3), torch.float32)],
         "outputs": [("action", (1, 3), torch.float32), ("h_out", (1, 3), torch.float32)]},
        {"name": "blend", "module": Blend(), "backend": "pt2",
         "inputs": [("a", (1, 3), torch.float32), ("prev", (1, 3), torch.float32)],
         "outputs": [("out", (1, 3), torch.float32), ("mem", (1, 3), torch.float32)]},
    ]
    pipeline = {"data_flow": {"pre/y": ["policy/obs"], "policy/action": ["blend/a"]},
                "feedback_flow": {"policy/h_out": ["policy/h_in"], "blend/mem": ["blend/prev"]},
                "inputs": {"pre": ["x"]}, "outputs": {"blend": ["out"]}}
    initial = {"policy/h_in": torch.full((1, 3), 0.25), "blend/prev": torch.ones(1, 3)}
    return make_bundle(directory, "mixed", nodes, pipeline, initial_values=initial)


# ---- upstream bundles ---------------------------------------------------------


@pytest.mark.parametrize("name", ["chain", "stateful", "feedback"])
def test_upstream_bundles_match_recorded_outputs(name):
    manager = InferenceManager(os.path.join(UPSTREAM, name, f"{name}.yaml"))
    expected = load_file(os.path.join(UPSTREAM, name, f"{name}_expected.safetensors"))
    steps = sorted({int(k.split("/")[1]) for k in expected})
    assert steps == list(range(10))
    for step in steps:
        prefix = f"in/{step}/"
        inputs = {k[len(prefix):]: v for k, v in expected.items() if k.startswith(prefix)}
        assert sorted(inputs) == sorted(manager.inputs)
        outputs = manager.run_policy(inputs)
        assert sorted(outputs) == sorted(manager.outputs)
        for key, value in outputs.items():
            # recorded on another CPU: a float32 matmul may round its last bits otherwise
            # on this one's SIMD path (AVX-512 against AVX2): within 8 ulps of values
            # of about 1 (these bundles' outputs), where a wiring error is off by 0.1
            torch.testing.assert_close(value, expected[f"out/{step}/{key}"], rtol=1e-6,
                                       atol=1e-7)


def test_upstream_feedback_bundle_structure():
    manager = InferenceManager(os.path.join(UPSTREAM, "feedback", "feedback.yaml"))
    assert manager.feedback_inputs == ["policy_step/policy_memory_in",
                                       "feedback_update/policy_memory_prev"]
    assert manager.inputs == ["policy_step/observation_scalar"]
    assert manager.outputs == ["policy_step/control_action"]
    initial = load_file(os.path.join(UPSTREAM, "feedback",
                                     "feedback_initial_values.safetensors"))
    for key, value in initial.items():
        node, name = key.split("/")
        torch.testing.assert_close(manager.value_dict[node][name], value)


def test_upstream_state_bundle_changes_state():
    manager = InferenceManager(os.path.join(UPSTREAM, "stateful", "stateful.yaml"))
    assert manager.nodes["policy"].device == "cpu"
    before = manager.value_dict["policy"]["h_in"].clone()
    manager(manager.get_mock_input())
    assert not torch.equal(before, manager.value_dict["policy"]["h_in"])


# ---- own bundles: backends, feedback, order -------------------------------------


def reference_mixed(xs):
    h = torch.full((1, 3), 0.25)
    prev = torch.ones(1, 3)
    outs = []
    for x in xs:
        y = x * 2.0 + 1.0
        h = torch.tanh(0.5 * h + y)
        action = h * 2.0
        prev = 0.8 * prev + 0.2 * action
        outs.append(prev + 1.0)
    return outs


def test_mixed_backends_with_feedback(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        manager = InferenceManager(mixed_bundle(tmp_path))
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers() \
            and not torch.cuda.is_available():  # no GPU: nothing to fall back from
        assert "CUDA execution provider not available" not in caplog.text
    assert manager.run_order == ["pre", "policy", "blend"]
    assert sorted(manager.feedback_inputs) == ["blend/prev", "policy/h_in"]
    xs = [torch.randn(1, 3) for _ in range(6)]
    expected = reference_mixed(xs)
    for x, want in zip(xs, expected):
        out = manager.run_policy({"pre/x": x})
        assert list(out) == ["blend/out"]
        torch.testing.assert_close(out["blend/out"], want, rtol=1e-5, atol=1e-6)
    assert manager.nodes["policy"].backend == "onnx"
    assert manager.nodes["blend"].backend == "pt2"


def test_a_dropped_manager_is_freed_at_once(tmp_path):
    """No reference cycle through the C program (it holds the NumPy converter, not a
    bound method of the manager): a manager dropped is freed at once, its onnxruntime
    session (and that session's threads, and on a GPU its memory) with it, not when the
    garbage collector next runs."""
    import numpy as np

    path = mixed_bundle(tmp_path)  # jit, onnx and pt2 nodes
    gc.collect()
    gc.disable()
    try:
        manager = InferenceManager(path)
        out = manager.run_policy({"pre/x": np.ones((1, 3), dtype=np.float32)})
        assert out["blend/out"].shape == (1, 3)
        session = weakref.ref(manager.nodes["policy"].model.session)
        dropped = weakref.ref(manager)
        del manager, out
        assert dropped() is None and session() is None
    finally:
        gc.enable()


def test_onnx_requires_grad_and_noncontiguous_inputs(tmp_path):
    manager = InferenceManager(mixed_bundle(tmp_path))
    node = manager.nodes["policy"]
    obs = torch.randn(3, 2)[:, :1].t()  # a (1, 3) view with stride (1, 2)
    assert not obs.is_contiguous()
    action, h = node(obs, torch.zeros(1, 3))
    torch.testing.assert_close(h, torch.tanh(obs))
    action, h = node(torch.ones(1, 3, requires_grad=True), torch.zeros(1, 3))
    torch.testing.assert_close(h, torch.tanh(torch.ones(1, 3)))
    assert not h.requires_grad


def test_run_order_is_topological_with_yaml_ties(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["models"] = dict(reversed(list(description["models"].items())))
    write_yaml(path, description)
    manager = InferenceManager(path)
    assert list(manager.models) == ["post", "pre"]
    assert manager.run_order == ["pre", "post"]
    x = torch.randn(1, 4)
    torch.testing.assert_close(manager({"pre/x": x})["post/y"], (x * 2 + 1) * 0.5 - 3)


def test_feedback_producer_before_consumer_still_arrives_next_step(tmp_path):
    # src has no inputs from the graph besides its own; its output feeds back
    # into dst, which the run order places after src: the value is staged.
    nodes = [
        {"name": "src", "module": Affine(1.0, 1.0), "backend": "jit",
         "inputs": [("x", (1,), torch.float32)], "outputs": [("y", (1,), torch.float32)]},
        {"name": "dst", "module": Affine(1.0, 0.0), "backend": "jit",
         "inputs": [("h", (1,), torch.float32)], "outputs": [("z", (1,), torch.float32)]},
    ]
    pipeline = {"feedback_flow": {"src/y": ["dst/h"]},
                "inputs": {"src": ["x"]}, "outputs": {"dst": ["z"]}}
    manager = InferenceManager(make_bundle(tmp_path, "staged", nodes, pipeline))
    outs = [manager({"src/x": torch.tensor([float(i)])})["dst/z"].item() for i in range(4)]
    assert outs == [0.0, 1.0, 2.0, 3.0]  # step i sees src's value of step i-1


def test_fan_out_first_consumer_shares_others_clone(tmp_path):
    nodes = [
        {"name": "a", "module": Identity(), "backend": "jit",
         "inputs": [("x", (2, 3), torch.float32)], "outputs": [("y", (2, 3), torch.float32)]},
        {"name": "b", "module": Identity(), "backend": "jit",
         "inputs": [("x", (2, 3), torch.float32)], "outputs": [("y", (2, 3), torch.float32)]},
        {"name": "c", "module": Identity(), "backend": "jit",
         "inputs": [("x", (2, 3), torch.float32)], "outputs": [("y", (2, 3), torch.float32)]},
    ]
    pipeline = {"data_flow": {"a/y": ["b/x", "c/x"]},
                "inputs": {"a": ["x"]}, "outputs": {"b": ["y"], "c": ["y"]}}
    manager = InferenceManager(make_bundle(tmp_path, "fan", nodes, pipeline))
    x = torch.randn(2, 3)
    out = manager({"a/x": x})
    b_in, c_in = manager.value_dict["b"]["x"], manager.value_dict["c"]["x"]
    assert b_in.data_ptr() == x.data_ptr()  # zero-copy to the first consumer
    assert c_in.data_ptr() != x.data_ptr()  # independent clone for the second
    torch.testing.assert_close(c_in, x)
    c_in.add_(1.0)
    torch.testing.assert_close(b_in, x)
    torch.testing.assert_close(out["b/y"], x)
    assert manager.organized_pipeline_connections["a"]["y"] == [("b", "x"), ("c", "x")]


def test_output_routed_to_pipeline_and_consumer(tmp_path):
    nodes = [
        {"name": "a", "module": TwoOut(), "backend": "jit",
         "inputs": [("x", (2,), torch.float32)],
         "outputs": [("p", (2,), torch.float32), ("q", (2,), torch.float32)]},
        {"name": "b", "module": Affine(1.0, 0.0), "backend": "jit",
         "inputs": [("x", (2,), torch.float32)], "outputs": [("y", (2,), torch.float32)]},
    ]
    pipeline = {"data_flow": {"a/p": ["b/x"]}, "inputs": {"a": ["x"]},
                "outputs": {"a": ["q"], "b": ["y"]}}
    manager = InferenceManager(make_bundle(tmp_path, "two", nodes, pipeline))
    out = manager({"a/x": torch.tensor([1.0, 2.0])})
    assert out.keys() == {"a/q", "b/y"}
    torch.testing.assert_close(out["a/q"], torch.tensor([3.0, 6.0]))
    torch.testing.assert_close(out["b/y"], torch.tensor([2.0, 3.0]))
    assert set(manager.value_dict[OUTPUT_KEY]) == {"a/q", "b/y"}


def test_yaml_variants_load(tmp_path):
    for version in ("1.0", "1.1", "1.2", "1.3", "1.4"):
        path = chain_bundle(tmp_path / version, version=version)
        description = read_yaml(path)
        del description["pipeline"]["feedback_flow"]
        # JSON-string shapes and legacy parameter keys
        description["models"]["pre"]["inputs"][0]["shape"] = json.dumps([1, 4])
        description["models"]["pre"]["parameters"].update(
            device="cuda", formatting={"input_format": "x"}, is_engine_path=False)
        description["models"]["post"]["outputs"][0]["kind"] = "target/joint/position"
        write_yaml(path, description)
        manager = InferenceManager(path)
        assert manager.feedback_inputs == []
        assert manager.system_info["leapp config version"] == version
        x = torch.ones(1, 4)
        torch.testing.assert_close(manager({"pre/x": x})["post/y"],
                                   (x * 2 + 1) * 0.5 - 3)


def test_missing_data_flow_tolerated(tmp_path):
    nodes = [{"name": "solo", "module": Affine(1.0, 1.0), "backend": "jit",
              "inputs": [("x", (1,), torch.float32)], "outputs": [("y", (1,), torch.float32)]}]
    manager = InferenceManager(make_bundle(tmp_path, "solo", nodes,
                                           {"inputs": {"solo": ["x"]},
                                            "outputs": {"solo": ["y"]}}))
    assert manager({"solo/x": torch.tensor([1.0])})["solo/y"].item() == 2.0


def test_public_attributes(tmp_path):
    manager = InferenceManager(mixed_bundle(tmp_path))
    node = manager.nodes["policy"]
    assert node.input_names == ["obs", "h_in"]
    assert node.output_names == ["action", "h_out"]
    assert node.input_descriptions[0]["name"] == "obs"
    assert node.output_descriptions[1]["shape"] == [1, 3]
    assert node.device == "cpu"
    assert set(manager.value_dict) == {"pre", "policy", "blend", OUTPUT_KEY}
    assert set(manager.value_dict["policy"]) == {"obs", "h_in"}
    assert "blend/out" in manager.value_dict[OUTPUT_KEY]
    assert "data_flow" in manager.pipeline and "pre" in manager.models
    assert "system information" in manager.leapp_description
    assert manager.inputs == ["pre/x"] and manager.outputs == ["blend/out"]
    torch.testing.assert_close(manager.value_dict["policy"]["h_in"], torch.full((1, 3), 0.25))


# ---- state API ---------------------------------------------------------------------


def test_reset_restores_zeros_and_initial_values(tmp_path):
    manager = InferenceManager(mixed_bundle(tmp_path))
    first = manager({"pre/x": torch.ones(1, 3)})["blend/out"].clone()
    kept = manager({"pre/x": torch.ones(1, 3)})
    assert not torch.equal(manager.value_dict["policy"]["h_in"], torch.full((1, 3), 0.25))
    manager.reset()
    torch.testing.assert_close(manager.value_dict["policy"]["h_in"], torch.full((1, 3), 0.25))
    torch.testing.assert_close(manager.value_dict["blend"]["prev"], torch.ones(1, 3))
    assert torch.count_nonzero(manager.value_dict["pre"]["x"]) == 0
    assert torch.count_nonzero(manager.value_dict[OUTPUT_KEY]["blend/out"]) == 0
    assert torch.count_nonzero(kept["blend/out"]) > 0  # handed-out tensors untouched
    torch.testing.assert_close(manager({"pre/x": torch.ones(1, 3)})["blend/out"], first)


def test_set_input_value(tmp_path):
    manager = InferenceManager(mixed_bundle(tmp_path))
    buffer = manager.value_dict["policy"]["h_in"]
    before = buffer.clone()
    manager.set_input_value("policy", "h_in", torch.zeros(1, 3))
    # a copy in a fresh buffer: the old one may be a model's own output (never written)
    assert manager.value_dict["policy"]["h_in"] is not buffer
    assert torch.count_nonzero(manager.value_dict["policy"]["h_in"]) == 0
    assert torch.equal(buffer, before)
    x = torch.randn(1, 3)
    out = manager({"pre/x": x})["blend/out"]
    h = torch.tanh(x * 2 + 1)
    torch.testing.assert_close(out, 0.8 + 0.2 * 2 * h + 1.0)
    with pytest.raises(KeyError, match="Node 'nope' not found"):
        manager.set_input_value("nope", "h_in", torch.zeros(1, 3))
    with pytest.raises(KeyError, match="Input 'h' not found in node 'policy'"):
        manager.set_input_value("policy", "h", torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"Shape mismatch for input 'policy/h_in'.*\(1, 3\).*\(3,\)"):
        manager.set_input_value("policy", "h_in", torch.zeros(3))


def test_value_dict_is_live(tmp_path):
    manager = InferenceManager(chain_bundle(tmp_path))
    manager.value_dict["pre"]["x"] = torch.full((1, 4), 2.0)
    out = manager({})
    torch.testing.assert_close(out["post/y"], torch.full((1, 4), (2.0 * 2 + 1) * 0.5 - 3))
    with pytest.raises(KeyError):
        manager.value_dict["pre"]["nope"]


def test_get_mock_input(tmp_path):
    nodes = [{"name": "t", "module": Typed(), "backend": "jit",
              "inputs": [("x", (2, 3), torch.float32), ("n", (2, 3), torch.int64),
                         ("flag", (2, 3), torch.bool)],
              "outputs": [("y", (2, 3), torch.float32)]}]
    pipeline = {"inputs": {"t": ["x", "n", "flag"]}, "outputs": {"t": ["y"]}}
    manager = InferenceManager(make_bundle(tmp_path, "typed", nodes, pipeline))
    mock = manager.get_mock_input()
    assert list(mock) == ["t/x", "t/n", "t/flag"]
    assert [v.dtype for v in mock.values()] == [torch.float32, torch.int64, torch.bool]
    assert all(v.shape == (2, 3) and v.device.type == "cpu" for v in mock.values())
    out = manager.run_policy(mock)
    want = torch.where(mock["t/flag"], mock["t/x"] * mock["t/n"].float(), mock["t/x"])
    torch.testing.assert_close(out["t/y"], want)


# ---- construction errors --------------------------------------------------------------


def test_missing_yaml(tmp_path):
    with pytest.raises(FileNotFoundError, match="Leapp description file not found at"):
        InferenceManager(str(tmp_path / "nothing.yaml"))


def test_not_yaml_suffix(tmp_path):
    path = chain_bundle(tmp_path)
    yml = path[:-5] + ".yml"
    shutil.copy(path, yml)
    with pytest.raises(ValueError, match="Leapp description file must end with .yaml"):
        InferenceManager(yml)


@pytest.mark.parametrize("key", ["models", "pipeline", "system information"])
def test_missing_top_level_key(tmp_path, key):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    del description[key]
    write_yaml(path, description)
    with pytest.raises(ValueError, match="Leapp description file must contain models, "
                                         "pipeline, and system_info, got"):
        InferenceManager(path)


def test_missing_model_section(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    del description["models"]["pre"]["outputs"]
    write_yaml(path, description)
    with pytest.raises(ValueError, match="Model description must contain inputs, outputs, "
                                         "and parameters, got"):
        InferenceManager(path)


@pytest.mark.parametrize("key", ["model_path", "md5sum", "sha256sum", "backend"])
def test_missing_parameter_key(tmp_path, key):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    del description["models"]["post"]["parameters"][key]
    write_yaml(path, description)
    with pytest.raises(ValueError, match="Model description must contain model_path, md5sum, "
                                         "sha256sum, and backend, got"):
        InferenceManager(path)


def test_checksum_mismatch(tmp_path):
    path = chain_bundle(tmp_path)
    with open(os.path.join(tmp_path, "post.pt"), "ab") as handle:
        handle.write(b"corrupted")
    with pytest.raises(ValueError, match=r"SHA256 checksum mismatch for .*post\.pt: "
                                         r"expected [0-9a-f]{64}, got [0-9a-f]{64}"):
        InferenceManager(path)


def test_unsupported_backend(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["models"]["pre"]["parameters"]["backend"] = "trt"
    write_yaml(path, description)
    with pytest.raises(ValueError, match="Unsupported backend: trt"):
        InferenceManager(path)


def test_unroutable_outputs(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["pipeline"]["outputs"] = {}
    write_yaml(path, description)
    with pytest.raises(ValueError, match=r"Node 'post' has unroutable outputs: \['y'\]. "
                                         "Every model output must appear in pipeline"):
        InferenceManager(path)


def test_unknown_source_node(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["pipeline"]["data_flow"]["ghost/y"] = ["post/x"]
    write_yaml(path, description)
    with pytest.raises(ValueError, match="Source node 'ghost' not found in models"):
        InferenceManager(path)


def test_unknown_target_input(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["pipeline"]["data_flow"]["pre/y"] = ["post/zz"]
    write_yaml(path, description)
    with pytest.raises(ValueError, match=r"Target input 'zz' not found in node 'post'"):
        InferenceManager(path)


def test_connection_shape_mismatch(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["models"]["post"]["inputs"][0]["shape"] = [1, 5]
    write_yaml(path, description)
    with pytest.raises(ValueError, match=r"Shape mismatch in pipeline connection: "
                                         r"pre/y \(1, 4\) -> post/x \(1, 5\)"):
        InferenceManager(path)


def test_connection_dtype_mismatch(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["models"]["post"]["inputs"][0]["dtype"] = "float64"
    write_yaml(path, description)
    with pytest.raises(ValueError, match="Dtype mismatch in pipeline connection: "
                                         "pre/y torch.float32 -> post/x torch.float64"):
        InferenceManager(path)


def test_data_flow_cycle_rejected(tmp_path):
    path = chain_bundle(tmp_path)
    description = read_yaml(path)
    description["pipeline"]["data_flow"]["post/y"] = ["pre/x"]
    description["pipeline"]["inputs"] = {}
    write_yaml(path, description)
    with pytest.raises(ValueError, match="cycle"):
        InferenceManager(path)


def test_malformed_initial_value_key(tmp_path):
    path = mixed_bundle(tmp_path)
    save_file({"policy/h_in/extra": torch.zeros(1, 3)},
              os.path.join(tmp_path, "mixed_initial_values.safetensors"))
    with pytest.raises(ValueError, match="too many values to unpack"):
        InferenceManager(path)


def test_unknown_initial_value_key(tmp_path):
    path = mixed_bundle(tmp_path)
    save_file({"policy/nope": torch.zeros(1, 3)},
              os.path.join(tmp_path, "mixed_initial_values.safetensors"))
    with pytest.raises(ValueError, match="Feedback initial value key 'policy/nope' does not "
                                         "match any node input"):
        InferenceManager(path)


def test_missing_initial_values_file(tmp_path):
    path = mixed_bundle(tmp_path)
    os.remove(os.path.join(tmp_path, "mixed_initial_values.safetensors"))
    with pytest.raises(FileNotFoundError, match="Feedback initial values file not found at"):
        InferenceManager(path)


# ---- run_policy input errors -------------------------------------------------------------


@pytest.fixture
def chain(tmp_path):
    return InferenceManager(chain_bundle(tmp_path))


def test_unknown_input_key(chain):
    with pytest.raises(KeyError, match=r"Unknown input key 'pre/z'.*\['pre/x'\]"):
        chain.run_policy({"pre/z": torch.zeros(1, 4)})
    with pytest.raises(KeyError, match="Unknown input key 'ghost/x'"):
        chain.run_policy({"ghost/x": torch.zeros(1, 4)})


def test_invalid_input_key_format(chain):
    with pytest.raises(ValueError, match="Invalid input key: prex\n Expected format: "
                                         "node_name/input_name"):
        chain.run_policy({"prex": torch.zeros(1, 4)})


def test_wrong_input_shape(chain):
    with pytest.raises(ValueError, match=r"Shape mismatch for input 'pre/x': expected "
                                         r"\(1, 4\), got \(1, 5\)"):
        chain.run_policy({"pre/x": torch.zeros(1, 5)})


def test_wrong_input_dtype(chain):
    with pytest.raises(TypeError, match="Dtype mismatch for input 'pre/x': expected "
                                        "torch.float32, got torch.float64"):
        chain.run_policy({"pre/x": torch.zeros(1, 4, dtype=torch.float64)})


def test_non_tensor_input(chain):
    with pytest.raises(TypeError, match="Input 'pre/x' must be a tensor"):
        chain.run_policy({"pre/x": [[0.0] * 4]})


def test_bad_input_leaves_state_untouched(chain):
    x = torch.ones(1, 4)
    chain.run_policy({"pre/x": x})
    with pytest.raises(ValueError):
        chain.run_policy({"pre/x": torch.zeros(1, 4) + 7, "post/x": torch.zeros(2)})
    assert chain.value_dict["pre"]["x"] is x


def test_feedback_input_override_for_one_step(tmp_path):
    manager = InferenceManager(mixed_bundle(tmp_path))
    x = torch.randn(1, 3)
    out = manager.run_policy({"pre/x": x, "policy/h_in": torch.zeros(1, 3)})
    h = torch.tanh(x * 2 + 1)
    torch.testing.assert_close(out["blend/out"], 0.8 + 0.2 * 2 * h + 1.0)
    torch.testing.assert_close(manager.value_dict["policy"]["h_in"], h)


# ---- the C program directly -------------------------------------------------------------


def make_program(calls, noutputs=None, **overrides):
    n = len(calls)
    kwargs = dict(names=[f"n{i}" for i in range(n)], calls=calls,
                  inputs=[[i] for i in range(n)], noutputs=noutputs or [1] * n,
                  dests=[[i + 1] for i in range(n)], results=[("out", n)], commits=[],
                  input_index={"n0/x": 0}, slot_keys=[f"s{i}" for i in range(n + 1)],
                  shapes=[(2,)] + [None] * n, dtypes=[torch.float32] + [None] * n,
                  graph_inputs=["n0/x"])
    kwargs.update(overrides)
    return _core.Program(**kwargs)


def test_program_output_count_checked():
    program = make_program([lambda x: (x, x)])
    program.set(0, torch.zeros(2))
    with pytest.raises(RuntimeError, match="Node 'n0': Expected 1 outputs, got 2"):
        program.run({})
    program = make_program([lambda x: x], noutputs=[2], dests=[[1], [1]])
    program.set(0, torch.zeros(2))
    with pytest.raises(RuntimeError, match="Node 'n0': Expected 2 outputs, got 1"):
        program.run({})


def test_program_errors_propagate_and_unwraps_single():
    def boom(x):
        raise ZeroDivisionError("inside the model")

    program = make_program([lambda x: (x + 1,), boom])
    program.set(0, torch.zeros(2))
    with pytest.raises(ZeroDivisionError, match="inside the model"):
        program.run({})
    torch.testing.assert_close(program.get(1), torch.ones(2))  # unwrapped 1-tuple


def test_program_rejects_bad_construction():
    with pytest.raises(ValueError, match="out of range"):
        make_program([lambda x: x], dests=[[5]])
    with pytest.raises(TypeError, match="not callable"):
        make_program([3])
    with pytest.raises(ValueError, match="no destination"):
        make_program([lambda x: x], dests=[[]])
    with pytest.raises(IndexError):
        make_program([lambda x: x]).get(99)


def test_program_many_arguments():
    n = 12
    program = _core.Program(
        names=["wide"], calls=[lambda *a: sum(a)], inputs=[list(range(n))], noutputs=[1],
        dests=[[n]], results=[("wide/y", n)], commits=[], input_index={},
        slot_keys=[f"s{i}" for i in range(n + 1)], shapes=[None] * (n + 1),
        dtypes=[None] * (n + 1), graph_inputs=[])
    for i in range(n):
        program.set(i, torch.tensor(float(i)))
    assert program.run({})["wide/y"].item() == sum(range(n))
    assert len(program.values()) == n + 1 and program.nslots == n + 1


def test_program_gc_breaks_cycles():
    class Holder:
        def __call__(self, x):
            return x

    holder = Holder()
    program = make_program([holder])
    holder.program = program  # cycle through a callable
    program.set(0, torch.zeros(2))
    program.run({})
    ref = weakref.ref(holder)
    del holder, program
    gc.collect()
    assert ref() is None


def test_program_inner_len_lies():
    # __len__ says 0, __iter__ yields many: the slot array must still fit
    class Liar:
        def __len__(self):
            return 0

        def __iter__(self):
            return iter([0] * 100000)

    program = make_program([lambda *a: a[0]], inputs=[Liar()])
    program.set(0, torch.zeros(2))
    torch.testing.assert_close(program.run({})["out"], torch.zeros(2))
    with pytest.raises(ValueError, match="out of range"):
        make_program([lambda x: x], dests=[Liar(), [7]])


def test_program_groups_mutated_while_read():
    outer = []

    class Shrinks:
        def __len__(self):
            outer.clear()
            return 1

        def __iter__(self):
            outer.clear()
            return iter([0])

    outer.extend([Shrinks(), [0], [0]])
    with pytest.raises(ValueError, match="inputs: expected 1 entries"):
        make_program([lambda x: x], inputs=outer)


def test_program_input_index_is_copied():
    index = {"n0/x": 0}
    program = make_program([lambda x: x], input_index=index)
    index["n0/x"] = 10**6
    index["n0/y"] = 10**6
    out = program.run({"n0/x": torch.ones(2)})
    torch.testing.assert_close(out["out"], torch.ones(2))
    with pytest.raises(KeyError, match="Unknown input key"):
        program.run({"n0/y": torch.ones(2)})


def test_program_inputs_mutated_during_check():
    inputs = {}

    class Sneaky:
        @property
        def dtype(self):
            inputs.clear()
            inputs.update({f"k{i}": i for i in range(100)})
            return torch.float32

        shape = (2,)

    inputs["n0/x"] = Sneaky()
    program = make_program([lambda x: x])
    out = program.run(inputs)
    assert isinstance(out["out"], Sneaky)


def test_program_list_output_mutated_by_clone():
    kept = []

    class Out:
        def clone(self):
            kept.clear()
            return Out()

    def node(x):
        kept[:] = [Out(), Out()]
        return kept

    program = make_program([node], noutputs=[2], dests=[[1, 1, 1], [1]])
    program.set(0, torch.zeros(2))
    program.run({})
    assert isinstance(program.get(1), Out)


def test_program_output_count_overflow():
    big = 2**63 - 1
    with pytest.raises(OverflowError):
        make_program([lambda x: x, lambda x: x], noutputs=[big, big])


def test_program_results_error_releases_keys():
    key = object()
    import sys

    before = sys.getrefcount(key)
    with pytest.raises(ValueError, match="out of range"):
        make_program([lambda x: x], results=[(key, 1), ("b", 99)])
    with pytest.raises(TypeError, match="2-tuples"):
        make_program([lambda x: x], results=[(key, 1), 3])
    gc.collect()
    assert sys.getrefcount(key) == before


def _rss_kb() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# RSS moves in pages and allocator chunks: an arena or cache that grows once (glibc's
# heap top, onnxruntime's arena, a pymalloc arena) is a one-off jump of up to several
# MB, which made a plain "RSS grew < 4 MB over 20000 steps" flaky.  A leak instead
# adds to every stretch of steps.  So RSS is sampled every LEAK_INTERVAL steps, the
# LEAK_JUMPS_DROPPED largest single-interval jumps are taken out, and the
# least-squares slope of what is left must stay under LEAK_BOUND bytes per step:
# a leak of a 64-byte malloc per step (~80 bytes with malloc's header) fails it.
LEAK_STEPS, LEAK_INTERVAL, LEAK_JUMPS_DROPPED, LEAK_BOUND = 20000, 500, 3, 32.0


def rss_growth_per_step(steps: list[int], rss: list[int], drop: int = LEAK_JUMPS_DROPPED) -> float:
    """Bytes per step: the least-squares slope of RSS over steps, its `drop` largest
    single-interval increases taken out (one-off allocator growth, not a leak)."""
    increments = [b - a for a, b in zip(rss, rss[1:])]
    for index in sorted(range(len(increments)), key=increments.__getitem__)[-drop:]:
        increments[index] = min(increments[index], 0)
    level, series = 0, [0]
    for increment in increments:
        level += increment
        series.append(level)
    mean_x, mean_y = sum(steps) / len(steps), sum(series) / len(series)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(steps, series))
    return num / sum((x - mean_x) ** 2 for x in steps)


def test_leak_slope_ignores_one_off_jumps_and_sees_steady_growth():
    steps = list(range(0, LEAK_STEPS + 1, LEAK_INTERVAL))
    page, chunk = 4096, 132 * 1024
    # flat, with three one-off jumps (5 MB mid-run as in the flaky failure) and page noise
    flat = [(5 << 20) * (x >= 10000) + (640 << 10) * (x >= 4500) + chunk * (x >= 16000)
            + page * (i % 3 == 0) for i, x in enumerate(steps)]
    assert abs(rss_growth_per_step(steps, flat)) < LEAK_BOUND / 4
    # 80 bytes per step, arriving in 132 KB heap extensions, with a 5 MB jump on top
    leaking = [chunk * (80 * x // chunk) + (5 << 20) * (x >= 10000) for x in steps]
    assert rss_growth_per_step(steps, leaking) > LEAK_BOUND * 2
    smooth = [80 * x for x in steps]
    assert rss_growth_per_step(steps, smooth) > LEAK_BOUND * 2


def test_no_leak_over_20000_steps(tmp_path):
    manager = InferenceManager(mixed_bundle(tmp_path))
    x = torch.randn(1, 3)
    inputs = {"pre/x": x}
    # A long warm-up: in a process that already loaded many bundles the allocators
    # (glibc arenas, onnxruntime's threads) still grow by a few MiB over the first
    # thousands of steps; a leak keeps growing after that.
    for _ in range(10000):
        manager.run_policy(inputs)
    steps, rss = [], []
    for step in range(LEAK_STEPS + 1):
        if step % LEAK_INTERVAL == 0:
            steps.append(step)
            rss.append(_rss_kb() * 1024)
        manager.run_policy(inputs)
    growth = rss_growth_per_step(steps, rss)
    assert growth < LEAK_BOUND or support.under_sanitizer(), (  # ASan quarantines frees
        f"RSS grows {growth:.1f} bytes/step over {LEAK_STEPS} steps; samples (KiB above the "
        f"first): {[(r - rss[0]) >> 10 for r in rss]}")
    # References and objects (the error path's too): tests/test_leaks.py, exactly.
