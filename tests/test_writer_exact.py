"""The ONNX writer exact on inputs the trace never drew.

Each probe here was a silently wrong export before the fresh-input check and the
rules it asked for: the bundle validated on the traced values and computed
something else on new ones (a NaN from a missing height-scan ray, an integer
that wraps, a method form read in the function's order).  Each is exported with
`export_with="onnx"`, its `.onnx` file replayed in onnxruntime on new inputs with
NaN, infinities and large values, against eager.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import onnx
import onnxruntime as ort
import pytest
import torch

import leapp
from leapp import annotate
from leapp.compiling import fresh_inputs
from leapp.compiling.onnx_writer import emit

FELL_BACK = "exported with torch's ONNX exporter"


@pytest.fixture(autouse=True)
def _the_writer_on(monkeypatch):
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)


def _export(tmp_path, fn: Callable, inputs: list[torch.Tensor], caplog) -> tuple[str, str]:
    names = [f"i{k}" for k in range(len(inputs))]
    leapp.start(name="g", save_path=str(tmp_path))
    traced = annotate.input_tensors("node", dict(zip(names, inputs)))
    traced = traced if isinstance(traced, tuple) else (traced,)
    annotate.output_tensors("node", {"y": fn(*traced)}, export_with="onnx")
    leapp.stop()
    with caplog.at_level(logging.INFO, logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"node": True}
    bundle = os.path.join(str(tmp_path), "g")
    with open(os.path.join(bundle, "log.txt"), encoding="utf-8") as handle:
        return os.path.join(bundle, "node.onnx"), handle.read()


def _replay(path: str, fn: Callable, make: Callable[[int], list[torch.Tensor]]) -> None:
    """The model against eager on 12 new draws: NaN where eager has NaN, integers exact."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    fed = {i.name for i in session.get_inputs()}
    for trial in range(12):
        inputs = make(trial)
        want = fn(*[t.clone() for t in inputs])
        got = torch.from_numpy(session.run(None, {f"i{k}": t.numpy()
                                                  for k, t in enumerate(inputs)
                                                  if f"i{k}" in fed})[0])
        if want.is_floating_point():
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True,
                                       msg=lambda m: f"draw {trial}: {m}")
        else:
            assert torch.equal(got, want), f"draw {trial}: {got} != {want}"


def _floats(*shape: int, nan: bool = True) -> Callable[[int], list[torch.Tensor]]:
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(100 + trial)
        x = torch.randn(*shape, generator=gen)
        if nan and trial % 2:
            x.view(-1)[trial % 3::4] = float("nan")
        if nan and trial % 3 == 2:
            x.view(-1)[1::5] = float("inf") if trial % 2 else float("-inf")
        return [x]
    return make


def test_fmax_keeps_the_number_beside_a_nan(tmp_path, caplog):
    """torch.fmax was written as ONNX Max: NaN where eager gives the number (a missing
    height-scan ray clipped from below)."""
    def fn(x):
        return torch.fmax(x, torch.full_like(x, 0.5)) + torch.fmin(x, torch.zeros_like(x))
    path, log = _export(tmp_path, fn, _floats(4, 6)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(4, 6))


def test_nanmean_and_nansum_leave_nan_out(tmp_path, caplog):
    def fn(x):
        return torch.nanmean(x, dim=1) + torch.nansum(x, 1) + x.nansum()
    path, log = _export(tmp_path, fn, _floats(4, 6)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(4, 6))


def test_integer_power_wraps_as_eager(tmp_path, caplog):
    """k ** 4 on int32 went through a double in ONNX's Pow: off by 1.7e9 on overflow."""
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(trial)
        return [torch.randint(-60000, 60000, (8,), generator=gen, dtype=torch.int32),
                torch.randint(0, 9, (8,), generator=gen, dtype=torch.int64)]

    def fn(k, n):
        return (k ** 4).long() + k.long() ** 3 + torch.pow(k.long() + 3, n)
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


def test_positional_unbiased_of_the_method_form(tmp_path, caplog):
    """x.var(1, False) ignored its positional unbiased."""
    def fn(x):
        return x.var(1, False) + x.std(1, True, True).squeeze(1) + torch.var(x, 1, False, True)[:, 0]
    path, log = _export(tmp_path, fn, _floats(4, 6, nan=False)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(4, 6, nan=False))


