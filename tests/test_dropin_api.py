"""Drop-in for upstream leapp 0.7.2's users: its import paths, ExportManager, @annotate.method.

Every upstream module path we provide is an alias: the names it gives are the
very objects `leapp` exports.  `ExportManager` is one shared view of the
current session.  `@annotate.method` takes upstream's extra keywords, shared
tensor defaults and methods wrapped by `torch.no_grad()`.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os

import pytest
import torch
import yaml

import leapp
from leapp import _core, annotate
from leapp.export_manager import ExportManager

# ---- import paths ------------------------------------------------------------

# (module, name, the object of ours it must be)
PROVIDED = [
    ("leapp", "ExportManager", lambda: ExportManager),
    ("leapp", "InferenceManager", lambda: importlib.import_module(
        "leapp.inference_manager").InferenceManager),
    ("leapp", "InputKindEnum", lambda: leapp.semantics.InputKindEnum),
    ("leapp", "OutputKindEnum", lambda: leapp.semantics.OutputKindEnum),
    ("leapp", "FunctionPatch", lambda: leapp.tracing.patching.FunctionPatch),
    ("leapp", "TensorSemantics", lambda: leapp.semantics.TensorSemantics),
    ("leapp", "TemporalAxis", lambda: leapp.semantics.TemporalAxis),
    ("leapp", "GraphConfigs", lambda: leapp.semantics.GraphConfigs),
    ("leapp", "annotate", lambda: annotate),
    ("leapp", "start", lambda: leapp.tracing.session_lifecycle.start),
    ("leapp", "stop", lambda: leapp.tracing.session_lifecycle.stop),
    ("leapp", "compile_graph", lambda: leapp.compiling.compiler.compile_graph),
    ("leapp.leapp", "start", lambda: leapp.start),
    ("leapp.leapp", "stop", lambda: leapp.stop),
    ("leapp.leapp", "compile_graph", lambda: leapp.compile_graph),
    ("leapp.leapp", "annotate", lambda: leapp.annotate),
    ("leapp.leapp", "_MANAGER", lambda: ExportManager()),
    ("leapp.export_manager", "ExportManager", lambda: leapp.ExportManager),
    ("leapp.inference_manager", "InferenceManager", lambda: leapp.InferenceManager),
    ("leapp.utils.enums", "InputKindEnum", lambda: leapp.InputKindEnum),
    ("leapp.utils.enums", "OutputKindEnum", lambda: leapp.OutputKindEnum),
    ("leapp.utils.tensor_description", "TensorSemantics", lambda: leapp.TensorSemantics),
    ("leapp.utils.tensor_description", "TemporalAxis", lambda: leapp.TemporalAxis),
    ("leapp.utils.tensor_description", "GraphConfigs", lambda: leapp.GraphConfigs),
    ("leapp.utils.tensor_description", "TEMPORAL_AXIS_SENTINEL",
     lambda: leapp.semantics.TEMPORAL_AXIS),
    ("leapp.utils.logging", "SECTION", lambda: leapp.bundle.log.SECTION),
    ("leapp.utils.logging", "SYSTEM", lambda: leapp.bundle.log.SYSTEM),
    ("leapp.utils.logging", "FATAL", lambda: leapp.bundle.log.FATAL),
]


@pytest.mark.parametrize("module, name, expected", PROVIDED,
                         ids=[f"{m}.{n}" for m, n, _ in PROVIDED])
def test_upstream_import_path_is_our_object(module, name, expected):
    imported = getattr(importlib.import_module(module), name)
    assert imported is expected()


def test_isaac_lab_import_line():
    from leapp.utils.tensor_description import TensorSemantics
    assert TensorSemantics is leapp.TensorSemantics
    semantics = TensorSemantics("obs", torch.zeros(2), kind=leapp.InputKindEnum.JOINT_POSITION)
    assert semantics.to_dict()["kind"] is leapp.InputKindEnum.JOINT_POSITION
    assert leapp.semantics.yaml_fields(semantics)["kind"] == "state/joint/position"


def test_upstream_all_is_importable():
    upstream_all = ["ExportManager", "InferenceManager", "InputKindEnum", "OutputKindEnum",
                    "FunctionPatch", "annotate", "start", "stop", "compile_graph",
                    "__version__", "TensorSemantics", "TemporalAxis", "GraphConfigs"]
    for name in upstream_all:
        assert getattr(leapp, name) is not None, name
    assert set(upstream_all) <= set(leapp.__all__)
    assert set(leapp.utils.tensor_description.__all__) >= {"TensorSemantics", "TemporalAxis",
                                                           "GraphConfigs"}
    assert leapp.utils.enums.__all__ == ["InputKindEnum", "OutputKindEnum"]


def test_upstream_paths_reachable_after_plain_import():
    """`import leapp` alone makes the upstream submodules attributes, as upstream does."""
    assert leapp.utils.tensor_description.TensorSemantics is leapp.TensorSemantics
    assert leapp.utils.enums.OutputKindEnum is leapp.OutputKindEnum
    assert leapp.leapp.annotate is leapp.annotate


def test_annotate_lists_upstream_annotations():
    for name in ("input_tensors", "output_tensors", "method", "state_tensors", "update_state",
                 "register_buffer", "module", "mirror_leapp_tags", "warp_op"):
        assert callable(getattr(annotate, name)), name
    with pytest.raises(AttributeError, match="Available annotations"):
        annotate.no_such_annotation  # noqa: B018


def test_warp_op_without_session_is_a_null_context():
    with annotate.warp_op("w"):
        pass


def test_warp_op_in_a_session_says_warp_is_not_available(bundle):
    leapp.start("g", save_path=bundle.root)
    annotate.input_tensors("w", {"x": torch.ones(2)})
    with pytest.raises(ImportError, match="the warp backend is not installed"):
        annotate.warp_op("w")


# ---- ExportManager -----------------------------------------------------------


def _simple_graph(bundle, graph="g", manager=None):
    api = manager if manager is not None else annotate
    leapp.start(graph, save_path=bundle.root)
    x = api.input_tensors("n", {"x": torch.ones(2)})
    api.output_tensors("n", {"y": x * 2}, export_with="jit")
    leapp.stop()


def test_export_manager_is_one_shared_instance():
    assert ExportManager() is ExportManager()
    assert leapp.leapp._MANAGER is ExportManager()


def test_export_manager_reflects_the_session(bundle):
    manager = ExportManager()
    assert not ExportManager.is_interpret_graph_enabled()
    leapp.start("sub/g2", save_path=bundle.root, dry_run=False, non_traced=["skip"],
                max_cached_io=3)
    assert ExportManager.is_interpret_graph_enabled()
    assert manager.get_graph_name() == "g2" and manager.GRAPH_NAME == "g2"
    assert manager.get_save_path() == os.path.join(bundle.root, "sub", "g2")
    assert manager.config_path == os.path.join(bundle.root, "sub", "g2", "g2.yaml")
    assert not manager.is_dry_run() and manager.is_dry_run("skip")
    assert manager.non_traced == {"skip"}
    manager.set_dry_run_and_non_traced(True, "other")
    assert manager.is_dry_run() and manager.dry_run and manager.non_traced == {"other"}
    manager.set_dry_run_and_non_traced(False, [])
    assert not manager.is_dry_run("other")
    leapp.stop()
    assert not ExportManager.is_interpret_graph_enabled()


def test_export_manager_annotations_trace_like_annotate(bundle):
    manager = ExportManager()
    _simple_graph(bundle, manager=manager)
    assert list(manager.get_nodes()) == ["n"]
    manager.validate_nodes_ready_for_compile()
    assert leapp.compile_graph(visualize=False) == {"n": True}
    assert manager.detected_nodes == bundle.yaml("g")["models"]
    assert manager.detected_pipeline["outputs"] == bundle.yaml("g")["pipeline"]["outputs"]
    assert manager.get_io_descriptions() == {"models": bundle.yaml("g")["models"]}


def test_export_manager_method_decorator(bundle):
    manager = ExportManager()

    @manager.method(node_name="scaled", export_with="jit")
    def scale(x):
        out = x * 3
        return out

    leapp.start("g", save_path=bundle.root)
    scale(torch.ones(2))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"scaled": True}
    assert [o["name"] for o in bundle.yaml("g")["models"]["scaled"]["outputs"]] == ["out"]


def test_unfinished_node_is_reported_with_upstream_wording(bundle):
    leapp.start("g", save_path=bundle.root)
    annotate.input_tensors("b_open", {"x": torch.ones(2)})
    annotate.input_tensors("a_open", {"x": torch.ones(2)})
    with pytest.raises(Exception, match="The following nodes were created but never "
                                        "completed: a_open, b_open. Did you forget"):
        ExportManager().validate_nodes_ready_for_compile()


def test_set_interpret_graph_toggles_tracing(bundle):
    leapp.start("g", save_path=bundle.root)
    ExportManager.set_interpret_graph(False)
    assert not _core.is_tracing()
    x = torch.ones(2)
    assert annotate.input_tensors("n", {"x": x}) is x  # no session: the same object
    ExportManager.set_interpret_graph(True)
    assert _core.is_tracing()


def test_reset_nodes_forgets_the_graph(bundle):
    _simple_graph(bundle)
    ExportManager().reset_nodes()
    assert ExportManager().get_nodes() == {}


def test_validate_all_models_after_compile_without_validation(bundle):
    _simple_graph(bundle)
    assert leapp.compile_graph(visualize=False, validate=False) is True
    assert ExportManager().validate_all_models() == {"n": True}


def test_validate_all_models_after_a_validating_compile_is_refused(bundle):
    _simple_graph(bundle)
    leapp.compile_graph(visualize=False)
    with pytest.raises(Exception, match="no exported models to validate"):
        ExportManager().validate_all_models()


def test_validate_all_models_with_no_nodes_returns_empty():
    _core.reset_nodes()
    assert ExportManager().validate_all_models() == {}


def test_save_models_writes_the_bundle(bundle):
    _simple_graph(bundle)
    manager = ExportManager()
    manager.compile_models()
    manager.save_models()
    assert os.path.exists(os.path.join(bundle.dir("g"), "n.pt"))
    assert bundle.yaml("g")["models"]["n"]["parameters"]["backend"] == "jit"
    assert manager.validate_all_models() == {"n": True}


def test_io_descriptions_before_compile(bundle):
    _simple_graph(bundle)
    models = ExportManager().get_io_descriptions()["models"]
    assert [i["name"] for i in models["n"]["inputs"]] == ["x"]
    assert models["n"]["parameters"]["model_path"] is None


# ---- @annotate.method ------------------------------------------------------------


def test_method_environment_constants_are_accepted_and_frozen(bundle):
    gain = torch.full((3,), 2.0)
    linear = torch.nn.Linear(3, 3)

    @annotate.method(export_with="jit", environment_constants=["gain", "linear"])
    def policy(obs):
        action = linear(obs) * gain
        return action

    leapp.start("g", save_path=bundle.root)
    policy(torch.ones(3))
    policy(torch.ones(3) * 2)
    gain += 10.0  # after the first trace: the exported node keeps the traced value
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}
    model = torch.jit.load(os.path.join(bundle.dir("g"), "policy.pt"))
    with torch.no_grad():
        expected = linear(torch.ones(3)) * 2.0
    assert torch.allclose(model(torch.ones(3)), expected)


def test_method_environment_constant_that_resolves_nowhere_warns(bundle, caplog):
    @annotate.method(export_with="jit", environment_constants="not_defined_anywhere")
    def f(x):
        return x + 1

    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        f(torch.ones(2))
    assert "'not_defined_anywhere' does not name an object" in caplog.text


def test_method_self_attribute_as_environment_constant(bundle):
    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.full((2,), 3.0)

        @annotate.method(node_name="pol", export_with="jit",
                         environment_constants=["self.scale"])
        def forward(self, obs):
            return obs * self.scale

    policy = Policy()
    leapp.start("g", save_path=bundle.root)
    policy(torch.ones(2))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"pol": True}


def test_method_unknown_keyword_is_ignored_with_a_warning(bundle, caplog):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        @annotate.method(export_with="jit", use_trace=True)
        def f(x):
            return x + 1
    assert "ignores unknown keyword arguments ['use_trace']" in caplog.text
    leapp.start("g", save_path=bundle.root)
    f(torch.ones(2))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"f": True}


def test_method_inputs_outputs_keywords_are_accepted(bundle):
    @annotate.method(node_name="io", export_with="jit", inputs=["x"], outputs=["y"])
    def f(x):
        y = x - 1
        return y

    leapp.start("g", save_path=bundle.root)
    f(torch.ones(2))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"io": True}


def test_method_constant_and_buffer_overlap_is_refused():
    with pytest.raises(ValueError, match="present in both register_buffers and "
                                         "environment_constants"):
        annotate.method(environment_constants=["a"], register_buffers=["a"])


def test_method_register_buffers_names_a_closed_over_tensor(bundle):
    table = torch.arange(3.0)

    @annotate.method(node_name="buf", export_with="jit", register_buffers=["table"])
    def f(x):
        y = x + table
        return y

    leapp.start("g", save_path=bundle.root)
    f(torch.ones(3))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"buf": True}
    assert [i["name"] for i in bundle.yaml("g")["models"]["buf"]["inputs"]] == ["x"]


def test_method_register_buffers_of_a_missing_name_is_refused(bundle):
    @annotate.method(node_name="buf", export_with="jit", register_buffers=["missing_table"])
    def f(x):
        return x + 1

    leapp.start("g", save_path=bundle.root)
    with pytest.raises(ValueError, match="'missing_table' does not name an object"):
        f(torch.ones(3))


_SHARED_DEFAULT = torch.ones(3)


def test_method_parameters_sharing_one_default_tensor(bundle):
    @annotate.method(node_name="dflt", export_with="jit")
    def f(x, a=_SHARED_DEFAULT, b=_SHARED_DEFAULT):
        out = x + a * b
        return out

    leapp.start("g", save_path=bundle.root)
    f(torch.ones(3))
    f(torch.ones(3) * 2)
    leapp.stop()
    assert type(_SHARED_DEFAULT) is torch.Tensor  # the default object is never tagged
    assert _core.carrier_of(_SHARED_DEFAULT) is None
    assert leapp.compile_graph(visualize=False) == {"dflt": True}
    assert [i["name"] for i in bundle.yaml("g")["models"]["dflt"]["inputs"]] == ["x"]


class _Actor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 2)

    def forward(self, obs):
        return self.net(obs)

    @torch.no_grad()
    def act(self, obs):
        actions = self.net(obs)
        return actions


def test_method_over_a_no_grad_wrapped_bound_method(bundle):
    actor = _Actor()
    traced = annotate.method(node_name="x", export_with="jit")(torch.no_grad()(actor.forward))
    leapp.start("g", save_path=bundle.root)
    traced(torch.ones(3))
    traced(obs=torch.ones(3))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"x": True}


def test_method_over_a_bound_method_defined_with_no_grad(bundle):
    actor = _Actor()
    traced = annotate.method(node_name="act", export_with="jit")(actor.act)
    leapp.start("g", save_path=bundle.root)
    out = traced(torch.ones(3))
    traced(obs=torch.ones(3))
    leapp.stop()
    assert not out.requires_grad
    assert leapp.compile_graph(visualize=False) == {"act": True}
    assert [o["name"] for o in bundle.yaml("g")["models"]["act"]["outputs"]] == ["actions"]


def test_method_over_no_grad_inside_the_class(bundle):
    class Actor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 2)

        @annotate.method(node_name="inclass", export_with="jit")
        @torch.no_grad()
        def forward(self, obs):
            act = self.net(obs)
            return act

    actor = Actor()
    leapp.start("g", save_path=bundle.root)
    actor(torch.ones(3))
    actor(torch.ones(3))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"inclass": True}


def test_method_without_session_is_a_plain_call():
    @annotate.method(environment_constants=["x"], register_buffers=["y"])
    def f(v):
        return v + 1

    assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))


def test_upstream_yaml_loads_for_the_export_manager_documents(bundle):
    """detected_pipeline is the YAML's pipeline document, flow lists included."""
    _simple_graph(bundle)
    leapp.compile_graph(visualize=False)
    text = yaml.safe_dump({"pipeline": ExportManager().detected_pipeline})
    assert yaml.safe_load(text)["pipeline"]["inputs"] == bundle.yaml("g")["pipeline"]["inputs"]


