"""FunctionPatch: the definition, its checks, installation, dispatch and restore."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

import leapp
from leapp import FunctionPatch, _core, annotate


@pytest.fixture
def mod():
    module = types.ModuleType("patched_module")
    module.f = lambda *args, **kwargs: "original f"
    module.g = lambda *args, **kwargs: "original g"
    return module


def _replacement(*args, **kwargs):
    return "replacement"


def test_function_patch_is_a_frozen_dataclass_with_upstream_fields(mod):
    assert [f.name for f in dataclasses.fields(FunctionPatch)] == \
        ["module", "function_name", "replacement"]
    patch = FunctionPatch(mod, "f", _replacement)
    assert patch == FunctionPatch(module=mod, function_name="f", replacement=_replacement)
    assert hash(patch) == hash(FunctionPatch(mod, "f", _replacement))
    with pytest.raises(dataclasses.FrozenInstanceError):
        patch.function_name = "g"


INVALID = {
    "duplicate": (lambda m: [FunctionPatch(m, "f", _replacement),
                             FunctionPatch(m, "f", _replacement)],
                  ValueError, "duplicate patch target patched_module.f"),
    "missing": (lambda m: [FunctionPatch(m, "g", _replacement),
                           FunctionPatch(m, "nope", _replacement)],
                ValueError, "module 'patched_module' has no attribute 'nope'"),
    "not_a_module": (lambda m: [FunctionPatch(object(), "f", _replacement)],
                     TypeError, "FunctionPatch.module must be a Python module"),
    "empty_name": (lambda m: [FunctionPatch(m, "", _replacement)],
                   ValueError, "FunctionPatch.function_name must be a non-empty string"),
    "target_not_callable": (lambda m: [FunctionPatch(sys, "version", _replacement)],
                            TypeError, "sys.version is not callable"),
    "replacement_not_callable": (lambda m: [FunctionPatch(m, "f", 3)],
                                 TypeError, "FunctionPatch.replacement must be callable"),
    "not_a_patch": (lambda m: [(m, "f", _replacement)],
                    TypeError, "patching entries must be FunctionPatch instances"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_definition_raises_before_anything_is_patched(bundle, mod, case):
    make, error, message = INVALID[case]
    before = (mod.f, mod.g, torch.from_numpy)
    with pytest.raises(error) as info:
        leapp.start("g", save_path=bundle.root, patching=make(mod))
    assert str(info.value) == message
    assert (mod.f, mod.g, torch.from_numpy) == before
    assert not _core.is_tracing()


def test_partial_install_is_rolled_back(bundle, mod):
    class Refusing(types.ModuleType):
        def __setattr__(self, name, value):
            if name == "h":
                raise RuntimeError("cannot patch h")
            super().__setattr__(name, value)

    refusing = Refusing("refusing")
    object.__setattr__(refusing, "h", lambda: "original h")
    before = (mod.f, refusing.h, torch.from_numpy, torch.as_tensor)
    with pytest.raises(RuntimeError, match="cannot patch h"):
        leapp.start("g", save_path=bundle.root,
                    patching=[FunctionPatch(mod, "f", _replacement),
                              FunctionPatch(refusing, "h", _replacement)])
    assert (mod.f, refusing.h, torch.from_numpy, torch.as_tensor) == before
    assert not _core.is_tracing()


def test_global_patching_off_disables_user_patches_unchecked(bundle, mod):
    original = mod.f
    leapp.start("g", save_path=bundle.root, global_patching=False,
                patching=[FunctionPatch(mod, "f", _replacement)])
    assert mod.f is original
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    assert mod.f(x) == "original f"
    leapp.stop()
    # not even checked: an invalid definition is ignored like upstream does
    leapp.start("g", save_path=bundle.root, global_patching=False,
                patching=[FunctionPatch(mod, "nope", _replacement)])
    assert _core.is_tracing()
    leapp.stop()


def test_replacement_runs_only_for_values_of_a_tracing_node(bundle, mod):
    original = mod.f
    leapp.start("g", save_path=bundle.root, patching=[FunctionPatch(mod, "f", _replacement)])
    assert mod.f is not original and mod.f.__wrapped__ is original
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    assert mod.f(x) == "replacement"
    assert mod.f([1, (x,)]) == "replacement"
    assert mod.f(key={"a": x}) == "replacement"
    assert mod.f(x.numpy()) == "replacement"  # a traced NumPy array counts too
    assert mod.f(torch.ones(2)) == "original f"
    y = annotate.output_tensors("n", {"y": x * 2})
    assert mod.f(y) == "original f"  # the node has finished
    leapp.stop()
    assert mod.f is original
    assert mod.f(x) == "original f"


def test_replacement_is_traced(bundle, mod):
    mod.f = lambda t: t  # a function the trace cannot see through
    leapp.start("g", save_path=bundle.root,
                patching=[FunctionPatch(mod, "f", lambda t: torch.tanh(t) * 2)])
    x = annotate.input_tensors("n", {"x": torch.linspace(-1, 1, 4)})
    annotate.output_tensors("n", {"y": mod.f(x)}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    model = torch.jit.load(f"{bundle.dir('g')}/n.pt")
    torch.testing.assert_close(model(torch.ones(4)), torch.tanh(torch.ones(4)) * 2)


def test_stop_leaves_a_later_replacement_in_place(bundle, mod):
    leapp.start("g", save_path=bundle.root, patching=[FunctionPatch(mod, "f", _replacement)])
    mine = lambda: "someone else's"  # noqa: E731
    mod.f = mine
    leapp.stop()
    assert mod.f is mine