def test_where_method_form(tmp_path, caplog):
    """x.where(c, y) was read in torch.where's order (c, x, y)."""
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(trial)
        return [torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)]

    def fn(x, y):
        return x.where(x > 0, y) * 2 + y.where(condition=y < 0, other=0.5)
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


def test_linalg_cross_on_a_square_input(tmp_path, caplog):
    """torch.linalg.cross takes dim=-1; on a [3, 3] input the rule took torch.cross's
    first dimension of size 3."""
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(trial)
        return [torch.randn(3, 3, generator=gen), torch.randn(3, 3, generator=gen)]

    def fn(a, b):
        return torch.linalg.cross(a, b) + torch.cross(a, b, dim=0)
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


def test_logcumsumexp_is_stable(tmp_path, caplog):
    """torch's exporter's log(cumsum(exp(x))) gives inf above about 88: the writer's rule
    reduces each prefix with its own maximum."""
    def make(trial: int) -> list[torch.Tensor]:
        x = torch.randn(3, 7, generator=torch.Generator().manual_seed(trial)) * 300
        if trial % 2:
            x[0, 2] = float("-inf")
            x[1, 0] = float("nan")
        if trial % 3 == 2:
            x[2, 3] = float("inf")
        return [x]

    def fn(x):
        return torch.logcumsumexp(x, dim=1)
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


def test_cumsum_of_a_0d_value(tmp_path, caplog):
    """ONNX's CumSum needs an axis: the written model failed in onnxruntime."""
    def fn(x):
        return torch.cumsum(x.sum(), 0) + x
    path, log = _export(tmp_path, fn, _floats(4, nan=False)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(4, nan=False))


def test_stable_sort_ties_in_eagers_order(tmp_path, caplog):
    def fn(x):
        r = x.round()
        return torch.sort(r, dim=1, stable=True)[1] * 10 + torch.argsort(r, dim=1, stable=True)
    path, log = _export(tmp_path, fn, _floats(4, 9, nan=False)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(4, 9, nan=False))


def test_a_wrong_rule_is_caught_on_fresh_inputs(tmp_path, caplog, monkeypatch):
    """A rule that agrees with eager on the traced values only (torch.maximum written with
    fmax's NaN handling: the fmax-as-Max bug this check exists for, mirrored): the node
    goes to torch's exporter, and the warning names the op and the input that differed."""
    monkeypatch.setitem(emit.RULES, "maximum", emit.RULES["fmax"])
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)]
    path, _ = _export(tmp_path, torch.maximum, inputs, caplog)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(FELL_BACK in m and "its torch.maximum differs from eager on an input with NaN "
               "(i0, i1): output 'y' is a number where eager gives NaN" in m
               for m in warned), warned
    assert onnx.load(path).producer_name != "leapp"  # torch's exporter wrote it

    def make(trial: int) -> list[torch.Tensor]:
        return [_floats(4, 6)(trial)[0], _floats(4, 6)(trial + 20)[0]]
    _replay(path, torch.maximum, make)


def test_both_writers_differing_is_refused_naming_the_backends_that_are_exact(
        tmp_path, monkeypatch):
    """When torch's exporter's model differs from eager too, no ONNX model of the node is
    exact: the node is refused naming the op, the input and the backends that are.  Here
    the writer's maximum ignores NaN (a wrong rule) and torch's exporter's LSTM layer
    turns a NaN input into numbers (onnxruntime's kernel)."""
    monkeypatch.setitem(emit.RULES, "maximum", emit.RULES["fmax"])
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4, batch_first=True).eval()
    gen = torch.Generator().manual_seed(0)
    leapp.start(name="g", save_path=str(tmp_path))
    x = annotate.input_tensors("node", {"x": torch.randn(2, 4, generator=gen)})
    h = lstm(x.unsqueeze(1))[0].squeeze(1)
    annotate.output_tensors("node", {"y": torch.maximum(h, x)}, export_with="onnx")
    leapp.stop()
    with pytest.raises(leapp.ExportError) as caught:
        leapp.compile_graph(visualize=False)
    message = str(caught.value)
    assert "op `torch.maximum`" in message
    assert "leapp's ONNX writer's model and torch's ONNX exporter's both part from eager" \
        in message
    assert "on an input with NaN (x)" in message
    assert "export_with='jit'" in message
    assert not os.path.exists(os.path.join(str(tmp_path), "g", "g.yaml"))