def test_null_context_type():
    assert isinstance(annotate.warp_op("any"), contextlib.nullcontext)


# ---- live comparison with upstream's messages ----------------------------------------

_MISUSE_SCRIPT = r'''
import json, logging, sys, tempfile
logging.disable(logging.CRITICAL)
import torch, leapp
from leapp import annotate

out = {}
def case(label, body):
    leapp.start(label, save_path=tempfile.mkdtemp())
    try:
        body()
        out[label] = None
    except Exception as exc:
        out[label] = str(exc)
    try:
        leapp.stop()
    except Exception:
        pass

def declare(payload):
    return annotate.input_tensors("A", payload)

def mixed_input():
    a = declare({"x": torch.ones(2)})
    annotate.input_tensors("B", {"y": a * 2})
def mixed_op():
    a = declare({"x": torch.ones(2)})
    b = annotate.input_tensors("B", {"y": torch.ones(2)})
    a + b
def mixed_output():
    a = declare({"x": torch.ones(2)})
    annotate.input_tensors("B", {"y": torch.ones(2)})
    annotate.output_tensors("B", {"o": a * 2})
def dup_input():
    declare({"x": torch.ones(2)})
    declare({"x": torch.ones(2)})
def static_traced():
    a = declare({"x": torch.ones(2)})
    annotate.output_tensors("A", {"y": a * 2}, static_outputs={"s": a * 3})
def reentry(second, out_name="y", slice_out=False):
    def body():
        for payload in ({"x": torch.ones(2)}, second):
            t = declare(payload)
            t = t if not isinstance(t, tuple) else t[0]
            annotate.output_tensors("A", {out_name if payload is second else "y":
                                          t[:1] if slice_out and payload is second else t * 2})
    return body

case("mixed_input", mixed_input)
case("mixed_op", mixed_op)
case("mixed_output", mixed_output)
case("dup_input", dup_input)
case("static_traced", static_traced)
case("reentry_name", reentry({"z": torch.ones(2)}))
case("reentry_shape", reentry({"x": torch.ones(3)}))
case("reentry_dtype", reentry({"x": torch.ones(2, dtype=torch.float64)}))
case("reentry_output_name", reentry({"x": torch.ones(2)}, out_name="w"))
case("reentry_output_shape", reentry({"x": torch.ones(2)}, slice_out=True))
print("@@" + json.dumps(out))
'''


