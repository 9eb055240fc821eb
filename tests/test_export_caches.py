"""The ONNX exporter's one-off costs paid once per process (leapp/compiling/export_caches.py).

One pipeline (a GRU cell with declared state and a head, both "onnx", and a
"jit" scaler) is compiled twice in this module: through the cached path, and
with the torch version check failing, through the plain torch.onnx.export.
Both bundles are validated (each .onnx loaded by onnxruntime), hold the same
ONNX bytes and run to the same outputs in InferenceManager.
"""
from __future__ import annotations

import functools
import gc
import os
import weakref

import pytest
import torch

import leapp
from leapp import InferenceManager, annotate
from leapp.bundle import contract as _contract
from leapp.compiling import export_caches as _export_caches
from leapp.compiling import torch_caches as _torch_caches
from leapp.compiling.backends.onnx import default_opset
from torch.onnx._internal.exporter import _registration

ONNX_NODES = ("memory", "head")


def _trace_and_compile(save_path: str, graph: str) -> dict:
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(4, 8).eval()
    head = torch.nn.Linear(8, 2).eval()
    gen = torch.Generator().manual_seed(1)
    leapp.start(graph, save_path=save_path)
    with torch.no_grad():
        hidden = torch.zeros(1, 8)
        for _ in range(2):
            x = annotate.input_tensors("memory", {"obs": torch.randn(1, 4, generator=gen)})
            h = annotate.state_tensors("memory", {"hidden": hidden})
            new = cell(x, h)
            hidden = annotate.update_state("memory", {"hidden": new})
            feat = annotate.output_tensors("memory", {"features": new * 1.0}, export_with="onnx")
            f = annotate.input_tensors("head", {"features": feat})
            act = annotate.output_tensors("head", {"action": torch.tanh(head(f))},
                                          export_with="onnx")
            a = annotate.input_tensors("scale", {"action": act})
            annotate.output_tensors("scale", {"target": a * 0.5}, export_with="jit")
    leapp.stop()
    return leapp.compile_graph(visualize=False)


