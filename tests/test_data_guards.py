"""Every Python value read from a traced tensor is a guard, and so is a shape the data
decides (docs/tracing.md, "Guarded"); a masked write fills the True positions in
row-major order (docs/tracing.md, "Masked writes").

* torch.equal / torch.allclose / torch.is_nonzero give a Python bool from C++: an `if` on
  them is a guard at the user's line, in Python and inside TorchScript code.
* F.one_hot without num_classes, bincount, repeat_interleave with tensor repeats, histc
  without a range: the result's shape (the bin edges for histc) is decided by the data,
  a guard at the op's line with the fix.
* A selection (nonzero, unique, masked_select, x[mask], torch.where(cond), ...) whose
  shape reaches an output: a guard at the selection's line.  One whose shape never
  leaves the node (x[mask].sum()) follows the data in every backend's model: no guard.

Each case runs with jit and onnx: one pass reports the line, a later pass that sees
another value is refused, strict_guards refuses at once, and the bundle replayed on new
inputs agrees with eager where the export is exact.
"""
from __future__ import annotations

import inspect
import logging
import os

import pytest
import torch
import torch.nn.functional as F

import leapp
from leapp import InferenceManager, annotate

BACKENDS = ["jit", "onnx"]
ONES = torch.ones(2)


def f_equal(mode, x):
    if torch.equal(mode, ONES):  # guard
        return x * 2
    return x - 3


def f_allclose(mode, x):
    return x * 2 if torch.allclose(mode, ONES) else x - 3  # guard


def f_is_nonzero(mode, x):
    return x * 2 if torch.is_nonzero(mode.sum() > 1) else x - 3  # guard


def f_method_equal(mode, x):
    return x * 2 if mode.equal(ONES) else x - 3  # guard