def _run_misuse(python: str, tmp_path, root: str | None) -> dict:
    import json
    import subprocess
    import sys as _sys
    script = tmp_path / "misuse.py"
    prelude = f"import sys; sys.path.insert(0, {root!r})\n" if root else ""
    script.write_text(prelude + _MISUSE_SCRIPT)
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run([python or _sys.executable, str(script)], capture_output=True,
                          text=True, cwd=str(tmp_path), env=env, timeout=300)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("@@")]
    assert line, done.stderr[-3000:]
    return json.loads(line[-1][2:])


def _sorted_sets(text: str) -> str:
    """Set literals of quoted names in sorted order (upstream prints them in hash order)."""
    import re
    return re.sub(r"\{('[^'{}]*'(?:, '[^'{}]*')+)\}",
                  lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", text)


def test_misuse_messages_contain_upstreams(tmp_path):
    from support import ROOT, upstream_python
    upstream = upstream_python()
    if upstream is None:
        pytest.skip("no upstream leapp 0.7.2 interpreter")
    (tmp_path / "up").mkdir()
    (tmp_path / "ours").mkdir()
    theirs = _run_misuse(upstream, tmp_path / "up", None)
    ours = _run_misuse(None, tmp_path / "ours", ROOT)
    assert set(theirs) == set(ours)
    for case, message in theirs.items():
        assert message is not None, case
        assert ours[case] is not None, case
        assert _sorted_sets(message) in _sorted_sets(ours[case]), case
