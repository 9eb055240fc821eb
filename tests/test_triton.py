"""`leapp triton`: model repositories checked by parsing their configs, then served for real.

The configs are parsed with tritonclient's ModelConfig protobuf definitions.  The
served tests start the nvidia-pytriton wheel's `tritonserver` once for the module
on free loopback ports (its python backend; the wheel has no onnxruntime or
pytorch backend), load one repository holding a feed-forward ensemble and a
sequence model with feedback, and compare every served output with
InferenceManager runs of the same bundles.  The server is stopped by its pid.
Only a missing `tritonserver` binary skips them: a server that exits or a model
that fails to load fails them (a test plants a fault in a generated model.py).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file

import leapp
from leapp import InferenceManager, annotate
from support import under_sanitizer

pytest.importorskip("tritonclient.grpc.model_config_pb2",
                    reason="tritonclient[grpc] is not installed (pip install -e '.[test]')")

from leapp import cli  # noqa: E402
from leapp.serving.triton import TritonRepositoryError, read_config, write_repository  # noqa: E402

FF_GRAPH, FB_GRAPH, FLEET_GRAPH = "ff_triton", "fb_triton", "fleet_triton"
FLEET = 8  # robots of the served fleet
WEIGHTS = torch.linspace(-1.0, 1.0, 18).reshape(6, 3)
INITIAL_MEMORY = torch.tensor([0.3, -0.2])


def _feed_forward(root: str) -> str:
    """encode (jit) -> policy (onnx) -> critic (pt2), features fanned out to both."""
    leapp.start(name=FF_GRAPH, save_path=root)
    obs, goal = annotate.input_tensors("encode", {"obs": torch.randn(1, 4),
                                                  "goal": torch.randn(1, 2)})
    features = torch.cat([torch.tanh(obs), goal], dim=-1)
    annotate.output_tensors("encode", {"features": features}, export_with="jit")
    policy_in = annotate.input_tensors("policy", {"features": features})
    action = policy_in @ WEIGHTS
    annotate.output_tensors("policy", {"action": action}, export_with="onnx")
    seen, taken = annotate.input_tensors("critic", {"features": features, "action": action})
    value = seen.sum(-1, keepdim=True) * taken.mean(-1, keepdim=True)
    best = torch.argmax(taken, dim=-1)
    annotate.output_tensors("critic", {"value": value, "best": best}, export_with="pt2")
    leapp.stop()
    leapp.compile_graph()
    return os.path.join(root, FF_GRAPH, f"{FF_GRAPH}.yaml")


def _feedback(root: str) -> str:
    """policy mixes an observation with a memory that update blends; non-zero initial memory."""
    leapp.start(name=FB_GRAPH, save_path=root)
    memory = INITIAL_MEMORY.clone()
    for _ in range(2):
        obs, mem = annotate.input_tensors("policy", {"obs": torch.rand(2),
                                                     "memory": memory})
        context = torch.tanh(obs - 0.5 + 0.5 * mem)
        action = torch.clamp(context * 1.5, -1.0, 1.0)
        annotate.output_tensors("policy", {"context": context, "action": action},
                                export_with="jit")
        ctx, previous = annotate.input_tensors("update", {"context": context,
                                                          "previous": memory})
        memory = 0.7 * previous + 0.3 * ctx
        annotate.output_tensors("update", {"memory": memory}, export_with="onnx")
    leapp.stop()
    leapp.compile_graph()
    return os.path.join(root, FB_GRAPH, f"{FB_GRAPH}.yaml")


def _fleet_feedback(root: str) -> str:
    """A robot's pipeline with a leading dimension of 1: obs [1, 3], a GRU cell's state [1, 4]."""
    torch.manual_seed(2)
    cell = torch.nn.GRUCell(3, 4).eval()
    head = torch.nn.Linear(4, 2).eval()
    leapp.start(name=FLEET_GRAPH, save_path=root)
    hidden = torch.full((1, 4), 0.1)
    with torch.no_grad():
        for _ in range(2):
            obs = annotate.input_tensors("policy", {"obs": torch.randn(1, 3)})
            h = annotate.state_tensors("policy", {"hidden": hidden})
            h_new = cell(obs, h)
            hidden = annotate.update_state("policy", {"hidden": h_new})
            latent = annotate.output_tensors("policy", {"latent": h_new * 1.0},
                                             export_with="jit")
            z = annotate.input_tensors("act", {"latent": latent})
            annotate.output_tensors("act", {"action": torch.tanh(head(z))}, export_with="onnx")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    return os.path.join(root, FLEET_GRAPH, f"{FLEET_GRAPH}.yaml")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("triton_bundles"))
    ff_yaml, fb_yaml, fleet_yaml = _feed_forward(root), _feedback(root), _fleet_feedback(root)
    fused = leapp.fuse(fb_yaml, out=os.path.join(root, "fb_fused.onnx"))
    return {"root": root, "ff": ff_yaml, "fb": fb_yaml, "fused": fused, "fleet": fleet_yaml}


def _configs(repo: str) -> dict:
    return {name: read_config(os.path.join(repo, name, "config.pbtxt"))
            for name in sorted(os.listdir(repo))}


def _dims(config_tensors) -> dict:
    return {t.name: (list(t.dims), t.data_type) for t in config_tensors}


# ---- repository generation --------------------------------------------------------------

@pytest.mark.parametrize("serve_with", ["native", "python"])
def test_feed_forward_repository(bundles, tmp_path, serve_with):
    from tritonclient.grpc import model_config_pb2 as mc
    repo = str(tmp_path / "repo")
    # batch=False: one model per node and an ensemble (the batched default is tested below)
    result = write_repository(bundles["ff"], repo, serve_with=serve_with, batch=False)
    configs = _configs(repo)
    assert sorted(configs) == sorted(result.models) == [
        "ff_triton", "ff_triton.critic", "ff_triton.encode", "ff_triton.policy"]
    assert result.entry == "ff_triton" and not result.sequence
    ensemble = configs["ff_triton"]
    assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 0
    assert _dims(ensemble.input) == {"encode/obs": ([1, 4], mc.TYPE_FP32),
                                     "encode/goal": ([1, 2], mc.TYPE_FP32)}
    assert _dims(ensemble.output) == {"critic/value": ([1, 1], mc.TYPE_FP32),
                                      "critic/best": ([1], mc.TYPE_INT64)}
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["ff_triton.encode", "ff_triton.policy",
                                             "ff_triton.critic"]
    # every node's tensors, through its own names, wired exactly as data_flow says
    backends = {"native": {"encode": "pytorch", "policy": "onnxruntime", "critic": "python"},
                "python": {"encode": "python", "policy": "python", "critic": "python"}}
    wiring = {}
    for step in steps:
        node = step.model_name.split(".", 1)[1]
        config = configs[step.model_name]
        assert config.backend == backends[serve_with][node]
        names_in = [t.name for t in config.input]
        names_out = [t.name for t in config.output]
        if config.backend == "pytorch":
            assert names_in == ["INPUT__0", "INPUT__1"][:len(names_in)]
            assert names_out == [f"OUTPUT__{i}" for i in range(len(names_out))]
        assert set(step.input_map) == set(names_in)
        for tensor, source in step.input_map.items():
            wiring[(node, tensor)] = source
        for tensor, target in step.output_map.items():
            assert target.startswith(f"{node}/")
    assert wiring[("policy", "features")] == "encode/features"
    assert wiring[("critic", "features")] == "encode/features"
    assert wiring[("critic", "action")] == "policy/action"
    first_in = "INPUT__0" if serve_with == "native" else "obs"
    assert wiring[("encode", first_in)] == "encode/obs"
    files = {node: sorted(os.listdir(os.path.join(repo, f"ff_triton.{node}", "1")))
             for node in ("encode", "policy", "critic")}
    if serve_with == "native":
        assert files["encode"] == ["model.pt"] and files["policy"] == ["model.onnx"]
        assert configs["ff_triton.encode"].default_model_filename == "model.pt"
    else:
        assert files["encode"] == ["encode.pt", "leapp_model.json", "model.py"]
    assert files["critic"] == ["critic.pt2", "leapp_model.json", "model.py"]


@pytest.mark.parametrize("serve_with", ["native", "python"])
def test_feedback_repository(bundles, tmp_path, serve_with):
    from tritonclient.grpc import model_config_pb2 as mc
    repo = str(tmp_path / "repo")
    result = write_repository(bundles["fb"], repo, serve_with=serve_with,
                              fused_model=bundles["fused"], max_sequences=4)
    assert result.sequence and result.entry == "fb_triton" and result.models == ["fb_triton"]
    config = _configs(repo)["fb_triton"]
    assert _dims(config.input) == {"policy/obs": ([2], mc.TYPE_FP32)}
    assert _dims(config.output) == {"policy/action": ([2], mc.TYPE_FP32)}
    batching = config.sequence_batching
    assert batching.oldest.max_candidate_sequences == 4
    initial = load_file(os.path.join(os.path.dirname(bundles["fb"]),
                                     f"{FB_GRAPH}_initial_values.safetensors"))
    if serve_with == "native":
        assert config.backend == "onnxruntime" and not batching.control_input
        states = [(s.input_name, s.output_name) for s in batching.state]
        assert states == [("policy/memory", "policy/memory__next"),
                          ("update/previous", "update/previous__next")]
        for state in batching.state:
            (start,) = state.initial_state
            assert list(state.dims) == list(start.dims) == [2]
            raw = open(os.path.join(repo, "fb_triton", "initial_state", start.data_file),
                       "rb").read()
            # the bundle's own initial value, byte for byte (non-zero here)
            assert raw == initial[state.input_name].numpy().tobytes()
            assert torch.equal(initial[state.input_name], INITIAL_MEMORY)
        assert os.listdir(os.path.join(repo, "fb_triton", "1")) == ["model.onnx"]
    else:
        assert config.backend == "python" and not batching.state
        controls = {c.name: c.control[0] for c in batching.control_input}
        kinds = mc.ModelSequenceBatching.Control
        assert controls["START"].kind == kinds.CONTROL_SEQUENCE_START
        assert controls["END"].kind == kinds.CONTROL_SEQUENCE_END
        assert controls["CORRID"].kind == kinds.CONTROL_SEQUENCE_CORRID
        assert controls["CORRID"].data_type == mc.TYPE_UINT64
        assert sorted(os.listdir(os.path.join(repo, "fb_triton", "1"))) == [
            "fused.onnx", "leapp_model.json", "model.py"]


def test_refusals_leave_nothing_behind(bundles, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        write_repository(bundles["ff"], str(taken))
    with pytest.raises(ValueError, match="serve_with"):
        write_repository(bundles["ff"], str(tmp_path / "r"), serve_with="tensorrt")
    # a dtype Triton has no type for: named with node and tensor, nothing written
    copy = tmp_path / "bundle"
    shutil.copytree(os.path.dirname(bundles["ff"]), copy)
    yaml_path = copy / f"{FF_GRAPH}.yaml"
    text = yaml_path.read_text()
    yaml_path.write_text(text.replace("dtype: int64", "dtype: complex64", 1))
    with pytest.raises(TritonRepositoryError,
                       match="node 'critic', output 'best': dtype 'complex64'"):
        write_repository(str(yaml_path), str(tmp_path / "r"))
    assert sorted(os.listdir(tmp_path)) == ["bundle", "taken"]


def test_recorded_fused_model_is_served(bundles, tmp_path, monkeypatch):
    import leapp.serving.fusion
    copy = tmp_path / "bundle"
    shutil.copytree(os.path.dirname(bundles["fb"]), copy)
    yaml_path = str(copy / f"{FB_GRAPH}.yaml")
    # recorded under the YAML's 'fused' as leapp.fuse does for a model inside the bundle
    recorded = str(copy / f"{FB_GRAPH}_fused.onnx")
    shutil.copy(bundles["fused"], recorded)
    leapp.serving.fusion.record(yaml_path, recorded, "onnx")

    def no_second_fuse(*args, **kwargs):
        raise AssertionError("the recorded fused model should have been used")
    monkeypatch.setattr(leapp.serving.fusion, "fuse", no_second_fuse)
    write_repository(yaml_path, str(tmp_path / "repo"), serve_with="python")
    served = tmp_path / "repo" / FB_GRAPH / "1" / "fused.onnx"
    assert served.read_bytes() == open(recorded, "rb").read()
    # a fused model of another pipeline is refused, naming both
    renamed = copy / "other.yaml"
    shutil.copy(yaml_path, renamed)
    with pytest.raises(TritonRepositoryError, match="of pipeline 'fb_triton', not 'other'"):
        write_repository(str(renamed), str(tmp_path / "other"), fused_model=recorded)
    assert not os.path.exists(tmp_path / "other")


def test_output_named_like_a_graph_input(bundle, tmp_path):
    # an ensemble cannot have an input and an output of one name: "__out", as in fused models
    leapp.start(name="same_name", save_path=bundle.root)
    x = annotate.input_tensors("twice", {"x": torch.randn(3)})
    annotate.output_tensors("twice", {"x": x * 2.0}, export_with="jit")
    leapp.stop()
    leapp.compile_graph()
    result = write_repository(os.path.join(bundle.dir("same_name"), "same_name.yaml"),
                              str(tmp_path / "repo"), serve_with="python", batch=False)
    ensemble = read_config(str(tmp_path / "repo" / "same_name" / "config.pbtxt"))
    assert [t.name for t in ensemble.input] == ["twice/x"]
    assert [t.name for t in ensemble.output] == ["twice/x__out"]
    (step,) = ensemble.ensemble_scheduling.step
    assert dict(step.input_map) == {"x": "twice/x"}
    assert dict(step.output_map) == {"x": "twice/x__out"}
    assert list(result.outputs) == ["twice/x__out"]


def test_cli(bundles, tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["triton", bundles["fb"], str(tmp_path / "repo"),
                         "--fused", bundles["fused"], "--serve-with", "python"]) == 0
    text = out.getvalue()
    assert "call 'fb_triton', a sequence model" in text
    assert "input  policy/obs: FP32[2]" in text
    assert read_config(str(tmp_path / "repo" / "fb_triton" / "config.pbtxt")).backend == "python"
    assert cli.main(["triton", bundles["ff"], str(tmp_path / "repo")]) == cli.EXIT_USAGE


@pytest.mark.parametrize("serve_with", ["native", "python"])
def test_fleet_repository(bundles, tmp_path, serve_with):
    from tritonclient.grpc import model_config_pb2 as mc
    repo = str(tmp_path / "repo")
    result = write_repository(bundles["fleet"], repo, serve_with=serve_with, fleet_size=40,
                              queue_delay_us=500)
    assert result.sequence and result.models == [FLEET_GRAPH]
    assert result.max_batch_size == result.fleet_size == 40
    # a robot sends and gets the tensors InferenceManager takes and gives
    assert result.inputs == {"policy/obs": ("FP32", [1, 3])}
    assert result.outputs == {"act/action": ("FP32", [1, 2])}
    config = _configs(repo)[FLEET_GRAPH]
    assert config.max_batch_size == 40
    assert _dims(config.input) == {"policy/obs": ([3], mc.TYPE_FP32)}
    assert _dims(config.output) == {"act/action": ([2], mc.TYPE_FP32)}
    oldest = config.sequence_batching.oldest
    assert oldest.max_queue_delay_microseconds == 500
    (group,) = config.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_CPU
    if serve_with == "native":
        assert config.backend == "onnxruntime" and oldest.max_candidate_sequences == 40
        (state,) = config.sequence_batching.state
        assert (state.input_name, state.output_name) == ("policy/hidden",
                                                         "policy/hidden__next")
        assert list(state.dims) == [4]  # the batch dimension is Triton's
        files = os.listdir(os.path.join(repo, FLEET_GRAPH, "1"))
        assert files == ["model.onnx"]
        model = onnx.load(os.path.join(repo, FLEET_GRAPH, "1", "model.onnx"))
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "robots"
    else:
        # the python model sees a robot beyond the fleet, to refuse it
        assert config.backend == "python" and oldest.max_candidate_sequences == 48
        assert {c.name for c in config.sequence_batching.control_input} == {
            "START", "END", "CORRID"}
        spec = json.load(open(os.path.join(repo, FLEET_GRAPH, "1", "leapp_model.json")))
        assert spec == {"kind": "fleet", "name": FLEET_GRAPH,
                        "model_file": "fused_batched.onnx", "fleet_size": 40}
    gpu = write_repository(bundles["fleet"], str(tmp_path / "gpu"), serve_with=serve_with,
                           instances="gpu")
    config = read_config(str(tmp_path / "gpu" / FLEET_GRAPH / "config.pbtxt"))
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert gpu.fleet_size == config.max_batch_size == 128  # the default fleet size


def test_feed_forward_batched_by_default(bundles, tmp_path):
    from tritonclient.grpc import model_config_pb2 as mc
    result = write_repository(bundles["ff"], str(tmp_path / "repo"))
    # one fused model (the pt2 node too) in onnxruntime, dynamic batching, no ensemble
    assert result.models == [FF_GRAPH] and not result.sequence
    config = _configs(str(tmp_path / "repo"))[FF_GRAPH]
    assert config.backend == "onnxruntime" and config.max_batch_size == 128
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert _dims(config.input) == {"encode/obs": ([4], mc.TYPE_FP32),
                                   "encode/goal": ([2], mc.TYPE_FP32)}
    assert result.inputs == {"encode/obs": ("FP32", [1, 4]), "encode/goal": ("FP32", [1, 2])}


def test_fleet_size_bounds(bundles, tmp_path):
    from leapp.serving.triton import MAX_FLEET_SIZE
    with pytest.raises(ValueError, match=f"serves at most {MAX_FLEET_SIZE} robots"):
        write_repository(bundles["fleet"], str(tmp_path / "r"), fleet_size=MAX_FLEET_SIZE + 1)
    with pytest.raises(ValueError, match="not both"):
        write_repository(bundles["fleet"], str(tmp_path / "r"), fleet_size=8, max_sequences=9)
    with pytest.raises(ValueError, match="instances='tpu'"):
        write_repository(bundles["fleet"], str(tmp_path / "r"), instances="tpu")
    assert not os.path.exists(tmp_path / "r")


# ---- served for real ----------------------------------------------------------------------

def _require_tritonserver() -> None:
    """Skip where no ``tritonserver`` binary exists; nothing else turns into a skip."""
    from leapp.serving.triton_server import TritonUnavailable, find_tritonserver
    try:
        find_tritonserver()
    except TritonUnavailable as exc:
        pytest.skip(f"no tritonserver binary here: {exc}")


def test_failed_models_are_read_from_the_server_log():
    from leapp.serving.triton_server import failed_models
    log = ("I1127 18:51:40.57 12163 server.cc:674] model table\n"
           "E1127 18:51:40.58 12163 model_lifecycle.cc:654] \"failed to load 'fb.policy' "
           "version 1: Internal: RuntimeError: planted\\n\\nAt:\\n  model.py(61): "
           "initialize\\n\"\n"
           "E1127 18:51:40.59 12163 model_lifecycle.cc:654] failed to load 'fb.update' "
           "version 3: Invalid argument: unexpected platform\n")
    assert failed_models(log) == {"fb.policy": "Internal: RuntimeError: planted",
                                  "fb.update": "Invalid argument: unexpected platform"}
    assert failed_models("I1127 server.cc:674] all models READY\n") == {}


def test_server_start_fails_naming_a_model_whose_model_py_raises(bundles, tmp_path):
    """A fault planted in a generated model.py: the start raises, naming the model, and
    leaves no server behind (the served tests above fail the same way, not skip)."""
    if under_sanitizer():
        pytest.skip("the ASan preload is inherited by tritonserver and its python stubs")
    from leapp.serving.triton_server import TritonServer, TritonServerError
    _require_tritonserver()
    result = write_repository(bundles["fb"], str(tmp_path / "repo"), serve_with="python",
                              fused_model=bundles["fused"])
    (model,) = result.models
    source = tmp_path / "repo" / model / "1" / "model.py"
    text = source.read_text()
    hook = "    def initialize(self, args: dict) -> None:\n"
    assert text.count(hook) == 1, "the generated model.py has no initialize() to plant in"
    source.write_text(text.replace(hook, hook + "        raise RuntimeError("
                                   "'fault planted by the test')\n"))
    server = TritonServer(result.path, ready_timeout=180)
    with pytest.raises(TritonServerError) as err:
        server.start()
    assert err.value.models == {model: "Internal: RuntimeError: fault planted by the test"}
    assert err.value.returncode not in (None, 0)
    assert f"model '{model}' failed to load: Internal: RuntimeError: fault planted" \
        in str(err.value)
    assert server.process is None  # stopped and cleaned up by start() itself

@pytest.fixture(scope="module")
def server(bundles, tmp_path_factory):
    if under_sanitizer():
        pytest.skip("the ASan preload is inherited by tritonserver and its python stubs; the "
                    "served round trip is checked by the normal run")
    from leapp.serving.triton_server import TritonServer
    _require_tritonserver()
    root = tmp_path_factory.mktemp("triton_served")
    served = root / "repository"
    served.mkdir()
    entries = {}
    for key, fused, size in (("ff", None, None), ("fb", bundles["fused"], None),
                             ("fleet", None, FLEET)):
        part = root / key
        result = write_repository(bundles[key], str(part), serve_with="python",
                                  fused_model=fused, fleet_size=size)
        for model in result.models:  # one repository, one server start for both
            os.rename(part / model, served / model)
        entries[key] = result
    server = TritonServer(str(served), ready_timeout=180)
    server.start()  # a server that exits (a model that fails to load) fails the tests
    try:
        yield server, entries
    finally:
        pid = server.process.pid if server.process else None
        server.stop()
        if pid is not None:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def _infer_input(http, name: str, value: torch.Tensor, datatype: str):
    tensor = http.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value.numpy())
    return tensor


def test_served_feedback_two_robots_interleaved(bundles, server):
    import tritonclient.http as http
    triton, entries = server
    entry = entries["fb"]
    client = http.InferenceServerClient(triton.http_url)
    robots = {11: InferenceManager(bundles["fb"]), 12: InferenceManager(bundles["fb"])}
    generator = torch.Generator().manual_seed(3)
    for step in range(10):
        for robot, reference in robots.items():
            obs = torch.rand(2, generator=generator)
            result = client.infer(entry.entry, [_infer_input(http, "policy/obs", obs, "FP32")],
                                  sequence_id=robot, sequence_start=step == 0,
                                  sequence_end=step == 9)
            want = reference.run_policy({"policy/obs": obs})["policy/action"]
            np.testing.assert_allclose(result.as_numpy("policy/action"), want.numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=f"robot {robot} step {step}")
    # a new sequence on a finished robot's ID starts again from the bundle's initial values
    obs = torch.rand(2, generator=generator)
    result = client.infer(entry.entry, [_infer_input(http, "policy/obs", obs, "FP32")],
                          sequence_id=11, sequence_start=True, sequence_end=True)
    fresh = InferenceManager(bundles["fb"]).run_policy({"policy/obs": obs})["policy/action"]
    np.testing.assert_allclose(result.as_numpy("policy/action"), fresh.numpy(),
                               rtol=1e-5, atol=1e-6)
    client.close()


def test_served_ensemble(bundles, server):
    import tritonclient.grpc as grpc
    triton, entries = server
    entry = entries["ff"]
    client = grpc.InferenceServerClient(triton.grpc_url)
    reference = InferenceManager(bundles["ff"])
    for _ in range(3):
        feed = reference.get_mock_input()
        inputs = []
        for name, value in feed.items():
            tensor = grpc.InferInput(name, list(value.shape), entry.inputs[name][0])
            tensor.set_data_from_numpy(value.numpy())
            inputs.append(tensor)
        result = client.infer(entry.entry, inputs)
        for name, want in reference.run_policy(feed).items():
            got = result.as_numpy(name)
            assert got.dtype == want.numpy().dtype, name
            # an output without a leading dimension of 1 arrives with one (docs/triton.md)
            assert list(got.shape) == entry.outputs[name][1], name
            got = got.reshape(want.shape)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    client.close()



def test_served_fleet(bundles, server):
    """8 robots step together (one batch per step), each equal to its own InferenceManager."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException
    triton, entries = server
    entry = entries["fleet"]
    client = http.InferenceServerClient(triton.http_url, concurrency=FLEET + 1)
    robots = {100 + r: InferenceManager(bundles["fleet"]) for r in range(FLEET)}
    generator = torch.Generator().manual_seed(4)
    before = client.get_inference_statistics(entry.entry)["model_stats"][0]
    steps = 5
    for step in range(steps):
        feeds = {robot: torch.randn(1, 3, generator=generator) for robot in robots}
        pending = {robot: client.async_infer(
            entry.entry, [_infer_input(http, "policy/obs", obs, "FP32")], sequence_id=robot,
            sequence_start=step == 0, sequence_end=step == steps - 1)
            for robot, obs in feeds.items()}
        if step == 1:  # one robot more than the fleet: refused at once, not left waiting
            extra = _infer_input(http, "policy/obs", torch.zeros(1, 3), "FP32")
            with pytest.raises(InferenceServerException, match="the fleet is full: 8 robots"):
                client.infer(entry.entry, [extra], sequence_id=999, sequence_start=True,
                             sequence_end=True)
        for robot, request in pending.items():
            got = request.get_result().as_numpy("act/action")
            want = robots[robot].run_policy({"policy/obs": feeds[robot]})["act/action"]
            assert got.shape == tuple(want.shape)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"robot {robot} step {step}")
    after = client.get_inference_statistics(entry.entry)["model_stats"][0]
    requests = int(after["inference_count"]) - int(before["inference_count"])
    # every robot's request reached the batched model (how many share one execution
    # depends on timing; bench/fleet.py measures it)
    assert requests == FLEET * steps + 1  # the refused robot's request was executed too
    client.close()
