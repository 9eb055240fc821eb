"""The public API of the foundation: lifecycle, payloads, method, semantics, passthrough."""
from __future__ import annotations

import logging
import os

import pytest
import torch

import leapp
from leapp import InputKindEnum, OutputKindEnum, TemporalAxis, TensorSemantics, _core, annotate


def _chain(save_path, name="g", **start):
    leapp.start(name, save_path=save_path, **start)
    x = annotate.input_tensors("a", {"x": torch.ones(2, 3)})
    y = x * 2 + 1
    annotate.output_tensors("a", {"y": y}, export_with="jit")
    y_in = annotate.input_tensors("b", {"y": y})
    annotate.output_tensors("b", {"z": y_in.sum(dim=1)}, export_with="jit")
    leapp.stop()


# ---- passthrough with no session ------------------------------------------------

def test_annotations_return_the_same_objects_without_a_session():
    a, b = torch.randn(2), torch.randn(3)
    assert annotate.input_tensors("n", {"a": a}) is a
    both = annotate.input_tensors("n", {"a": a, "b": b})
    assert both[0] is a and both[1] is b
    assert annotate.output_tensors("n", {"a": a}, export_with="jit") is a
    assert annotate.state_tensors("n", {"h": a}) is a
    assert annotate.update_state("n", {"h": a}) is a
    assert annotate.register_buffer("n", {"buf": a}) is a
    assert annotate.module("n", torch.nn.Linear(2, 2)) is None
    assert annotate.mirror_leapp_tags(a, b) is b
    nested = {"obs": {"pos": a, "vel": [b, a]}}
    assert annotate.input_tensors("n", nested) is nested["obs"]
    sem = TensorSemantics(name="q", ref=a, kind=InputKindEnum.JOINT_POSITION)
    assert annotate.input_tensors("n", sem) is a
    assert _core.nodes() == {}


def test_method_is_a_plain_call_without_a_session():
    calls = []

    @annotate.method(export_with="jit")
    def double(x):
        calls.append(x)
        return x * 2

    t = torch.ones(3)
    assert torch.equal(double(t), t * 2)
    assert calls == [t] and type(calls[0]) is torch.Tensor
    assert double.__name__ == "double" and double.__wrapped__ is not None


def test_unknown_annotation_is_an_attribute_error():
    with pytest.raises(AttributeError, match="leapp.annotate has no attribute 'bogus'"):
        annotate.bogus


# ---- lifecycle ----------------------------------------------------------------

def test_start_creates_directory_and_log(bundle):
    leapp.start("graph", save_path=bundle.root)
    assert os.path.isdir(bundle.dir("graph"))
    assert os.path.exists(os.path.join(bundle.dir("graph"), "log.txt"))
    leapp.stop()


def test_graph_name_may_be_a_path(bundle):
    _chain(bundle.root, name="runs/exp1/policy")
    leapp.compile_graph(visualize=False)
    target = os.path.join(bundle.root, "runs", "exp1", "policy")
    assert os.path.exists(os.path.join(target, "policy.yaml"))
    assert os.path.exists(os.path.join(target, "a.pt"))


@pytest.mark.parametrize("bad, error", [(3, TypeError), ("", ValueError), ("/", ValueError)])
def test_bad_graph_names(bad, error):
    with pytest.raises(error):
        leapp.start(bad)


def test_start_twice_resets_with_a_warning(bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    annotate.input_tensors("a", {"x": torch.ones(1)})
    with caplog.at_level(logging.WARNING, logger="leapp"):
        leapp.start("g", save_path=bundle.root)
    assert "calling start() again will reset the graph" in caplog.text
    assert _core.nodes() == {}
    leapp.stop()


def test_compile_returns_validation_results_and_writes_bundle(bundle):
    _chain(bundle.root)
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True}
    files = set(os.listdir(bundle.dir("g")))
    assert {"g.yaml", "a.pt", "b.pt", "log.txt"} <= files
    assert "g.png" not in files
    assert not any(f.startswith(".leapp-") for f in files)  # no temporary left behind


def test_compile_without_validation_returns_true(bundle):
    _chain(bundle.root)
    assert leapp.compile_graph(visualize=False, validate=False) is True


