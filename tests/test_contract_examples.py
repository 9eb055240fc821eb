"""Every example's models, and its fused model, carry the contract their YAML states.

tests/test_contract.py does this for every backend and every compat pipeline (against
``expected()``, built by the same code), tests/test_contract_golden.py against literal
contracts written by hand;
here the bundles are the ones a new user makes first, with the examples.
"""
from __future__ import annotations

import glob
import importlib.util
import os

import pytest
import torch

import leapp
from leapp.bundle import contract as _contract
from support import ROOT

EXAMPLES = ["getting_started", "complete_pipeline", "method_node", "state_tensors",
            "module_buffers", "stateful_gru_export", "feedback_example"]


def _run_example(name: str, out: str) -> None:
    path = os.path.join(ROOT, "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(out)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_models_carry_their_contract(tmp_path, name):
    threads = torch.get_num_threads()
    try:
        torch.manual_seed(0)
        _run_example(name, str(tmp_path))
    finally:
        torch.set_num_threads(threads)
    bundles = sorted(glob.glob(os.path.join(str(tmp_path), "**", "*.yaml"), recursive=True))
    assert bundles, f"{name} wrote no bundle"
    for yaml_path in bundles:
        checked = 0
        for node in _contract.load_bundle(yaml_path).nodes.values():
            if node.model_path:
                path = os.path.join(os.path.dirname(yaml_path), node.model_path)
                assert leapp.contract(path) == _contract.expected(yaml_path, node.name), node.name
                checked += 1
        assert checked, f"{yaml_path}: no model file checked"
        # TorchScript fusion needs every node as TorchScript or pt2 (docs/fuse.md)
        backends = {n.backend for n in _contract.load_bundle(yaml_path).nodes.values()}
        for format in ("onnx",) + (("torchscript",) if "onnx" not in backends else ()):
            fused = leapp.fuse(yaml_path, format=format, validate_steps=10)
            assert leapp.contract(fused) == _contract.expected(yaml_path, fused=format)