def test_topk_indices_on_ties_are_judged_by_what_they_select(tmp_path, caplog):
    """topk orders equal values as its CPU kernel happens to (torch documents no order);
    the written model, lower index first, picks the same values: on the draws that make
    ties (NaN, -0.0 beside 0.0) its indices are not held to eager's order."""
    def fn(x):
        return torch.topk(x, 3, dim=1)[1]
    path, log = _export(tmp_path, fn, _floats(4, 6, nan=False)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(4, 6, nan=False))


def test_validation_failure_names_the_writer(tmp_path, caplog):
    """A written node that fails validation (a Python number that changes between passes,
    baked as the first pass's) says who wrote it and how to switch."""
    leapp.start(name="g", save_path=str(tmp_path))
    for scale in (2.0, 3.0):
        x = annotate.input_tensors("node", {"x": torch.ones(2, 3) * scale})
        annotate.output_tensors("node", {"y": x * float(scale)}, export_with="onnx")
    leapp.stop()
    with caplog.at_level(logging.WARNING, logger="leapp"):
        assert leapp.compile_graph(visualize=False, strict=False) == {"node": False}
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "node node's ONNX model was written by leapp's ONNX writer: set " \
           "LEAPP_ONNX_WRITER=torch" in said


def test_the_draws_cover_every_kind():
    """The fresh inputs hold what the kinds say, at a third of the positions, and leave
    integers alone where floats are changed."""
    x = torch.randn(3, 4)
    k = torch.tensor([1, 5, 3], dtype=torch.int32)
    every = fresh_inputs.draws([x, k])
    placements = {"integer edges": 2, "wide integers": 1}
    assert [d.kind for d in every] == ["perturbed"] + [
        kind for kind in fresh_inputs.KINDS[1:] for _ in range(placements.get(kind, 3))]
    found = {d.kind: d.inputs for d in every}  # the first placement of each kind
    found = {kind: next(d.inputs for d in every if d.kind == kind) for kind in found}
    assert int(torch.isnan(found["NaN"][0]).sum()) == 4
    assert int(torch.isposinf(found["+inf"][0]).sum()) == 4
    assert bool(torch.signbit(found["-0.0"][0].reshape(-1)[0::3]).all())
    assert float(found["large"][0].abs().max()) == 1e4
    assert int(found["perturbed"][1].min()) >= 1 and int(found["perturbed"][1].max()) <= 5
    edges = found["integer edges"][1]
    assert set(edges.tolist()) == {2 ** 31 - 1, -2 ** 31}
    wide = found["wide integers"][1]
    assert wide.dtype == torch.int32 and int(wide.abs().max()) > 2 ** 20
    assert torch.equal(found["NaN"][1], k)  # the special copies keep the traced values
    kept = ~torch.isnan(found["NaN"][0])
    assert torch.equal(found["NaN"][0][kept], x[kept])
    every_nan = torch.stack([torch.isnan(d.inputs[0]) for d in every if d.kind == "NaN"])
    assert bool((every_nan.sum(0) == 1).all())  # each position NaN in exactly one placement


def test_compare_judges_nan_inf_and_rounding():
    want = torch.tensor([1.0, float("nan"), float("inf")])
    assert fresh_inputs.compare(want.clone(), want) == ""
    assert "NaN where eager" in fresh_inputs.compare(torch.tensor([float("nan"), 0.0,
                                                                   float("inf")]), want)
    assert "a number where eager gives NaN" in \
        fresh_inputs.compare(torch.tensor([1.0, 0.0, float("inf")]), want)
    assert "infinite" in fresh_inputs.compare(torch.tensor([1.0, float("nan"),
                                                            float("-inf")]), want)
    # on a draw of infinities, eager's NaN (inf - inf) may be a number in the export
    assert fresh_inputs.compare(torch.tensor([1.0, 5.0, float("inf")]), want, "+inf") == ""
    # rounding of large values is relative to the output's magnitude
    big = torch.tensor([1e30, 1.0])
    assert fresh_inputs.compare(big + torch.tensor([1e24, 0.0]), big, "large") == ""
    assert "off by" in fresh_inputs.compare(big + torch.tensor([0.0, 1e28]), big, "large")
    assert "positions" in fresh_inputs.compare(torch.tensor([1, 2]), torch.tensor([1, 3]))