def test_visualize_writes_png(bundle):
    _chain(bundle.root)
    leapp.compile_graph(visualize=True)
    assert os.path.getsize(os.path.join(bundle.dir("g"), "g.png")) > 1000


def test_dry_run_writes_yaml_without_models(bundle):
    _chain(bundle.root, dry_run=True)
    assert leapp.compile_graph(visualize=False) is True
    files = os.listdir(bundle.dir("g"))
    assert "g.yaml" in files and not [f for f in files if f.endswith((".pt", ".onnx"))]
    spec = bundle.yaml("g")
    assert spec["models"]["a"]["parameters"]["model_path"] is None
    assert spec["pipeline"]["data_flow"] == {"a/y": ["b/y"]}


def test_non_traced_node_is_wired_but_not_exported(bundle):
    _chain(bundle.root, non_traced=["a"])
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True}
    spec = bundle.yaml("g")
    assert spec["models"]["a"]["parameters"]["backend"] is None
    assert spec["models"]["b"]["parameters"]["backend"] == "jit"
    assert spec["pipeline"]["data_flow"] == {"a/y": ["b/y"]}
    assert not os.path.exists(os.path.join(bundle.dir("g"), "a.pt"))


def test_recoverable_after_an_exception_in_traced_code(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError):
        torch.mm(x, x)  # a user error inside the node
    leapp.stop()
    _chain(bundle.root)
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True}


def test_yaml_system_information(bundle):
    _chain(bundle.root)
    leapp.compile_graph(visualize=False)
    info = bundle.yaml("g")["system information"]
    assert info["leapp config version"] == "1.3"
    assert info["torch version"] == str(torch.__version__)
    assert list(info) == sorted(info)
    text = open(os.path.join(bundle.dir("g"), "g.yaml")).read()
    assert "leapp config version: '1.3'" in text and "shape: [2, 3]" in text


# ---- payloads ---------------------------------------------------------------

