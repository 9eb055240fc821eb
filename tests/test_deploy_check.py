"""`leapp check --deploy` (leapp.compiling.deploy_check, docs/deploy.md).

One complete bundle (kinds, joint names, frequency, declared state, fused
model) passes with status 0; copies of it, each made incomplete in one way,
fail the check that names the missing piece, its node, port and fix, with
status 1; an unreadable bundle is status 2.  compile_graph logs the findings
about deployment readiness as one INFO line (the count and the command), what
may make the export wrong as warnings, and still writes the bundle.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

import leapp
from leapp import GraphConfigs, InputKindEnum, OutputKindEnum, TensorSemantics, annotate
from leapp import _core
from leapp.compiling.deploy_check import FAIL, PASS, WARN, check_bundle
from leapp.bundle.digest import file_digests
from leapp.cli import main
from support import ROOT

JOINTS = ["hip", "knee", "ankle"]


def _trace(root: str, name: str = "robot", frequency: float | None = 50.0,
           output_kind: OutputKindEnum | None = OutputKindEnum.JOINT_POSITION,
           names: list | None = JOINTS, dtype: torch.dtype = torch.float32,
           fuse: bool = True) -> str:
    torch.manual_seed(0)
    cell = torch.nn.Linear(3 + 4, 4)
    head = torch.nn.Linear(4, 3)
    leapp.start(name, save_path=root)
    with torch.no_grad():
        h0 = torch.zeros(1, 4)
        for _ in range(2):
            q = annotate.input_tensors("encoder", [TensorSemantics(
                name="q", ref=torch.randn(1, 3), kind=InputKindEnum.JOINT_POSITION,
                element_names=JOINTS)])
            h = annotate.state_tensors("encoder", {"h": h0})
            nh = torch.tanh(cell(torch.cat([q, h], dim=-1)))
            annotate.update_state("encoder", {"h": nh})
            z = annotate.output_tensors("encoder", {"z": nh * 2.0}, export_with="jit")
            x = annotate.input_tensors("policy", {"z": z})
            action = torch.tanh(head(x)).to(dtype)
            annotate.output_tensors("policy", [TensorSemantics(
                name="action", ref=action, kind=output_kind, element_names=names)],
                export_with="jit")
    leapp.stop()
    configs = GraphConfigs(frequency=frequency) if frequency else None
    leapp.compile_graph(visualize=False, graph_configs=configs, fuse=fuse)
    return os.path.join(root, name, f"{name}.yaml")


@pytest.fixture(scope="module")
def complete(tmp_path_factory) -> str:
    return _trace(str(tmp_path_factory.mktemp("complete")))


@pytest.fixture
def bundle(complete, tmp_path) -> str:
    """A copy of the complete bundle to spoil."""
    target = tmp_path / "robot"
    shutil.copytree(os.path.dirname(complete), target)
    return str(target / "robot.yaml")


def _edit(yaml_path: str, change) -> None:
    """Rewrite the YAML's documents through change(documents) (as the emitter writes them)."""
    with open(yaml_path) as handle:
        merged = yaml.safe_load(handle)
    change(merged)
    documents = [{k: v} for k, v in merged.items()]
    with open(yaml_path, "w") as handle:
        handle.write(_core.emit_yaml(documents))


def _failed(findings, check: str) -> list:
    return [f for f in findings if f.check == check and f.status == FAIL]


