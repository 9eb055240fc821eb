"""The contract inside every artifact (leapp.bundle.contract, docs/deploy.md).

For each backend, and for the fused model in both formats, the contract read
back from the file equals the one the bundle's YAML gives; ONNX files still
load in onnxruntime (which sees the contract as custom metadata) and the
bundle still runs under upstream's InferenceManager; incremental compiles
keep their checksums in step; archives of both pt2 layouts carry it.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile

import pytest
import torch

import leapp
from leapp import GraphConfigs, InputKindEnum, OutputKindEnum, TensorSemantics, annotate
from leapp.bundle import contract as _contract
from leapp.bundle.digest import file_digests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402

JOINTS = ["hip", "knee", "ankle"]
BACKENDS = ["jit", "jit-trace", "onnx", "onnx-torchscript", "pt2"]


def _compile(root: str, backend: str, frequency: float | None = 50.0,
             fuse: bool = False) -> str:
    """encoder (declared state h) -> policy; semantics on every graph port."""
    torch.manual_seed(0)
    cell = torch.nn.Linear(3 + 4, 4)
    head = torch.nn.Linear(4, 3)
    leapp.start("walker", save_path=root)
    with torch.no_grad():
        h0 = torch.zeros(1, 4)
        for i in range(2):
            q = annotate.input_tensors("encoder", [TensorSemantics(
                name="q", ref=torch.randn(1, 3), kind=InputKindEnum.JOINT_POSITION,
                element_names=JOINTS, extra={"units": "rad"})])
            h = annotate.state_tensors("encoder", {"h": h0})
            nh = torch.tanh(cell(torch.cat([q, h], dim=-1)))
            annotate.update_state("encoder", {"h": nh})
            z = annotate.output_tensors("encoder", {"z": nh * 2.0}, export_with=backend)
            x = annotate.input_tensors("policy", {"z": z})
            annotate.output_tensors("policy", [TensorSemantics(
                name="action", ref=torch.tanh(head(x)), kind=OutputKindEnum.JOINT_POSITION,
                element_names=JOINTS)], export_with=backend)
    leapp.stop()
    configs = GraphConfigs(frequency=frequency) if frequency else None
    result = leapp.compile_graph(visualize=False, graph_configs=configs, fuse=fuse)
    assert result == {"encoder": True, "policy": True}
    return os.path.join(root, "walker", "walker.yaml")


def _model(yaml_path: str, node: str) -> str:
    suffix = {"jit": ".pt", "jit-trace": ".pt", "onnx": ".onnx",
              "onnx-torchscript": ".onnx", "pt2": ".pt2"}
    for ext in set(suffix.values()):
        path = os.path.join(os.path.dirname(yaml_path), node + ext)
        if os.path.exists(path):
            return path
    raise AssertionError(f"no model file for {node}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_carries_the_yaml_contract(tmp_path, backend):
    yaml_path = _compile(str(tmp_path), backend, fuse=backend in ("onnx", "jit"))
    for node in ("encoder", "policy"):
        path = _model(yaml_path, node)
        carried = leapp.contract(path)
        assert carried == _contract.expected(yaml_path, node)
        assert carried["node"] == node and carried["graph"] == "walker"
    encoder = leapp.contract(_model(yaml_path, "encoder"))
    q = encoder["inputs"][0]
    assert q["semantics"] == {"kind": "state/joint/position", "element_names": [JOINTS],
                              "units": "rad"}
    assert q["graph_input"] == 0 and q["shape"] == [1, 3] and q["dtype"] == "float32"
    state = [p for p in encoder["inputs"] if p["feedback"]]
    # ONNX names a port that is both input and output h_in / h_out
    assert len(state) == 1 and state[0]["source"] in ("encoder/h", "encoder/h_out")
    assert _contract.decode_tensor(state[0]["initial"]).shape == (1, 4)
    assert encoder["configs"] == {"frequency": 50.0}
    policy = leapp.contract(_model(yaml_path, "policy"))
    assert policy["outputs"][0]["graph_output"] == 0
    assert policy["inputs"][0]["source"] == "encoder/z"
    # the YAML's checksums are those of the files with their contract
    manager = leapp.InferenceManager(yaml_path)
    out = manager.run_policy({"encoder/q": torch.ones(1, 3)})
    assert out["policy/action"].shape == (1, 3)
    if backend.startswith("onnx"):
        import onnxruntime as ort
        session = ort.InferenceSession(_model(yaml_path, "encoder"),
                                       providers=["CPUExecutionProvider"])
        meta = session.get_modelmeta().custom_metadata_map
        assert json.loads(meta[_contract.ONNX_KEY]) == encoder
    if backend == "jit":
        extra = {_contract.EXTRA_FILE: ""}
        torch.jit.load(_model(yaml_path, "encoder"), _extra_files=extra)
        assert json.loads(extra[_contract.EXTRA_FILE]) == encoder
    if backend == "pt2":
        extra = {_contract.EXTRA_FILE: ""}
        torch.export.load(_model(yaml_path, "encoder"), extra_files=extra)
        assert json.loads(extra[_contract.EXTRA_FILE]) == encoder
    if backend in ("onnx", "jit"):  # compile_graph(fuse=True) writes the ONNX fused model
        fused = os.path.join(os.path.dirname(yaml_path), "walker_fused.onnx")
        assert leapp.contract(fused) == _contract.expected(yaml_path, fused="onnx")
    if backend == "jit":
        path = leapp.fuse(yaml_path, format="torchscript")
        carried = leapp.contract(path)
        assert carried == _contract.expected(yaml_path, fused="torchscript")
        assert [p["name"] for p in carried["inputs"]] == ["encoder/q", "encoder/h"]
        assert [p["name"] for p in carried["outputs"]] == ["policy/action", "encoder/h__next"]
        pair = carried["feedback"][0]
        assert (pair["target"], pair["source"]) == ("encoder/h", "encoder/h")
        assert carried["inputs"][0]["semantics"]["element_names"] == [JOINTS]


def test_fused_onnx_contract_is_read_by_onnxruntime_alone(tmp_path):
    yaml_path = _compile(str(tmp_path), "onnx-torchscript")
    fused = leapp.fuse(yaml_path)
    import onnxruntime as ort
    session = ort.InferenceSession(fused, providers=["CPUExecutionProvider"])
    contract = json.loads(session.get_modelmeta().custom_metadata_map[_contract.ONNX_KEY])
    assert contract == _contract.expected(yaml_path, fused="onnx")
    assert [i.name for i in session.get_inputs()] == [p["name"] for p in contract["inputs"]]
    assert [o.name for o in session.get_outputs()] == [p["name"] for p in contract["outputs"]]


def test_incremental_recompile_reuses_stamped_files_and_restamps_a_changed_contract(tmp_path):
    yaml_path = _compile(str(tmp_path), "jit", frequency=None)
    encoder = _model(yaml_path, "encoder")
    before = file_digests(encoder)[0]
    assert leapp.contract(encoder)["configs"] is None
    # configs change every contract but no node's content key: reused, then re-stamped
    yaml_path = _compile(str(tmp_path), "jit", frequency=25.0)
    log = open(os.path.join(os.path.dirname(yaml_path), "log.txt")).read()
    assert "unchanged since the previous compile; reusing encoder.pt" in log
    carried = leapp.contract(encoder)
    assert carried["configs"] == {"frequency": 25.0}
    assert carried == _contract.expected(yaml_path, "encoder")
    assert file_digests(encoder)[0] != before
    leapp.InferenceManager(yaml_path).run_policy({"encoder/q": torch.ones(1, 3)})
    # the same again: the manifest holds the re-stamped checksum, so it is reused as is
    _compile(str(tmp_path), "jit", frequency=25.0)
    log = open(os.path.join(os.path.dirname(yaml_path), "log.txt")).read()
    assert "unchanged since the previous compile; reusing encoder.pt" in log
    assert leapp.contract(encoder) == _contract.expected(yaml_path, "encoder")


def _legacy_pt2(path: str) -> None:
    """A torch 2.7 style flat torch.export archive."""
    from torch._export.serde.serialize import SCHEMA_VERSION, serialize
    artifact = serialize(torch.export.export(torch.nn.Linear(3, 2), (torch.ones(1, 3),)))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("serialized_exported_program.json", artifact.exported_program)
        archive.writestr("serialized_state_dict.pt", artifact.state_dict)
        archive.writestr("serialized_constants.pt", artifact.constants)
        archive.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))


def test_flat_torch27_pt2_archive_carries_the_contract(tmp_path):
    from leapp.bundle.pt2_reader import load_pt2
    path = str(tmp_path / "legacy.pt2")
    _legacy_pt2(path)
    contract = {"schema": _contract.SCHEMA, "schema_version": 1, "node": "n"}
    assert _contract.read_or_none(path) is None
    assert _contract.write(path, contract)
    assert f"extra_files/{_contract.EXTRA_FILE}" in zipfile.ZipFile(path).namelist()
    assert leapp.contract(path) == contract
    assert not _contract.write(path, contract)  # already there: the file is left alone
    changed = dict(contract, node="m")
    assert _contract.write(path, changed) and leapp.contract(path) == changed
    assert zipfile.ZipFile(path).namelist().count(f"extra_files/{_contract.EXTRA_FILE}") == 1
    x = torch.randn(1, 3)
    assert load_pt2(path).module()(x).shape == (1, 2)  # still loads, without unpickling


def test_contract_is_read_without_loading_and_missing_one_is_named(tmp_path):
    module = torch.jit.script(torch.nn.Linear(2, 2))
    path = str(tmp_path / "plain.pt")
    torch.jit.save(module, path)
    with pytest.raises(_contract.ContractError, match="carries no leapp contract"):
        leapp.contract(path)
    contract = {"schema": _contract.SCHEMA, "schema_version": 1}
    assert _contract.write(path, contract) and leapp.contract(path) == contract
    torch.jit.load(path)  # still a TorchScript archive
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(_contract.ContractError):
        leapp.contract(str(bad))


def test_inspect_prints_a_model_files_contract(tmp_path, capsys):
    from leapp.cli import main
    yaml_path = _compile(str(tmp_path), "onnx-torchscript")
    assert main(["inspect", _model(yaml_path, "encoder")]) == 0
    out = capsys.readouterr().out
    assert "node encoder of graph walker" in out
    assert "kind=state/joint/position" in out and "graph_input=0" in out
    plain = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(plain))
    assert main(["inspect", str(plain)]) == 1
    assert main(["inspect", str(tmp_path / "missing.onnx")]) == 2


# ---- every compat pipeline, and upstream's InferenceManager ---------------------------------

UPSTREAM = compat.find_upstream_python()


def test_every_compat_pipeline_carries_its_contract(tmp_path, monkeypatch):
    """Each compat pipeline as exported here (run in this process): every model's and
    the fused ONNX model's contract equals its YAML's."""
    import runpy
    monkeypatch.syspath_prepend(compat.PIPELINE_DIR)
    threads = torch.get_num_threads()
    checked = 0
    try:
        for name in compat.PIPELINES:
            out = str(tmp_path / name)
            monkeypatch.setattr(sys, "argv", [name + ".py", out])
            runpy.run_path(os.path.join(compat.PIPELINE_DIR, name + ".py"), run_name="__main__")
            yaml_path = os.path.join(out, name, name + ".yaml")
            model = _contract.load_bundle(yaml_path)
            for node in model.nodes.values():
                if node.model_path:
                    path = os.path.join(os.path.dirname(yaml_path), node.model_path)
                    assert leapp.contract(path) == _contract.expected(yaml_path, node.name), name
                    checked += 1
            fused = leapp.fuse(yaml_path, validate_steps=10)
            assert leapp.contract(fused) == _contract.expected(yaml_path, fused="onnx"), name
    finally:
        torch.set_num_threads(threads)
    assert checked >= len(compat.PIPELINES)


@pytest.mark.skipif(UPSTREAM is None, reason="no upstream leapp interpreter: run `make compat` "
                    "(creates .compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_bundles_with_contracts_run_under_upstreams_inference_manager(tmp_path):
    bundles = {b: _compile(str(tmp_path / b), b) for b in ("onnx", "pt2", "jit")}
    inputs = str(tmp_path / "inputs.safetensors")
    compat.make_inputs(bundles["onnx"], inputs)
    runs = {}
    from safetensors.torch import load_file
    for side, python in (("ours", sys.executable), ("upstream", UPSTREAM)):
        out = str(tmp_path / f"{side}.safetensors")
        info, error = compat.run_inference(python, bundles, inputs, out, ours=side == "ours")
        assert not error, error
        assert all(v["ok"] for v in info.values()), info
        runs[side] = load_file(out)
    assert runs["ours"].keys() == runs["upstream"].keys()
    for key, value in runs["ours"].items():
        torch.testing.assert_close(runs["upstream"][key], value, rtol=1e-5, atol=1e-5)


def test_yaml_stays_upstreams(tmp_path):
    """The contract lives in the model files only: the YAML has no key of its own."""
    yaml_path = _compile(str(tmp_path), "onnx")
    text = open(yaml_path).read()
    assert "contract" not in text
    shutil.rmtree(os.path.dirname(yaml_path))
