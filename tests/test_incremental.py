"""Incremental compiles: unchanged nodes reuse their verified files, validated as usual.

A template bundle is compiled once per module; each test copies it, traces a
variant into the copy and compiles there, so a test pays for one compile.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch
import yaml

import leapp
from leapp import annotate
from leapp.compiling import incremental as _incremental
from leapp.compiling.incremental import MANIFEST

GRAPH = "g"


def trace(root: str, scale: float = 2.0, offset: float = 1.0, op=torch.tanh,
          backend_b: str = "jit-trace", params_b: dict | None = None, shape=(2,),
          dtype=torch.float32, input_name: str = "x") -> None:
    """Two jit nodes: a = op(x) * 0.5, b = a * constant + offset; two passes."""
    leapp.start(GRAPH, save_path=root)
    constant = torch.full(shape, scale, dtype=dtype)
    for step in range(2):
        x = annotate.input_tensors("a", {input_name: torch.full(shape, 0.5 + step, dtype=dtype)})
        y = annotate.output_tensors("a", {"y": op(x) * 0.5}, export_with="jit")
        z = annotate.input_tensors("b", {"y": y})
        annotate.output_tensors("b", {"z": z * constant + offset}, export_with=backend_b,
                                backend_params=params_b)
    leapp.stop()


def files(directory: str) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name != "log.txt"}


def reused(result) -> dict[str, bool]:
    return {row["node"]: row["reused"] for row in result.nodes}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("template"))
    trace(root)
    result = leapp.compile_graph(visualize=False)
    assert result == {"a": True, "b": True} and reused(result) == {"a": False, "b": False}
    _core_reset()
    return os.path.join(root, GRAPH)


def _core_reset() -> None:
    from leapp import _core
    from leapp.bundle import log as _logging
    _core.reset_nodes()
    _logging.close()  # the template's log.txt is not appended to by later sessions


@pytest.fixture
def copy(template, tmp_path):
    """A copy of the template bundle (modes kept): (root, bundle)."""
    shutil.copytree(template, tmp_path / GRAPH)
    return str(tmp_path), str(tmp_path / GRAPH)


def test_unchanged_nodes_reuse_byte_identical_files_and_are_validated(copy):
    root, bundle = copy
    before = files(bundle)
    inode = os.stat(os.path.join(bundle, "a.pt")).st_ino
    trace(root)
    result = leapp.compile_graph(visualize=False)
    assert result == {"a": True, "b": True}
    assert reused(result) == {"a": True, "b": True}
    assert files(bundle) == before  # YAML, models and manifest, byte for byte
    assert os.stat(os.path.join(bundle, "a.pt")).st_ino == inode  # linked, not rewritten
    log = open(os.path.join(bundle, "log.txt")).read()
    assert "a: unchanged since the previous compile; reusing a.pt" in log
    assert "[PASS] a passed validation (2 examples)" in log
    assert "[PASS] b passed validation (2 examples)" in log
    assert "1/2 a (jit-script): reused from the previous compile" in log
    out = leapp.InferenceManager(os.path.join(bundle, f"{GRAPH}.yaml"))({"a/x": torch.ones(2)})
    assert torch.allclose(out["b/z"], torch.tanh(torch.ones(2)) * 0.5 * 2.0 + 1.0)


def test_validation_checks_a_reused_file(copy):
    """A reused file that does not compute the node fails validation like a fresh one."""
    root, bundle = copy
    shutil.copyfile(os.path.join(bundle, "b.pt"), os.path.join(bundle, "a.pt"))
    manifest = json.load(open(os.path.join(bundle, MANIFEST)))
    manifest["nodes"]["a"]["files"]["a.pt"] = manifest["nodes"]["b"]["files"]["b.pt"]
    json.dump(manifest, open(os.path.join(bundle, MANIFEST), "w"))
    trace(root)
    result = leapp.compile_graph(visualize=False, strict=False)
    assert reused(result) == {"a": True, "b": True}
    assert result == {"a": False, "b": True}


def _bump_versions(monkeypatch, what: str) -> None:
    if what == "torch":
        monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(
            f"{torch.__version__}.post1"))
    else:
        monkeypatch.setattr(_incremental, "__version__", "0.7.2+c999")


# change -> (trace keyword arguments, what to do to the copied bundle, nodes re-exported)
CHANGES = {
    "constant bytes": (dict(scale=3.0), None, {"b"}),
    "a literal": (dict(offset=1.5), None, {"b"}),
    "an op": (dict(op=torch.sigmoid), None, {"a"}),
    "the backend": (dict(backend_b="jit"), None, {"b"}),
    "backend params": (dict(params_b={"check_trace": False}), None, {"b"}),
    "an input name": (dict(input_name="obs"), None, {"a"}),
    "shapes": (dict(shape=(3,)), None, {"a", "b"}),
    "dtypes": (dict(dtype=torch.float64), None, {"a", "b"}),
    "a missing file": ({}, lambda bundle, mp: os.remove(os.path.join(bundle, "b.pt")), {"b"}),
    "an altered file": ({}, lambda bundle, mp: open(os.path.join(bundle, "a.pt"), "ab").write(
        b"\0"), {"a"}),
    "the torch version": ({}, lambda bundle, mp: _bump_versions(mp, "torch"), {"a", "b"}),
    "the leapp version": ({}, lambda bundle, mp: _bump_versions(mp, "leapp"), {"a", "b"}),
    "LEAPP_INCREMENTAL=0": ({}, lambda bundle, mp: mp.setenv("LEAPP_INCREMENTAL", "0"),
                            {"a", "b"}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_in_a_node_key_exports_it_again(copy, monkeypatch, change):
    root, bundle = copy
    kwargs, action, fresh = CHANGES[change]
    if action is not None:
        action(bundle, monkeypatch)
    trace(root, **kwargs)
    result = leapp.compile_graph(visualize=False)
    assert result == {"a": True, "b": True}
    assert reused(result) == {"a": "a" not in fresh, "b": "b" not in fresh}
    manifest = json.load(open(os.path.join(bundle, MANIFEST)))
    for node, entry in manifest["nodes"].items():  # the new manifest names the new files
        for name, digest in entry["files"].items():
            data = open(os.path.join(bundle, name), "rb").read()
            assert hashlib.sha256(data).hexdigest() == digest, (node, name)


def _manifest_entry(bundle: str, node: str, **changes) -> None:
    path = os.path.join(bundle, MANIFEST)
    manifest = json.load(open(path))
    manifest["nodes"][node].update(changes)
    json.dump(manifest, open(path, "w"))


HOSTILE = {
    "not JSON": lambda b: open(os.path.join(b, MANIFEST), "w").write("{not json"),
    "another format": lambda b: open(os.path.join(b, MANIFEST), "w").write(
        json.dumps({"format": 999, "nodes": {}})),
    "a path out of the bundle": lambda b: _manifest_entry(
        b, "a", model_file="../a.pt", files={"../a.pt": "0" * 64}),
    "another node's file": lambda b: _manifest_entry(
        b, "a", model_file="b.pt", files={"b.pt": json.load(open(os.path.join(
            b, MANIFEST)))["nodes"]["b"]["files"]["b.pt"]}),
    "a wrong port count": lambda b: _manifest_entry(b, "a", output_names=["y", "extra"]),
    "a symlink for the file": lambda b: (
        shutil.move(os.path.join(b, "a.pt"), os.path.join(b, "..", "outside.pt")),
        os.symlink(os.path.join(b, "..", "outside.pt"), os.path.join(b, "a.pt"))),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_an_unusable_manifest_means_a_fresh_export(copy, case):
    root, bundle = copy
    HOSTILE[case](bundle)
    trace(root)
    result = leapp.compile_graph(visualize=False)
    assert result == {"a": True, "b": True}
    assert reused(result)["a"] is False
    assert not os.path.islink(os.path.join(bundle, "a.pt"))
    assert os.path.isfile(os.path.join(bundle, MANIFEST))


def test_a_failed_compile_with_reused_files_leaves_the_old_bundle(copy, monkeypatch):
    root, bundle = copy
    before = files(bundle)
    modes = {name: os.stat(os.path.join(bundle, name)).st_mode for name in before}
    import leapp.compiling.backends.jit as jit_backend

    def failing(node, *args, **kwargs):
        raise RuntimeError(f"export of {node} interrupted")

    trace(root, scale=5.0)  # a is reused, b must be exported
    monkeypatch.setattr(jit_backend, "export", failing)
    with pytest.raises(RuntimeError, match="export of b interrupted"):
        leapp.compile_graph(visualize=False)
    assert files(bundle) == before
    assert {name: os.stat(os.path.join(bundle, name)).st_mode for name in before} == modes
    assert os.stat(os.path.join(bundle, "a.pt")).st_nlink == 1  # the staged link is gone
    assert not [n for n in os.listdir(root) if n.startswith(".leapp-")]


def test_a_fault_in_the_keying_is_a_warning_and_the_node_is_exported(copy, monkeypatch):
    """A fault planted in the key's computation: compile goes on, exports every node and
    says at WARNING what failed (an unkeyable node, by contrast, is exported quietly)."""
    root, bundle = copy

    def broken(module):
        raise TypeError("fault planted in the keying")

    monkeypatch.setattr(_incremental, "_graph_lines", broken)
    trace(root)
    result = leapp.compile_graph(visualize=False)
    assert result == {"a": True, "b": True} and reused(result) == {"a": False, "b": False}
    log = open(os.path.join(bundle, "log.txt")).read()
    for node in ("a", "b"):
        assert (f"[WARNING]: {node}: the incremental compile's key of this node could not be "
                "computed (TypeError: fault planted in the keying); the node is exported "
                "again on every compile.") in log, log[-3000:]


def _cell(step: int) -> torch.Tensor:
    """One pass of node "cell": a state h that ONNX renames h_in / h_out, an input
    "folded" it optimises away; returns the output y."""
    x, unused = annotate.input_tensors("cell", {"x": torch.full((1, 3), 0.1 * step),
                                                "folded": torch.ones(1, 3)})
    state = annotate.state_tensors("cell", {"h": torch.zeros(1, 3)})
    new = torch.tanh(x + 0.5 * state) + torch.zeros_like(unused)
    annotate.update_state("cell", {"h": new})
    return annotate.output_tensors("cell", {"y": new * 2.0}, export_with="onnx-torchscript")


def test_onnx_renames_dropped_inputs_and_warnings_survive_reuse(tmp_path):
    """ONNX renames the state port h to h_in / h_out and drops an input it folded
    away (with a warning): a reused node gets the same names, inputs and warning."""
    def run() -> dict:
        leapp.start("s", save_path=str(tmp_path))
        for step in range(2):
            _cell(step)
        leapp.stop()
        return leapp.compile_graph(visualize=False)

    bundle = os.path.join(str(tmp_path), "s")
    first = run()
    before = files(bundle)
    second = run()
    assert first == second == {"cell": True}
    assert reused(first) == {"cell": False} and reused(second) == {"cell": True}
    assert files(bundle) == before
    spec = yaml.safe_load(before["s.yaml"])
    assert [p["name"] for p in spec["models"]["cell"]["inputs"]] == ["x", "h_in"]
    assert [p["name"] for p in spec["models"]["cell"]["outputs"]] == ["y", "h_out"]
    log = open(os.path.join(bundle, "log.txt")).read()
    assert "[WARNING]: [cell] ONNX export optimized away 1 inputs: ['folded']" in log
    manager = leapp.InferenceManager(os.path.join(bundle, "s.yaml"))
    assert torch.allclose(manager({"cell/x": torch.zeros(1, 3)})["cell/y"],
                          torch.zeros(1, 3))


def test_a_node_without_a_model_is_never_reused(tmp_path):
    """Bring-your-own without a file: described in the YAML, no key, its own line."""
    for _ in range(2):
        leapp.start("own", save_path=str(tmp_path))
        x = annotate.input_tensors("a", {"x": torch.ones(2)})
        y = annotate.output_tensors("a", {"y": x * 2}, export_with="jit")
        z = annotate.input_tensors("mine", {"y": y})
        annotate.output_tensors("mine", {"z": z + 1}, export_with=None)
        leapp.stop()
        result = leapp.compile_graph(visualize=False)
    assert reused(result) == {"a": True, "mine": False}
    bundle = os.path.join(str(tmp_path), "own")
    assert set(json.load(open(os.path.join(bundle, MANIFEST)))["nodes"]) == {"a"}
    log = open(os.path.join(bundle, "log.txt")).read()
    assert "2/2 mine (no model): described without a model, nothing to validate" in log


@pytest.mark.parametrize("incremental", ["1", "0"])
def test_compile_reads_the_trace_and_never_writes_it(tmp_path, monkeypatch, incremental):
    """ONNX renames the state port h (h_in / h_out) and drops a folded input: the
    compiled documents carry the renames, the traced nodes keep their ports, and a
    second compile from the same session writes the same bundle."""
    monkeypatch.setenv("LEAPP_INCREMENTAL", incremental)
    leapp.start("s", save_path=str(tmp_path))
    for step in range(2):
        y = annotate.input_tensors("tail", {"y": _cell(step)})
        annotate.output_tensors("tail", {"z": y + 1.0}, export_with="jit")
    leapp.stop()

    def ports() -> dict:
        return {name: ([p.name for p in n.inputs], [p.name for p in n.trimmed_inputs],
                       [p.name for p in n.outputs], [(p.src_node and p.src_node.name, p.src_port)
                                                     for p in n.inputs])
                for name, n in leapp.ExportManager().get_nodes().items()}

    traced = ports()
    assert traced["cell"][0] == ["x", "folded", "h"] and traced["cell"][2] == ["y", "h"]
    bundle = os.path.join(str(tmp_path), "s")
    assert leapp.compile_graph(visualize=False) == {"cell": True, "tail": True}
    assert ports() == traced
    first = files(bundle)
    spec = yaml.safe_load(first["s.yaml"])
    assert [p["name"] for p in spec["models"]["cell"]["inputs"]] == ["x", "h_in"]
    assert [p["name"] for p in spec["models"]["cell"]["outputs"]] == ["y", "h_out"]
    assert spec["pipeline"]["feedback_flow"] == {"cell/h_out": ["cell/h_in"]}
    assert spec["pipeline"]["data_flow"] == {"cell/y": ["tail/y"]}
    assert spec["pipeline"]["inputs"] == {"cell": ["x"]}
    assert leapp.compile_graph(visualize=False) == {"cell": True, "tail": True}
    assert ports() == traced
    again = files(bundle)
    if incremental == "1":  # every node reused: the same files
        assert again == first
        return
    # exported again: the same documents and ONNX file (TorchScript's archive names
    # its classes per process, so only tail.pt's bytes and digests differ)
    assert again["cell.onnx"] == first["cell.onnx"]
    documents = [yaml.safe_load(text) for text in (first["s.yaml"], again["s.yaml"])]
    for document in documents:
        del document["models"]["tail"]["parameters"]["md5sum"]
        del document["models"]["tail"]["parameters"]["sha256sum"]
    assert documents[0] == documents[1]