class _CountBuilds:
    """Counts ONNXRegistry.from_torchlib calls (the real method still runs)."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = _registration.ONNXRegistry.__dict__["from_torchlib"].__func__

    def __call__(self, cls, *args, **kwargs):
        self.calls += 1
        return self.real(cls, *args, **kwargs)


def _compile(root: str, graph: str, tested: frozenset | None) -> tuple[dict, int]:
    counter = _CountBuilds()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counter))
        mp.delenv("LEAPP_NO_EXPORT_CACHE", raising=False)
        mp.setenv("LEAPP_ONNX_WRITER", "torch")  # these caches serve torch's exporter only
        if tested is not None:
            mp.setattr(_export_caches, "TESTED_TORCH", tested)
        result = _trace_and_compile(root, graph)
    return result, counter.calls


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    if _export_caches.torch_minor() not in _export_caches.TESTED_TORCH:
        pytest.skip("the cached path is not used on this torch version")
    root = str(tmp_path_factory.mktemp("export_caches"))
    cached = _compile(root, "cached", None)
    executor_optimize = torch._C._get_graph_executor_optimize()
    plain = _compile(root, "plain", frozenset())
    return {"root": root, "cached": cached, "plain": plain,
            "executor_optimize": executor_optimize}


def test_both_paths_validate(bundles):
    for variant in ("cached", "plain"):
        result, _ = bundles[variant]
        assert result == {"memory": True, "head": True, "scale": True}, variant


def test_registry_built_once_on_the_cached_path_and_per_node_on_the_plain_one(bundles):
    _, cached_builds = bundles["cached"]
    _, plain_builds = bundles["plain"]
    # At most once (never when an earlier test of the process built it).
    assert cached_builds <= 1
    assert plain_builds == len(ONNX_NODES)


def _model_bytes(path: str) -> bytes:
    """The ONNX model without its contract, which names the bundle it belongs to."""
    import onnx

    model = onnx.load(path)
    kept = [p for p in model.metadata_props if p.key != _contract.ONNX_KEY]
    assert len(kept) < len(model.metadata_props), f"{path} carries no contract"
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model.SerializeToString(deterministic=True)


def test_both_paths_write_the_same_models(bundles):
    root = bundles["root"]
    for node in ONNX_NODES:
        cached = _model_bytes(os.path.join(root, "cached", f"{node}.onnx"))
        plain = _model_bytes(os.path.join(root, "plain", f"{node}.onnx"))
        assert cached == plain, node


def test_both_bundles_run_to_the_same_outputs(bundles):
    root = bundles["root"]
    managers = [InferenceManager(os.path.join(root, graph, f"{graph}.yaml"))
                for graph in ("cached", "plain")]
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        obs = torch.randn(1, 4, generator=gen)
        first, second = (m.run_policy({"memory/obs": obs.clone()}) for m in managers)
        assert list(first) == list(second)
        for key in first:
            assert torch.equal(first[key], second[key]), key


def test_validation_leaves_the_torchscript_executor_as_it_was(bundles):
    assert bundles["executor_optimize"] is True
    assert torch._C._get_graph_executor_optimize() is True


def test_environment_switch_and_missing_internals_choose_the_plain_path(monkeypatch):
    if _export_caches.torch_minor() not in _export_caches.TESTED_TORCH:
        pytest.skip("the cached path is not used on this torch version")
    monkeypatch.delenv("LEAPP_NO_EXPORT_CACHE", raising=False)
    assert _export_caches.cached_path_available()
    monkeypatch.setenv("LEAPP_NO_EXPORT_CACHE", "1")
    assert not _export_caches.cached_path_available()
    monkeypatch.setenv("LEAPP_NO_EXPORT_CACHE", "0")
    assert _export_caches.cached_path_available()
    from torch.onnx._internal.exporter import _decomp
    monkeypatch.delattr(_decomp, "create_onnx_friendly_decomposition_table")
    assert not _export_caches.cached_path_available()


def test_memoised_value_is_rebuilt_when_its_inputs_change(monkeypatch):
    monkeypatch.setattr(_export_caches, "_memo", {})
    builds = []

    def build():
        builds.append(1)
        return {"n": len(builds)}

    assert _export_caches._memoised("k", build, ("a", 1)) == {"n": 1}
    assert _export_caches._memoised("k", build, ("a", 1)) == {"n": 1}
    assert _export_caches._memoised("k", build, ("a", 2)) == {"n": 2}
    assert len(builds) == 2


def test_fingerprint_follows_new_decompositions(monkeypatch):
    before = _export_caches._fingerprint()
    assert _export_caches._fingerprint() == before
    # A decomposition registered later (a new key in torch's table) is seen.
    monkeypatch.setitem(torch._decomp.decomposition_table, object(), lambda *a: None)
    assert _export_caches._fingerprint() != before


def test_memoised_tables_equal_torchs_own(monkeypatch):
    if _export_caches.torch_minor() not in _export_caches.TESTED_TORCH:
        pytest.skip("the cached path is not used on this torch version")
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _decomp
    ops = set(_decomp.get_onnx_implemented_overloads(_export_caches.registry(default_opset())))
    plain_table = _decomp.create_onnx_friendly_decomposition_table(ops)
    plain_cia = exported_program._collect_all_valid_cia_ops()
    with _export_caches._memoised_tables(_decomp, exported_program):
        first = _decomp.create_onnx_friendly_decomposition_table(ops)
        first.clear()  # a caller editing its copy changes nothing kept
        second = _decomp.create_onnx_friendly_decomposition_table(ops)
        cia = exported_program._collect_all_valid_cia_ops()
    assert _comparable(second) == _comparable(plain_table)
    assert cia == plain_cia
    # Restored after.
    restored = _decomp.create_onnx_friendly_decomposition_table
    assert _comparable(restored(ops)) == _comparable(plain_table)


def _comparable(table: dict) -> dict:
    """A table with torch's per-build partials (same function, same kernel) made equal."""
    def describe(fn):
        if isinstance(fn, functools.partial):
            return (fn.func.__qualname__, fn.args, tuple(sorted(fn.keywords.items())))
        return fn
    return {op: describe(fn) for op, fn in table.items()}


def test_cached_export_keeps_no_per_export_state():
    if _export_caches.torch_minor() not in _export_caches.TESTED_TORCH:
        pytest.skip("the cached path is not used on this torch version")

    class Cell(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = torch.nn.GRUCell(4, 8)

        def forward(self, x, h):
            return self.cell(x, h) * 2.0

    def export() -> tuple:
        module = torch.fx.symbolic_trace(Cell().eval())
        program = _export_caches.export_dynamo(
            module, (torch.randn(1, 4), torch.randn(1, 8)), opset=20, verbose=False,
            verify=False, optimize=True, report=False)
        return (weakref.ref(module), weakref.ref(program),
                weakref.ref(program.exported_program))

    refs = export()
    _torch_caches.release_export_caches()  # as compile_graph does after exporting
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