@pytest.mark.parametrize("case", ["broadcast", "no_dim", "negative"])
def test_take_along_dim_broadcasts_as_eager(tmp_path, caplog, case):
    """take_along_dim broadcasts x and the indices on every axis but dim (the writer's
    model failed in onnxruntime on a broadcast index)."""
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(trial)
        x = torch.randn(1, 5, generator=gen) if case == "broadcast" else \
            torch.randn(3, 5, generator=gen)
        high = 5 if case != "no_dim" else 15
        low = -5 if case == "negative" else 0
        i = torch.randint(low, high, (3, 2) if case != "no_dim" else (4,), generator=gen)
        return [x, i]

    def fn(x, i):
        return torch.take_along_dim(x, i) if case == "no_dim" else \
            torch.take_along_dim(x, i, dim=1)
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


@pytest.mark.parametrize("mask_shape", [(4, 6), (4, 1)])
def test_masked_write_of_a_vector_is_written(tmp_path, caplog, mask_shape):
    """dest[mask] = v (recorded as masked_scatter: True positions filled in row-major
    order) is written by the writer, exact on masks with other counts."""
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(trial)
        return [torch.randn(4, 6, generator=gen), torch.randn(*mask_shape, generator=gen),
                torch.randn(24, generator=gen)]

    def fn(x, m, v):
        return x.masked_scatter(m > 0, v) * 2
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


def test_torch_exporters_model_is_checked_and_named(tmp_path, caplog):
    """A model of torch's exporter with no writer in it (onnx-torchscript here) is held
    to eager on fresh inputs too: its LSTM layer turns a NaN input into numbers
    (onnxruntime's kernel), which a warning names with the input, the output and the
    backends that compute as eager."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4, batch_first=True).eval()
    leapp.start(name="g", save_path=str(tmp_path))
    x = annotate.input_tensors("node", {"x": torch.randn(2, 4)})
    annotate.output_tensors("node", {"y": lstm(x.unsqueeze(1))[0].squeeze(1)},
                            export_with="onnx-torchscript")
    leapp.stop()
    with caplog.at_level(logging.WARNING, logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"node": True}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("[node] its ONNX model, written by torch's ONNX exporter, differs from eager "
               "on an input with NaN (x): output 'y' is a number where eager gives NaN; "
               "export_with='jit' or 'pt2' computes as eager does there" in m
               for m in warned), warned


@pytest.mark.parametrize("case", ["log_softmax_float64", "prelu"])
def test_nan_through_log_softmax_in_float64_and_prelu(tmp_path, caplog, case):
    """onnxruntime's float64 LogSoftmax gives numbers beside a NaN, and its PRelu keeps a
    zero whose slope is NaN: eager's NaN in both."""
    def make(trial: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(trial)
        x, w = torch.randn(3, 5, generator=gen), torch.rand(5, generator=gen)
        if trial % 2:
            x[1, 2] = float("nan")
            x[2, 0] = -0.0
            w[0] = float("nan")
        return [x, w]

    def fn(x, w):
        if case == "prelu":
            return torch.nn.functional.prelu(x, w)
        return torch.log_softmax(x, 1, dtype=torch.float64) + w.double()
    path, log = _export(tmp_path, fn, make(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, make)


@pytest.mark.parametrize("training", [False, True])
def test_dropout_that_keeps_every_value_exports(tmp_path, caplog, training):
    """An unbatched dropout3d in eval mode (or with p = 0) returns a view of its input:
    no longer refused as an output sharing the input's memory; written as the input."""
    def fn(x):
        return torch.nn.functional.dropout3d(x, p=0.0, training=training)
    path, log = _export(tmp_path, fn, _floats(2, 3, 4, 4, nan=False)(0), caplog)
    assert FELL_BACK not in log
    _replay(path, fn, _floats(2, 3, 4, 4))
