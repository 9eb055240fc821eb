"""Golden contracts: what two small bundles' model files must carry, written out by hand.

tests/test_contract.py checks every backend's contract against
``leapp.bundle.contract.expected()``, which is built by the same functions as the
contract compile writes: a wrong value in both passes there.  Here each
expected contract is a literal, written from the traced program and
docs/deploy.md (ports in declaration order, ``graph_input`` / ``graph_output``
indices, the feedback pairs and their initial values as little-endian base64),
so a wrong value in what compile writes fails, and a test plants one to show it.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import leapp
from leapp import GraphConfigs, InputKindEnum, OutputKindEnum, TensorSemantics, annotate
from leapp.bundle import contract as _contract

JOINTS = ["hip", "knee", "ankle"]
ZEROS_1x4 = "AAAAAAAAAAAAAAAAAAAAAA=="  # 16 zero bytes: float32 zeros of shape [1, 4]
HALF_MINUS_ONE = "AAAAPwAAgL8="  # float32 [0.5, -1.0] little-endian: 00 00 00 3f 00 00 80 bf


def _header(graph: str, configs: Any) -> dict:
    return {"schema": "leapp.contract", "schema_version": 1, "graph": graph,
            "leapp_version": leapp.__version__, "leapp_implementation": "c",
            "config_version": "1.3", "configs": configs}


WALKER_ENCODER = dict(_header("walker", {"frequency": 50.0}), **{
    "artifact": "node", "node": "encoder", "backend": "jit",
    "inputs": [
        {"index": 0, "name": "q", "key": "encoder/q", "dtype": "float32", "shape": [1, 3],
         "type": "tensor",
         "semantics": {"kind": "state/joint/position", "element_names": [JOINTS],
                       "units": "rad"},
         "graph_input": 0, "source": None, "feedback": False},
        {"index": 1, "name": "h", "key": "encoder/h", "dtype": "float32", "shape": [1, 4],
         "type": "tensor", "semantics": {}, "graph_input": None, "source": "encoder/h",
         "feedback": True,
         "initial": {"dtype": "float32", "shape": [1, 4], "encoding": "base64-le",
                     "data": ZEROS_1x4}},
    ],
    "outputs": [
        {"index": 0, "name": "z", "key": "encoder/z", "dtype": "float32", "shape": [1, 4],
         "type": "tensor", "semantics": {}, "graph_output": None, "targets": ["policy/z"],
         "feedback_targets": []},
        {"index": 1, "name": "h", "key": "encoder/h", "dtype": "float32", "shape": [1, 4],
         "type": "tensor", "semantics": {}, "graph_output": None, "targets": [],
         "feedback_targets": ["encoder/h"]},
    ],
})

WALKER_POLICY = dict(_header("walker", {"frequency": 50.0}), **{
    "artifact": "node", "node": "policy", "backend": "jit",
    "inputs": [
        {"index": 0, "name": "z", "key": "policy/z", "dtype": "float32", "shape": [1, 4],
         "type": "tensor", "semantics": {}, "graph_input": None, "source": "encoder/z",
         "feedback": False},
    ],
    "outputs": [
        {"index": 0, "name": "action", "key": "policy/action", "dtype": "float32",
         "shape": [1, 3], "type": "tensor",
         "semantics": {"kind": "target/joint/position", "element_names": [JOINTS]},
         "graph_output": 0, "targets": [], "feedback_targets": []},
    ],
})

WALKER_FUSED_ONNX = dict(_header("walker", {"frequency": 50.0}), **{
    "artifact": "fused", "format": "onnx", "nodes": ["encoder", "policy"],
    "inputs": [
        {"index": 0, "name": "encoder/q", "key": "encoder/q", "dtype": "float32",
         "shape": [1, 3], "type": "tensor",
         "semantics": {"kind": "state/joint/position", "element_names": [JOINTS],
                       "units": "rad"},
         "graph_input": 0},
        {"index": 1, "name": "encoder/h", "key": "encoder/h", "dtype": "float32",
         "shape": [1, 4], "type": "tensor", "semantics": {}, "state": "encoder/h"},
    ],
    "outputs": [
        {"index": 0, "name": "policy/action", "key": "policy/action", "dtype": "float32",
         "shape": [1, 3], "type": "tensor",
         "semantics": {"kind": "target/joint/position", "element_names": [JOINTS]},
         "graph_output": 0},
        {"index": 1, "name": "encoder/h__next", "key": "encoder/h", "dtype": "float32",
         "shape": [1, 4], "type": "tensor", "semantics": {}, "state": "encoder/h"},
    ],
    "feedback": [
        {"target": "encoder/h", "source": "encoder/h", "input": "encoder/h",
         "output": "encoder/h__next",
         "initial": {"dtype": "float32", "shape": [1, 4], "encoding": "base64-le",
                     "data": ZEROS_1x4}},
    ],
})

MIXER_MIX = dict(_header("mixer", None), **{
    "artifact": "node", "node": "mix", "backend": "pt2",
    "inputs": [
        {"index": 0, "name": "obs", "key": "mix/obs", "dtype": "float32", "shape": [2],
         "type": "tensor", "semantics": {}, "graph_input": 0, "source": None,
         "feedback": False},
        {"index": 1, "name": "memory", "key": "mix/memory", "dtype": "float32", "shape": [2],
         "type": "tensor", "semantics": {}, "graph_input": None, "source": "blend/memory",
         "feedback": True,
         "initial": {"dtype": "float32", "shape": [2], "encoding": "base64-le",
                     "data": HALF_MINUS_ONE}},
    ],
    "outputs": [
        {"index": 0, "name": "y", "key": "mix/y", "dtype": "float32", "shape": [2],
         "type": "tensor", "semantics": {}, "graph_output": None, "targets": ["blend/y"],
         "feedback_targets": []},
        {"index": 1, "name": "best", "key": "mix/best", "dtype": "int64", "shape": [],
         "type": "tensor", "semantics": {}, "graph_output": 0, "targets": [],
         "feedback_targets": []},
    ],
})

MIXER_BLEND = dict(_header("mixer", None), **{
    "artifact": "node", "node": "blend", "backend": "pt2",
    "inputs": [
        {"index": 0, "name": "y", "key": "blend/y", "dtype": "float32", "shape": [2],
         "type": "tensor", "semantics": {}, "graph_input": None, "source": "mix/y",
         "feedback": False},
    ],
    "outputs": [
        {"index": 0, "name": "memory", "key": "blend/memory", "dtype": "float32",
         "shape": [2], "type": "tensor", "semantics": {}, "graph_output": None,
         "targets": [], "feedback_targets": ["mix/memory"]},
    ],
})


def _walker(root: str) -> str:
    """encoder (joint positions with units, declared state h, zero initial) -> policy."""
    torch.manual_seed(0)
    cell = torch.nn.Linear(3 + 4, 4)
    head = torch.nn.Linear(4, 3)
    leapp.start("walker", save_path=root)
    with torch.no_grad():
        h0 = torch.zeros(1, 4)
        for _ in range(2):
            q = annotate.input_tensors("encoder", [TensorSemantics(
                name="q", ref=torch.randn(1, 3), kind=InputKindEnum.JOINT_POSITION,
                element_names=JOINTS, extra={"units": "rad"})])
            h = annotate.state_tensors("encoder", {"h": h0})
            nh = torch.tanh(cell(torch.cat([q, h], dim=-1)))
            annotate.update_state("encoder", {"h": nh})
            z = annotate.output_tensors("encoder", {"z": nh * 2.0}, export_with="jit")
            x = annotate.input_tensors("policy", {"z": z})
            annotate.output_tensors("policy", [TensorSemantics(
                name="action", ref=torch.tanh(head(x)), kind=OutputKindEnum.JOINT_POSITION,
                element_names=JOINTS)], export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, graph_configs=GraphConfigs(frequency=50.0),
                               fuse=True) == {"encoder": True, "policy": True}
    return os.path.join(root, "walker")


def _mixer(root: str) -> str:
    """mix (obs, memory fed back from blend, initial [0.5, -1]) -> y, best (int64 scalar);
    blend (y) -> memory.  No semantics, no configs."""
    torch.manual_seed(0)
    leapp.start("mixer", save_path=root)
    memory = torch.tensor([0.5, -1.0])
    for _ in range(2):
        obs, mem = annotate.input_tensors("mix", {"obs": torch.rand(2), "memory": memory})
        y = obs * 2.0 + mem
        annotate.output_tensors("mix", {"y": y, "best": torch.argmax(y, dim=-1)},
                                export_with="pt2")
        seen = annotate.input_tensors("blend", {"y": y})
        memory = annotate.output_tensors("blend", {"memory": 0.5 * seen}, export_with="pt2")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"mix": True, "blend": True}
    return os.path.join(root, "mixer")


def differences(got: Any, want: Any, where: str = "contract") -> list[str]:
    """Every path where ``got`` differs from ``want``, with both values."""
    if isinstance(want, dict) and isinstance(got, dict):
        found = [f"{where}.{k}: missing" for k in want if k not in got]
        found += [f"{where}.{k}: unexpected ({got[k]!r})" for k in got if k not in want]
        for key in want:
            if key in got:
                found += differences(got[key], want[key], f"{where}.{key}")
        return found
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want))
                for d in differences(g, w, f"{where}[{i}]")]
    if type(got) is not type(want) or got != want:
        return [f"{where}: {got!r}, expected {want!r}"]
    return []


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("golden"))
    return {"walker": _walker(root), "mixer": _mixer(root)}


GOLDEN = [("walker", "encoder.pt", WALKER_ENCODER), ("walker", "policy.pt", WALKER_POLICY),
          ("walker", "walker_fused.onnx", WALKER_FUSED_ONNX),
          ("mixer", "mix.pt2", MIXER_MIX), ("mixer", "blend.pt2", MIXER_BLEND)]


@pytest.mark.parametrize("bundle,file,golden", GOLDEN, ids=[f"{b}/{f}" for b, f, _ in GOLDEN])
def test_model_file_carries_the_golden_contract(bundles, bundle, file, golden):
    carried = leapp.contract(os.path.join(bundles[bundle], file))
    assert differences(carried, golden) == []


def test_initial_values_decode_to_the_traced_tensors():
    """The literals' base64 is the tensors the programs start from."""
    zeros = _contract.decode_tensor({"dtype": "float32", "shape": [1, 4], "data": ZEROS_1x4})
    assert torch.equal(zeros, torch.zeros(1, 4))
    memory = _contract.decode_tensor({"dtype": "float32", "shape": [2],
                                      "data": HALF_MINUS_ONE})
    assert torch.equal(memory, torch.tensor([0.5, -1.0]))


def test_a_planted_wrong_value_fails_the_golden_comparison(bundles, tmp_path):
    """A contract with one wrong value, written into a copy of the model: named by path."""
    import shutil
    path = str(tmp_path / "encoder.pt")
    shutil.copyfile(os.path.join(bundles["walker"], "encoder.pt"), path)
    carried = leapp.contract(path)
    carried["inputs"][0]["semantics"]["units"] = "deg"
    carried["outputs"][0]["targets"] = []
    assert _contract.write(path, carried)
    assert differences(leapp.contract(path), WALKER_ENCODER) == [
        "contract.inputs[0].semantics.units: 'deg', expected 'rad'",
        "contract.outputs[0].targets: [], expected ['policy/z']"]