def test_several_input_calls_accumulate_and_nested_names_flatten(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("n", {"a": torch.ones(2)})
    nested = annotate.input_tensors("n", {"obs": {"pos": torch.ones(2), "vel": [torch.ones(2),
                                                                              torch.ones(2)]}})
    assert isinstance(nested, dict) and type(nested["vel"][1]).__name__ == "TracedTensor"
    out = {"res": {"sum": a + nested["pos"] + nested["vel"][0] + nested["vel"][1]}}
    returned = annotate.output_tensors("n", out, export_with="jit")
    assert returned is out["res"] or returned == out["res"]
    leapp.stop()
    leapp.compile_graph(visualize=False)
    spec = bundle.yaml("g")["models"]["n"]
    assert [p["name"] for p in spec["inputs"]] == ["a", "obs_pos", "obs_vel_0", "obs_vel_1"]
    assert [p["name"] for p in spec["outputs"]] == ["res_sum"]


def test_output_tensors_returns_the_objects_passed(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    y, z = x + 1, x * 2
    assert annotate.output_tensors("n", {"y": y, "z": z}, export_with="jit") == (y, z)
    assert annotate.output_tensors is not None
    leapp.stop()


def test_unused_inputs_are_pruned_with_a_warning(bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    x, unused = annotate.input_tensors("n", {"x": torch.ones(2), "unused": torch.ones(3)})
    with caplog.at_level(logging.WARNING, logger="leapp"):
        annotate.output_tensors("n", {"y": x + 1}, export_with="jit")
    assert "unused" in caplog.text and "not used in the computation" in caplog.text
    leapp.stop()
    leapp.compile_graph(visualize=False)
    assert [p["name"] for p in bundle.yaml("g")["models"]["n"]["inputs"]] == ["x"]
    model = torch.jit.load(os.path.join(bundle.dir("g"), "n.pt"))
    assert torch.equal(model(torch.ones(2)), torch.full((2,), 2.0))


def test_static_outputs(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"input": torch.tensor([1.0, 2.0, 3.0])})
    annotate.output_tensors("n", {"computed": x + 1.0},
                            static_outputs={"static": torch.tensor([4.0, 5.0, 6.0])},
                            export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}
    model = torch.jit.load(os.path.join(bundle.dir("g"), "n.pt"))
    computed, static = model(torch.tensor([0.0, 0.0, 1.0]))
    assert torch.equal(computed, torch.tensor([1.0, 1.0, 2.0]))
    assert torch.equal(static, torch.tensor([4.0, 5.0, 6.0]))


def test_tensor_semantics_in_yaml(bundle):
    leapp.start("g", save_path=bundle.root)
    q = annotate.input_tensors("n", [
        TensorSemantics(name="q", ref=torch.zeros(4, 3), kind=InputKindEnum.JOINT_POSITION,
                        element_names=[TemporalAxis(period_ms=20), ["hip", "knee", "ankle"]]),
        TensorSemantics(name="v", ref=torch.zeros(4, 3), kind="custom/kind",
                        element_names="speed", extra={"unit": "rad/s"}),
    ])
    annotate.output_tensors("n", TensorSemantics(name="target", ref=q[0] + q[1],
                                                 kind=OutputKindEnum.JOINT_POSITION,
                                                 element_names=["hip", "knee", "ankle"]),
                            export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    spec = bundle.yaml("g")["models"]["n"]
    assert spec["inputs"][0] == {"name": "q", "dtype": "float32", "shape": [4, 3],
                                 "type": "tensor", "kind": "state/joint/position",
                                 "element_names": ["__temporal_axis__", ["hip", "knee", "ankle"]],
                                 "temporal_period_ms": 20}
    assert spec["inputs"][1]["element_names"] == [["speed"]]
    assert spec["inputs"][1]["unit"] == "rad/s" and "extra" not in spec["inputs"][1]
    assert spec["outputs"][0]["kind"] == "target/joint/position"
    assert spec["outputs"][0]["element_names"] == [["hip", "knee", "ankle"]]


def test_enums_cover_the_api_reference():
    assert len(InputKindEnum) == 20 and len(OutputKindEnum) == 11
    assert InputKindEnum.COMMAND_POSE.value == "command/body/pose"
    assert OutputKindEnum.KD.value == "kd"


# ---- annotate.method ----------------------------------------------------------

def test_method_names_from_signature_and_return(bundle):
    @annotate.method(export_with="jit")
    def scale(inputA, factor=torch.tensor(3.0)):
        scaled = inputA * factor
        return scaled

    leapp.start("g", save_path=bundle.root)
    out = scale(torch.ones(2))
    leapp.stop()
    assert torch.equal(out, torch.full((2,), 3.0))
    leapp.compile_graph(visualize=False)
    spec = bundle.yaml("g")["models"]["scale"]
    assert [p["name"] for p in spec["inputs"]] == ["inputA"]  # the default became a constant
    assert [p["name"] for p in spec["outputs"]] == ["scaled"]
    model = torch.jit.load(os.path.join(bundle.dir("g"), "scale.pt"))
    assert torch.equal(model(torch.ones(2) * 2), torch.full((2,), 6.0))


def test_method_on_bound_methods_and_no_grad(bundle):
    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        @annotate.method(node_name="act", export_with="jit")
        @torch.no_grad()
        def act(self, obs, bias):
            return self.lin(obs) + bias, obs.sum()

    policy = Policy()
    leapp.start("g", save_path=bundle.root)
    action, total = policy.act(torch.ones(1, 3), torch.zeros(1, 2))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"act": True}
    spec = bundle.yaml("g")["models"]["act"]
    assert [p["name"] for p in spec["inputs"]] == ["obs", "bias"]
    assert [p["name"] for p in spec["outputs"]] == ["output1", "output2"]


def test_method_chain_with_traced_nodes(bundle):
    @annotate.method(export_with="jit")
    def normalise(raw):
        return (raw - raw.mean()) / (raw.std() + 1e-6)

    leapp.start("g", save_path=bundle.root)
    n = normalise(torch.randn(1, 5))
    h = annotate.input_tensors("policy", {"features": n})
    annotate.output_tensors("policy", {"action": torch.tanh(h)}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    assert bundle.yaml("g")["pipeline"]["data_flow"] == {"normalise/output1": ["policy/features"]}


# ---- provenance --------------------------------------------------------------

@pytest.mark.parametrize("copy", ["clone", "detach", "contiguous", "cpu", "to_same"])
def test_provenance_survives_equivalent_copies(bundle, copy):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = x + 1
    annotate.output_tensors("a", {"y": y}, export_with="jit")
    copied = y.to(torch.float32) if copy == "to_same" else getattr(y, copy)()
    z = annotate.input_tensors("b", {"y_in": copied})
    annotate.output_tensors("b", {"z": z * 2}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    assert bundle.yaml("g")["pipeline"]["data_flow"] == {"a/y": ["b/y_in"]}


def test_dtype_changing_to_breaks_provenance(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = x + 1
    annotate.output_tensors("a", {"y": y}, export_with="jit")
    z = annotate.input_tensors("b", {"y64": y.to(torch.float64)})
    annotate.output_tensors("b", {"z": z * 2}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    spec = bundle.yaml("g")["pipeline"]
    assert spec["data_flow"] == {} and spec["inputs"] == {"a": ["x"], "b": ["y64"]}


def test_non_tensor_results_are_plain_values(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.arange(6.0).reshape(2, 3)})
    assert x.shape == (2, 3) and type(x.size(1)) is int and type(x.sum().item()) is float
    y = x.reshape(x.shape[0] * x.shape[1])  # static shapes become literals
    annotate.output_tensors("a", {"y": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"a": True}


def test_fan_out_one_output_to_two_nodes(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("src", {"x": torch.ones(2)})
    y = x * 3
    annotate.output_tensors("src", {"y": y}, export_with="jit")
    for name in ("left", "right"):
        v = annotate.input_tensors(name, {"v": y})
        annotate.output_tensors(name, {"out": v + 1}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    pipeline = bundle.yaml("g")["pipeline"]
    assert pipeline["data_flow"] == {"src/y": ["left/v", "right/v"]}
    assert pipeline["outputs"] == {"left": ["out"], "right": ["out"]}


def test_annotations_from_a_second_thread(bundle):
    import threading
    errors = []

    def work():
        try:
            t = torch.ones(2)
            assert annotate.input_tensors("n", {"x": t}) is t
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("back", ["from_numpy", "as_tensor"])
def test_numpy_round_trip_keeps_the_trace(bundle, back):
    import numpy as np
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.arange(4.0)})
    array = (x * 2).numpy() if back == "from_numpy" else np.asarray(x * 2)
    y = getattr(torch, back)(array) + 1
    annotate.output_tensors("n", {"y": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}
    model = torch.jit.load(os.path.join(bundle.dir("g"), "n.pt"))
    assert torch.equal(model(torch.ones(4)), torch.full((4,), 3.0))


def test_global_patching_off_and_restored(bundle):
    original = torch.from_numpy
    leapp.start("g", save_path=bundle.root, global_patching=False)
    assert torch.from_numpy is original
    leapp.stop()
    leapp.start("g", save_path=bundle.root)
    assert torch.from_numpy is not original
    leapp.stop()
    assert torch.from_numpy is original


def test_failed_compile_leaves_the_previous_bundle_intact(bundle, monkeypatch):
    _chain(bundle.root)
    leapp.compile_graph(visualize=False)
    before = {name: open(os.path.join(bundle.dir("g"), name), "rb").read()
              for name in ("g.yaml", "a.pt", "b.pt")}
    _chain(bundle.root)
    monkeypatch.setenv("LEAPP_INCREMENTAL", "0")  # the same graph again: export it again
    import leapp.compiling.backends.jit as jit_backend
    original = jit_backend.export
    calls = []

    def failing(node, *args, **kwargs):
        calls.append(node)
        if node == "b":
            raise RuntimeError("interrupted while exporting b")
        return original(node, *args, **kwargs)

    monkeypatch.setattr(jit_backend, "export", failing)
    with pytest.raises(RuntimeError, match="interrupted while exporting b"):
        leapp.compile_graph(visualize=False)
    assert calls == ["a", "b"]
    files = sorted(os.listdir(bundle.dir("g")))
    assert files == [".leapp_cache.json", "a.pt", "b.pt", "g.yaml", "g_analytics.json",
                     "log.txt"]  # no temporary
    for name, content in before.items():  # nothing half-written: the old bundle stands
        assert open(os.path.join(bundle.dir("g"), name), "rb").read() == content