def test_complete_bundle_passes_with_status_0(complete, capsys):
    findings = check_bundle(complete)
    assert [f for f in findings if f.status != PASS] == []
    assert {f.check for f in findings} == {"kind", "element_names", "claims", "initial_values",
                                           "frequency", "boundary", "model", "fused",
                                           "tensorrt"}
    assert main(["check", "--deploy", complete]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "PASS  fused" in out


def test_missing_kind_fails_naming_the_port(bundle, capsys):
    def drop(docs):
        del docs["models"]["policy"]["outputs"][0]["kind"]
    _edit(bundle, drop)
    found = _failed(check_bundle(bundle), "kind")
    assert [(f.node, f.port) for f in found] == [("policy", "action")]
    assert "OutputKindEnum" in found[0].fix
    assert main(["check", "--deploy", bundle]) == 1
    captured = capsys.readouterr()
    assert "FAIL  kind" in captured.out and "policy/action" in captured.out
    assert "deploy check(s) failed" in captured.err


@pytest.mark.parametrize("names, message", [
    (None, "no element_names name the joints"),
    ([["hip", "knee"]], "name 2 elements but the last axis"),
])
def test_joint_level_kind_needs_matching_element_names(bundle, names, message):
    def change(docs):
        port = docs["models"]["encoder"]["inputs"][0]
        if names is None:
            del port["element_names"]
        else:
            port["element_names"] = names
    _edit(bundle, change)
    found = _failed(check_bundle(bundle), "element_names")
    assert [(f.node, f.port) for f in found] == [("encoder", "q")]
    assert message in found[0].message and "element_names=[...]" in found[0].fix


def test_two_outputs_claiming_one_joint_fail(tmp_path):
    def second(docs):
        docs["models"]["encoder"]["outputs"][0].update(
            kind="target/joint/position", element_names=[[f"j{i}" for i in range(3)] + ["hip"]])
        docs["pipeline"]["outputs"]["encoder"] = ["z"]
    yaml_path = _trace(str(tmp_path), fuse=False)
    _edit(yaml_path, second)
    found = _failed(check_bundle(yaml_path), "claims")
    assert len(found) == 1 and "'hip'" in found[0].message
    assert {found[0].node, found[0].port} <= {"encoder", "z", "policy", "action"}


def test_feedback_target_without_initial_value_fails(bundle):
    from safetensors.torch import save_file
    directory = os.path.dirname(bundle)
    save_file({"other/x": torch.zeros(1)}, os.path.join(directory, "robot_initial_values"
                                                                     ".safetensors"))
    found = _failed(check_bundle(bundle), "initial_values")
    assert len(found) == 1 and found[0].node == "encoder" and "no initial value" in \
        found[0].message
    assert main(["check", "--deploy", bundle]) == 1


def test_missing_frequency_fails(bundle):
    def drop(docs):
        del docs["pipeline"]["configs"]
    _edit(bundle, drop)
    found = _failed(check_bundle(bundle), "frequency")
    assert len(found) == 1 and "GraphConfigs(frequency=" in found[0].fix


def test_float64_at_the_boundary_fails(tmp_path):
    yaml_path = _trace(str(tmp_path), dtype=torch.float64, fuse=False)
    found = _failed(check_bundle(yaml_path), "boundary")
    assert [(f.node, f.port) for f in found] == [("policy", "action")]
    assert "float64" in found[0].message and "float32" in found[0].fix


def test_altered_model_file_fails_its_checksum(bundle):
    path = os.path.join(os.path.dirname(bundle), "policy.pt")
    with open(path, "ab") as handle:
        handle.write(b"\0")
    found = _failed(check_bundle(bundle), "model")
    assert [f.node for f in found] == ["policy"] and "sha256" in found[0].message


def test_contract_differing_from_the_yaml_fails(bundle):
    """A hand edit of the YAML (a joint renamed) no longer matches what the model carries."""
    def rename(docs):
        docs["models"]["policy"]["outputs"][0]["element_names"] = [["hip", "knee", "toe"]]
    _edit(bundle, rename)
    found = _failed(check_bundle(bundle), "model")
    assert [f.node for f in found] == ["policy"]
    assert "contract differs" in found[0].message and "toe" in found[0].message
    fused = _failed(check_bundle(bundle), "fused")
    assert len(fused) == 1 and "contract differs" in fused[0].message


def test_altered_fused_model_fails(bundle):
    path = os.path.join(os.path.dirname(bundle), "robot_fused.onnx")
    with open(path, "ab") as handle:
        handle.write(b"\0")
    found = _failed(check_bundle(bundle), "fused")
    assert len(found) == 1 and "sha256" in found[0].message


def test_model_without_contract_and_bundle_without_fused_model_warn(bundle):
    from leapp.bundle.contract import EXTRA_FILE
    import zipfile
    path = os.path.join(os.path.dirname(bundle), "encoder.pt")
    with zipfile.ZipFile(path) as archive:
        entries = [(i, archive.read(i)) for i in archive.infolist()
                   if not i.filename.endswith(EXTRA_FILE)]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in entries:
            archive.writestr(info, data)

    def unfuse(docs):
        del docs["fused"]
        docs["models"]["encoder"]["parameters"]["sha256sum"] = file_digests(path)[0]
    _edit(bundle, unfuse)
    findings = check_bundle(bundle)
    warned = {(f.check, f.node) for f in findings if f.status == WARN}
    assert warned == {("model", "encoder"), ("fused", None)}
    assert main(["check", "--deploy", bundle]) == 0  # warnings alone pass


def test_unreadable_bundle_is_status_2(tmp_path, capsys):
    assert main(["check", "--deploy", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_compile_graph_logs_readiness_as_one_info_line_and_writes_the_bundle(tmp_path, caplog):
    """No kind, no frequency: one INFO line with the count and the command, no WARNING."""
    with caplog.at_level(logging.INFO, logger="leapp"):
        yaml_path = _trace(str(tmp_path), frequency=None, output_kind=None, names=None,
                           fuse=False)
    assert os.path.exists(yaml_path)
    deploy = [r for r in caplog.records if "Deploy" in r.getMessage()]
    assert [r.levelno for r in deploy] == [logging.INFO]
    message = deploy[0].getMessage()
    # the policy's output has no kind, the pipeline no frequency: 2 findings
    assert "Deploy readiness: 2 finding(s) (kind 1, frequency 1)" in message, message
    assert f"`leapp check --deploy {os.path.dirname(os.path.realpath(yaml_path))}`" in message
    assert main(["check", "--deploy", os.path.dirname(yaml_path)]) == 1  # the command works


def test_missing_initial_value_stays_a_warning_at_compile(bundle, caplog):
    """What may make the export wrong (a state starting from zeros) is a WARNING."""
    from safetensors.torch import save_file
    from leapp.bundle.contract import load_bundle
    from leapp.compiling.deploy_check import log_compile
    directory = os.path.dirname(bundle)
    save_file({"other/x": torch.zeros(1)}, os.path.join(directory, "robot_initial_values"
                                                                     ".safetensors"))
    with caplog.at_level(logging.INFO, logger="leapp"):
        log_compile(load_bundle(bundle), directory, directory)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'initial_values'" in warnings[0], warnings
    assert "encoder/" in warnings[0] and "no initial value" in warnings[0]
    assert not [r for r in caplog.records if "Deploy readiness" in r.getMessage()]


def test_a_check_that_raises_is_a_warning_and_the_others_still_run(tmp_path, caplog,
                                                                   monkeypatch, capsys):
    """A bug inside one of leapp's checks surfaces (WARNING, what failed), never DEBUG."""
    from leapp.compiling import deploy_check

    def broken(model):
        raise KeyError("planted")
    monkeypatch.setattr(deploy_check, "check_frequency", broken)
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        yaml_path = _trace(str(tmp_path), output_kind=None, names=None, fuse=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "Deploy" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "'frequency'" in warnings[0] and "the check itself failed: KeyError" in \
        warnings[0] and "planted" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if "Deploy readiness" in r.getMessage()]
    assert len(infos) == 1 and "kind 1" in infos[0]  # the kind check still ran
    # the command line names the failed check too
    assert main(["check", "--deploy", yaml_path]) == 1
    out = capsys.readouterr().out
    assert "FAIL  frequency" in out and "the check itself failed: KeyError" in out


def test_check_deploy_accepts_the_bundle_directory(complete, capsys, tmp_path):
    directory = os.path.dirname(complete)
    assert main(["check", "--deploy", directory]) == 0
    out = capsys.readouterr().out
    assert f"deploy check of robot ({complete})" in out and "0 failed" in out
    # a directory named otherwise, holding one YAML file
    other = tmp_path / "renamed"
    shutil.copytree(directory, other)
    assert main(["check", "--deploy", str(other)]) == 0
    # a directory with no bundle in it is refused as before
    assert main(["check", "--deploy", str(tmp_path / "renamed" / "..")]) == 2
    assert "is a directory" in capsys.readouterr().err


def _readme_example() -> str:
    """The README's first Python block (the five-line example), as written."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "leapp.compile_graph()" in block and "my_pipeline" in block
    return block


def test_readme_example_compiles_without_a_warning(tmp_path):
    """A newcomer's first compile: no WARNING on the console nor in log.txt (which takes
    every record); the deploy findings are the one INFO line."""
    script = f"import sys\nsys.path.insert(0, {ROOT!r})\n" + _readme_example()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    # leapp's console is stderr, as a library's (and upstream's): the script's stdout stays
    # its own
    assert proc.stdout == "", proc.stdout
    log = open(os.path.join(tmp_path, "my_pipeline", "log.txt"), encoding="utf-8").read()
    assert "[WARNING]" not in log and "[ERROR]" not in log, log
    assert "[INFO]: Deploy readiness: 3 finding(s) (kind 2, frequency 1)" in log
    assert "LEAPP export artifacts saved" in proc.stderr  # the record upstream prints too


# ---- the ops TensorRT documents ------------------------------------------------------


def test_onnx_model_with_an_op_tensorrt_lacks_is_listed(tmp_path, capsys):
    """torch.bitwise_and exports to ONNX's BitwiseAnd, which TensorRT's parser lacks; the
    other node's model passes."""
    leapp.start("masks", save_path=str(tmp_path))
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        a, b = (torch.randint(0, 64, (1, 4), dtype=torch.int32, generator=gen)
                for _ in range(2))
        a, b = annotate.input_tensors("mask", {"a": a, "b": b})
        bits = annotate.output_tensors("mask", {"bits": torch.bitwise_and(a, b)},
                                       export_with="onnx")
        x = annotate.input_tensors("scale", {"bits": bits})
        annotate.output_tensors("scale", {"y": torch.tanh(x.float() * 0.5)}, export_with="onnx")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    yaml_path = str(tmp_path / "masks" / "masks.yaml")
    found = [f for f in check_bundle(yaml_path) if f.check == "tensorrt"]
    assert [(f.node, f.status) for f in found] == [("mask", WARN), ("scale", PASS)]
    assert "BitwiseAnd x1" in found[0].message and "mask.onnx" in found[0].message
    assert "ONNX Runtime" in found[0].fix
    main(["check", "--deploy", yaml_path])
    assert "WARN  tensorrt" in capsys.readouterr().out


def test_ops_in_subgraphs_and_local_functions_are_counted(tmp_path):
    """An If's branches are walked; a local function's call counts the function's ops; an op
    of another domain is outside the set."""
    import onnx
    from onnx import TensorProto, helper

    from leapp.compiling import tensorrt_ops

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    then = helper.make_graph([helper.make_node("Det", ["x"], ["d"])], "then", [],
                             [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1])])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
                              "else", [],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)])
    twice = helper.make_function("local", "Twice", ["a"], ["b"], [
        helper.make_node("Add", ["a", "a"], ["t"]),
        helper.make_node("FusedMatMul", ["t", "t"], ["b"], domain="com.microsoft")],
        [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    graph = helper.make_graph([helper.make_node("Twice", ["x"], ["x2"], domain="local"),
                               helper.make_node("If", ["flag"], ["y"], then_branch=then,
                                                else_branch=other)],
                              "g", [x, flag], [y])
    model = helper.make_model(graph, functions=[twice], opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("local", 1),
        helper.make_opsetid("com.microsoft", 1)])
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    proto = tensorrt_ops.read(path)
    counts = tensorrt_ops.op_counts(proto)
    assert counts == {"Add": 1, "com.microsoft::FusedMatMul": 1, "If": 1, "Det": 1,
                      "ReduceSum": 1}
    assert tensorrt_ops.outside(counts) == {"Det": 1, "com.microsoft::FusedMatMul": 1}
    assert tensorrt_ops.default_opset(proto) == 21