@torch.jit.script
def _scripted_gate(mode: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if torch.equal(mode, torch.ones(2)):  # guard
        return x * 2
    return x - 3


def f_scripted(mode, x):
    return _scripted_gate(mode, x)


BOOL_READS = [f_equal, f_allclose, f_is_nonzero, f_method_equal, f_scripted]
SAME = torch.ones(2)           # every bool read above sees True here
OTHER = torch.zeros(2)         # ... and False here


def _site(func) -> str:
    if func is f_scripted:  # the TorchScript source line
        with open(__file__, encoding="utf-8") as handle:
            (line,) = [n for n, text in enumerate(handle, 1)
                       if text.strip() == "if torch.equal(mode, torch.ones(2)):  # guard"]
        return f"{os.path.abspath(__file__)}:{line}"
    lines, first = inspect.getsourcelines(func)
    (offset,) = [i for i, line in enumerate(lines) if line.rstrip().endswith("# guard")]
    return f"{os.path.abspath(__file__)}:{first + offset}"


def _records(caplog, site, level=logging.WARNING):
    return [r for r in caplog.records if r.name == "leapp" and site in r.getMessage()
            and r.levelno >= level]


def _gate_pass(func, mode, backend):
    mode, x = annotate.input_tensors("gate", {"mode": mode.clone(),
                                              "x": torch.tensor([1.0, 2.0, 3.0])})
    return annotate.output_tensors("gate", {"y": func(mode, x)}, export_with=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("func", BOOL_READS, ids=lambda f: f.__name__)
def test_a_bool_read_by_torch_is_a_guard_at_the_users_line(func, backend, bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _gate_pass(func, SAME, backend)
        _gate_pass(func, SAME * 1.0, backend)   # the same branch: accepted, reported once
    (record,) = _records(caplog, _site(func))
    assert record.levelno == logging.ERROR
    assert "it was True" in record.getMessage() and "baked in" in record.getMessage()
    with pytest.raises(RuntimeError, match="the trace took another branch at "
                       + _site(func).replace(".", r"\.")):
        _gate_pass(func, OTHER, backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"gate": True}
    # the bundle holds the traced branch: right where the branch is the traced one
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    x = torch.tensor([0.5, -1.0, 4.0])
    out = manager.run_policy({"gate/x": x})  # mode is baked: the input is dropped
    torch.testing.assert_close(out["gate/y"], func(SAME, x))


@pytest.mark.parametrize("func", BOOL_READS, ids=lambda f: f.__name__)
def test_strict_guards_refuse_a_bool_read_at_once(func, bundle):
    leapp.start("g", save_path=bundle.root, strict_guards=True)
    with pytest.raises(RuntimeError, match="strict_guards=True") as info:
        _gate_pass(func, SAME, "jit")
    assert _site(func) in str(info.value)


# ---- shapes the data decides --------------------------------------------------------

def s_one_hot(i):
    return F.one_hot(i).float()  # guard


def s_bincount(i):
    return torch.bincount(i).float()  # guard


def s_repeat_interleave(i):
    return torch.repeat_interleave(i.float(), i)  # guard


def s_histc(i):
    return torch.histc(i.float(), bins=4)  # guard


def s_nonzero(i):
    return torch.nonzero(i > 1).float()  # guard


def s_unique(i):
    return torch.unique(i).float()  # guard


def s_masked_select(i):
    return torch.masked_select(i, i > 1).float()  # guard


def s_mask_index(i):
    return i[i > 1].float() * 2  # guard


def s_where_condition(i):
    return torch.where(i > 1)[0].float()  # guard


def s_argwhere(i):
    return torch.argwhere(i > 1).float()  # guard


def s_unique_consecutive(i):
    return torch.cat([torch.unique_consecutive(i).float(), i.float()])  # guard


SHAPED = [s_one_hot, s_bincount, s_repeat_interleave, s_histc, s_nonzero, s_unique,
          s_masked_select, s_mask_index, s_where_condition, s_argwhere, s_unique_consecutive]
FIXES = {s_one_hot: "num_classes=", s_bincount: "fixed size", s_histc: "min=lo, max=hi",
         s_repeat_interleave: "Python int"}
IDX = torch.tensor([0, 1, 3, 2])     # 4 classes, 2 values above 1, range [0, 3]
IDX_NEW = torch.tensor([0, 4, 4, 2])  # 5 classes, 3 values above 1, 3 unique, range [0, 4]


def _shape_pass(func, idx, backend):
    i = annotate.input_tensors("shape", {"i": idx.clone()})
    return annotate.output_tensors("shape", {"y": func(i)}, export_with=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("func", SHAPED, ids=lambda f: f.__name__)
def test_a_shape_from_data_is_a_guard_with_its_fix(func, backend, bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _shape_pass(func, IDX, backend)
    (record,) = _records(caplog, _site(func))
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "baked in" in message
    assert "on every backend" in message
    assert FIXES.get(func, "torch.nonzero_static(mask, size=N)") in message
    with pytest.raises(RuntimeError, match="the trace took another branch at "
                       + _site(func).replace(".", r"\.")):
        _shape_pass(func, IDX_NEW, backend)


@pytest.mark.parametrize("func", SHAPED, ids=lambda f: f.__name__)
def test_strict_guards_refuse_a_shape_from_data(func, bundle):
    leapp.start("g", save_path=bundle.root, strict_guards=True)
    with pytest.raises(RuntimeError, match="strict_guards=True") as info:
        _shape_pass(func, IDX, "jit")
    assert _site(func) in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_with_num_classes_exports_exactly(backend, bundle, caplog):
    def encode(i):
        return F.one_hot(i, num_classes=6).float()
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for idx in (IDX, IDX_NEW):
            _shape_pass(encode, idx, backend)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and "one_hot" in r.getMessage()] == []
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"shape": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    new = torch.tensor([5, 0, 1, 4])
    torch.testing.assert_close(manager.run_policy({"shape/i": new})["shape/y"], encode(new))


def kept_inside(x):
    positive = x[x > 0]                   # its shape never leaves the node
    rows = x.reshape(2, 2)
    picked = rows[rows[:, 0] > 0]
    return (positive.sum() + torch.nonzero(x > 1).float().sum()
            + x[x < 0].mean().nan_to_num()) * torch.ones(3) \
        + torch.cat([picked.sum(0), picked.mean(0).nan_to_num()], 0)[:3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_selection_whose_shape_stays_inside_follows_the_data(backend, bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for x in (torch.tensor([1.0, 2.0, -3.0, 4.0]), torch.tensor([-1.0, 0.5, 3.0, 2.0])):
            xs = annotate.input_tensors("keep", {"x": x})
            annotate.output_tensors("keep", {"y": kept_inside(xs)}, export_with=backend)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and "data decides" in r.getMessage()] == []
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"keep": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    for x in (torch.tensor([5.0, -1.0, -2.0, 0.5]), torch.tensor([-1.0, -2.0, -3.0, -4.0])):
        torch.testing.assert_close(manager.run_policy({"keep/x": x})["keep/y"], kept_inside(x))


# ---- masked writes ------------------------------------------------------------------

def masked_writes(x, m):
    rows = x.clone()
    rows[m > 0] = x[m > 0] * 10 + 1       # one value per True position, in row-major order
    filled = x.clone()
    filled[m > 0] = 5.0                   # a number: every True position
    single = x.clone()
    single[m > 0] = x[:1] * 2             # one element, not from a selection: broadcast
    grid = x.reshape(2, 2).clone()
    grid[m.reshape(2, 2) > 0] = x.reshape(2, 2)[m.reshape(2, 2) > 0].flip(0)
    return {"rows": rows, "filled": filled, "single": single, "grid": grid}


@pytest.mark.parametrize("backend", BACKENDS + ["pt2"])
def test_a_masked_write_fills_the_true_positions_in_order(backend, bundle):
    leapp.start("g", save_path=bundle.root)
    for x, m in ((torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 0.0, 1.0, 0.0])),
                 (torch.tensor([5.0, 6.0, 7.0, 8.0]), torch.tensor([0.0, 1.0, 1.0, 1.0]))):
        xs, ms = annotate.input_tensors("write", {"x": x, "m": m})
        annotate.output_tensors("write", masked_writes(xs, ms), export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"write": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    for x, m in ((torch.tensor([1.5, -2.0, 3.0, 9.0]), torch.tensor([0.0, 0.0, 1.0, 1.0])),
                 (torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])),
                 (torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.zeros(4))):
        out = manager.run_policy({"write/x": x, "write/m": m})
        for name, want in masked_writes(x, m).items():
            assert torch.equal(out[f"write/{name}"], want), (name, out[f"write/{name}"], want)
