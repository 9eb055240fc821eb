"""leapp.bundle.pipeline: the one model of a bundle's pipeline, read, checked and written."""
from __future__ import annotations

import ast
import copy
import dataclasses
import glob
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from leapp.bundle.pipeline import (FEEDBACK, FORWARD, SELF, STATE, Pipeline, join_key, split_key)
from support import ROOT

UPSTREAM_BUNDLES = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "upstream", "*", "*.yaml")))
COMPILED = ("declared_state", "semantics_static", "gru_module")


def document(models=None, pipeline=None):
    port = {"name": "x", "dtype": "float32", "shape": [1, 2]}
    params = {"model_path": None, "md5sum": None, "sha256sum": None, "backend": None}
    if models is None:
        models = {name: {"inputs": [dict(port)], "outputs": [dict(port, name="y")],
                         "parameters": dict(params)} for name in ("a", "b", "c")}
    return {"models": models, "pipeline": pipeline or {}, "system information": {}}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Bundles compiled by this package (semantics, declared state, feedback)."""
    out = tmp_path_factory.mktemp("compiled")
    for name in COMPILED:
        script = os.path.join(ROOT, "bench", "compat_pipelines", f"{name}.py")
        result = subprocess.run([sys.executable, script, str(out)], capture_output=True,
                                text=True, timeout=300, cwd=str(out),
                                env=dict(os.environ, PYTHONPATH=ROOT))
        assert result.returncode == 0, result.stderr[-3000:]
    return {name: str(out / name / f"{name}.yaml") for name in COMPILED}


@pytest.mark.parametrize("path", UPSTREAM_BUNDLES, ids=os.path.basename)
def test_upstream_bundle_round_trips_byte_for_byte(path):
    text = pathlib.Path(path).read_text()
    assert Pipeline.load(path).to_yaml() == text


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_bundle_round_trips_byte_for_byte(compiled, name):
    text = pathlib.Path(compiled[name]).read_text()
    assert Pipeline.load(compiled[name]).to_yaml() == text


def test_edge_kinds_and_run_order(compiled):
    model = Pipeline.load(compiled["declared_state"])
    kinds = {(e.source, e.target): e.kind for e in model.edges}
    assert kinds == {("memory/features", "controller/features"): FORWARD,
                     ("controller/count_out", "controller/count_in"): SELF,
                     ("memory/h", "memory/h"): STATE}
    assert model.run_order == ("memory", "controller")
    assert model.input_keys() == ["controller/frozen", "memory/obs"]
    assert model.initial_values == "declared_state_initial_values.safetensors"
    assert [p.name for p in model.nodes["memory"].inputs] == ["obs", "h"]
    assert model.port("memory", "h", "outputs").shape == (1, 16)
    feedback = Pipeline.from_document(document(pipeline={
        "data_flow": {"a/y": ["b/x"]}, "feedback_flow": {"b/y": ["a/x"]},
        "outputs": {"b": ["y"], "c": ["y"]}, "inputs": {"c": ["x"]}}))
    assert [e.kind for e in feedback.edges] == [FORWARD, FEEDBACK]


def test_the_model_is_read_only(compiled):
    model = Pipeline.load(compiled["semantics_static"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.edges = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        model.nodes["act"] = None  # type: ignore[index]
    port = model.nodes["observe"].inputs[0]
    with pytest.raises(TypeError):
        port.entry["dtype"] = "int64"  # type: ignore[index]
    with pytest.raises(AttributeError):
        port.entry["element_names"].append("x")
    # what readers get back is theirs to change
    copy = port.description()
    copy["element_names"].append("x")
    assert "x" not in port.entry["element_names"]


def test_run_order_keeps_yaml_order_among_equals_and_refuses_cycles():
    model = Pipeline.from_document(document(pipeline={
        "data_flow": {"c/y": ["a/x"]}, "outputs": {"a": ["y"], "b": ["y"]}}))
    assert model.run_order == ("b", "c", "a")
    with pytest.raises(ValueError, match=r"data_flow has a cycle through nodes \['a', 'b'\]"):
        Pipeline.from_document(document(pipeline={
            "data_flow": {"a/y": ["b/x"], "b/y": ["a/x"]}, "outputs": {"c": ["y"]}}))


@pytest.mark.parametrize("key,message", [
    ("a", r"not enough values to unpack \(expected 2, got 1\)"),
    ("a/b/c", r"too many values to unpack"),
    (5, r"expected a 'node_name/port_name' string"),
])
def test_split_key_is_the_one_key_parser(key, message):
    with pytest.raises(ValueError, match=message):
        split_key(key, "pipeline source")
    assert split_key(join_key("node", "port"), "x") == ("node", "port")


def test_wiring_is_checked_for_readers_only():
    bad = document(pipeline={"data_flow": {"a/y": ["ghost/x"]},
                             "outputs": {"b": ["y"], "c": ["y"]}})
    with pytest.raises(ValueError, match="Target node 'ghost' not found"):
        Pipeline.from_document(bad)
    assert Pipeline.from_document(bad, check_wiring=False).edges[0].dst_node == "ghost"


def test_no_other_module_reads_the_flow_sections():
    """The flow keys of the YAML are spelled in pipeline.py (and compiler.py, which
    hands over the C core's edges), so no second reader can drift from it."""
    allowed = {"pipeline.py", "compiler.py"}
    found = []
    for path in pathlib.Path(ROOT, "leapp").rglob("*.py"):
        if path.name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("data_flow", "feedback_flow"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_a_compiled_pipeline_copies_its_documents_and_is_typed_from_the_start():
    doc = document(pipeline={"data_flow": {"a/y": ["b/x"]}, "feedback_flow": {"b/y": ["a/x"]},
                             "inputs": {"c": ["x"]}, "outputs": {"b": ["y"], "c": ["y"]}})
    expected = Pipeline.from_document(doc).to_yaml()
    given = copy.deepcopy(doc)
    compiled = Pipeline.from_compile(doc["models"], doc["pipeline"], {})
    assert doc == given and type(doc["models"]["a"]["inputs"][0]["shape"]) is list
    assert not hasattr(Pipeline, "__getattr__")  # no field is filled in later
    doc["models"]["a"]["inputs"][0]["name"] = "renamed"  # the caller's copy, not the model's
    doc["pipeline"]["data_flow"]["a/y"].append("c/x")
    assert compiled.to_yaml() == expected
    assert [e.kind for e in compiled.edges] == [FORWARD, FEEDBACK]
    assert compiled.run_order == ("a", "b", "c")
    assert compiled.nodes["a"].inputs[0].shape == (1, 2)
    assert compiled.to_yaml() == expected


def test_a_compiled_pipelines_nodes_equal_the_ones_its_yaml_reads_back():
    """The compiled nodes are built from the copied entries when first read (a 200-node
    compile reads a few): the same nodes, ports and parameters as the YAML gives."""
    doc = document(pipeline={"data_flow": {"a/y": ["b/x"]}, "feedback_flow": {"b/y": ["a/x"]},
                             "inputs": {"c": ["x"]}, "outputs": {"b": ["y"], "c": ["y"]}})
    compiled = Pipeline.from_compile(doc["models"], doc["pipeline"], {})
    doc["models"]["b"]["inputs"][0]["dtype"] = "int64"  # after the compile: not seen
    read = Pipeline.from_document(yaml.safe_load(compiled.to_yaml()))
    assert list(compiled.nodes) == ["a", "b", "c"] and len(compiled.nodes) == 3
    assert "b" in compiled.nodes and "z" not in compiled.nodes
    assert compiled.nodes["b"].inputs[0].dtype == "float32"
    assert dict(compiled.nodes) == dict(read.nodes) and compiled.nodes == read.nodes
    assert compiled.nodes["a"] is compiled.nodes["a"]  # built once
    with pytest.raises(KeyError):
        compiled.nodes["z"]
    assert compiled.port("c", "y", "outputs").key == "c/y"


def test_the_pipeline_answers_what_feeds_every_input_and_names_outputs_once():
    """Wiring is resolved once, here: fused models, Triton and contracts ask the model."""
    from leapp.bundle.pipeline import Feed
    doc = document(pipeline={"data_flow": {"a/y": ["b/x"]}, "feedback_flow": {"b/y": ["a/x"]},
                             "inputs": {"c": ["x"]}, "outputs": {"b": ["y"], "c": ["y"]}})
    model = Pipeline.from_document(doc)
    assert model.feeds() == {"a": {"x": (Feed("feedback", ("b", "y")),)},
                             "b": {"x": (Feed("forward", ("a", "y")),)},
                             "c": {"x": (Feed("input"),)}}
    names = model.output_names()
    assert names[("b", "y")] == "b/y" and names[("c", "y")] == "c/y"
    # a port both in and out takes "__out" (here "c/x" is a graph input)
    doc["models"]["c"]["outputs"][0]["name"] = "x"
    doc["pipeline"]["outputs"] = {"b": ["y"], "c": ["x"]}
    assert Pipeline.from_document(doc).output_names()[("c", "x")] == "c/x__out"
    unfed = Pipeline.from_document(document(pipeline={"outputs": {"a": ["y"], "b": ["y"],
                                                                  "c": ["y"]}}))
    assert unfed.feeds()["a"]["x"] == (Feed("unfed"),)


def test_no_module_but_the_pipeline_spells_the_renaming_rule():
    found = []
    for path in pathlib.Path(ROOT, "leapp").rglob("*.py"):
        if path.name == "pipeline.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.endswith("__out") and len(node.value) < 40:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_an_extra_document_is_a_field_written_through_the_model(tmp_path):
    doc = document(pipeline={"outputs": {"a": ["y"], "b": ["y"], "c": ["y"]}})
    model = Pipeline.from_document(doc)
    recorded = model.with_extra("fused", {"onnx": {"model_path": "g_fused.onnx"}})
    assert "fused" not in model.extra  # a new model; this one unchanged
    text = recorded.to_yaml()
    assert text.startswith(model.to_yaml().rstrip("\n")) and "fused:" in text
    path = tmp_path / "g.yaml"
    path.write_text(text)
    assert dict(Pipeline.load(str(path)).extra["fused"]["onnx"]) == {"model_path": "g_fused.onnx"}
    with pytest.raises(ValueError, match="bundle's own documents"):
        model.with_extra("models", {})
