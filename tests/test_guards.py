"""Guards: traced values read into Python inside a node (docs/tracing.md).

Each trap below converts a traced value into Python at the line marked
`# guard`.  One pass: the site is reported (file:line of this file, the value)
and the value is baked in.  Two passes that see different values: refused,
"the trace took another branch".  strict_guards=True: refused on the first
pass.  Ordinary shape arithmetic reports nothing.
"""
from __future__ import annotations

import inspect
import logging
import math
import os

import pytest
import torch

import leapp
from leapp import annotate

A = torch.tensor([1.0, 2.0, 3.0, 4.0])        # every guard below sees one value here
B = torch.tensor([-0.1, -0.2, -0.3, -0.4])    # ... and another one here


def t_bool(x):
    if x.sum() > 0:  # guard
        return x * 2
    return x * 3


def t_while(x):
    y = x
    while y.abs().max() > 1:  # guard
        y = y / 2
    return y


def t_builtin_max(x):
    m = max(x.abs().max(), 1.0)  # guard
    return x / m


def t_cat_comparison_list(x):
    parts = [x[i:i + 1] * 2 for i in range(4) if x[i] > 0]  # guard
    return torch.cat(parts + [x])


def t_int(x):
    k = int(x.argmax())  # guard
    return x * k


def t_float(x):
    f = float(x.max())  # guard
    return x / f


def t_item(x):
    v = x[0].item()  # guard
    return x * v


def t_item_index(x):
    return x * x[x.argmax().item()]  # guard


def t_index(x):
    scale = [1.0, 2.0, 3.0, 4.0][x.argmax()]  # guard
    return x * scale


def t_tolist(x):
    values = x.tolist()  # guard
    return x * values[0]


def t_len_nonzero(x):
    n = len(torch.nonzero(x > 0))  # guard
    return x * n


def t_unique_numel(x):
    n = x.round().unique().numel()  # guard
    return x * n


def t_arange_item(x):
    return x + torch.arange((x > 0).sum().item()).sum()  # guard


def t_math_sqrt(x):
    return x * math.sqrt(x.abs().sum())  # guard


TRAPS = [t_bool, t_while, t_builtin_max, t_cat_comparison_list, t_int, t_float, t_item,
         t_item_index, t_index, t_tolist, t_len_nonzero, t_unique_numel, t_arange_item,
         t_math_sqrt]
BRANCHES = {t_bool, t_while, t_builtin_max, t_cat_comparison_list}  # bool context: ERROR


def _site(func) -> str:
    lines, first = inspect.getsourcelines(func)
    (offset,) = [i for i, line in enumerate(lines) if line.rstrip().endswith("# guard")]
    return f"{os.path.abspath(__file__)}:{first + offset}"


def _pass(func, x):
    x = annotate.input_tensors("n", {"x": x.clone()})
    return annotate.output_tensors("n", {"y": func(x)}, export_with="jit")


def _guard_records(caplog, site):
    return [r for r in caplog.records if r.name == "leapp" and site in r.getMessage()
            and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("func", TRAPS, ids=lambda f: f.__name__)
def test_one_pass_warns_once_with_the_users_line(func, bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _pass(func, A)
    site = _site(func)
    (record,) = _guard_records(caplog, site)
    assert record.levelno == (logging.ERROR if func in BRANCHES else logging.WARNING)
    message = record.getMessage()
    assert "baked" in message and "torch.where" in message and "declared input" in message
    if func is t_bool:
        assert message.startswith("Attempted to use TracedTensor 'gt' from node 'n' in a "
                                  "boolean context (if/while/and/or/not) during tracing.")
        assert f"At {site} it was True" in message


@pytest.mark.parametrize("func", TRAPS, ids=lambda f: f.__name__)
def test_a_later_pass_that_takes_another_branch_is_refused(func, bundle):
    leapp.start("g", save_path=bundle.root)
    _pass(func, A)
    with pytest.raises(RuntimeError, match="the trace took another branch at "
                       + _site(func).replace(".", r"\.")):
        _pass(func, B)


@pytest.mark.parametrize("func", TRAPS, ids=lambda f: f.__name__)
def test_strict_guards_refuse_on_the_first_pass(func, bundle):
    leapp.start("g", save_path=bundle.root, strict_guards=True)
    with pytest.raises(RuntimeError, match=r"strict_guards=True") as info:
        _pass(func, A)
    assert _site(func) in str(info.value)


@pytest.mark.parametrize("func", TRAPS, ids=lambda f: f.__name__)
def test_passes_that_agree_are_reported_once_and_compile(func, bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for _ in range(3):
            out = _pass(func, A)
    assert type(out) is torch.Tensor  # later passes still return plain values
    assert len(_guard_records(caplog, _site(func))) == 1
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    assert result["n"] is True


def test_the_same_site_in_a_helper_counts_each_occurrence(bundle):
    # The loop reads three values at one site on pass 1; a pass reading a fourth is refused.
    def steps(x):
        y = x
        for _ in range(int((x > 0).sum())):  # guard
            y = y + 1
        return y
    leapp.start("g", save_path=bundle.root)
    _pass(steps, torch.tensor([1.0, 1.0, 1.0, -1.0]))
    _pass(steps, torch.tensor([2.0, 2.0, 2.0, -2.0]))  # same count: accepted
    with pytest.raises(RuntimeError, match="another branch.*first pass saw 3, this pass 4"):
        _pass(steps, torch.tensor([2.0, 2.0, 2.0, 2.0]))


@pytest.mark.parametrize("backend", ["jit", "onnx", "pt2"])
def test_bundle_replays_the_traced_branch_and_the_where_rewrite_both(backend, bundle):
    from leapp import InferenceManager

    def rewritten(x):
        return torch.where(x.sum() > 0, x * 2, x * 3)

    leapp.start("g", save_path=bundle.root)
    for x in (A, A + 1.0):
        xb = annotate.input_tensors("branch", {"x": x.clone()})
        annotate.output_tensors("branch", {"y": t_bool(xb)}, export_with=backend)
        xw = annotate.input_tensors("where", {"x": x.clone()})
        annotate.output_tensors("where", {"y": rewritten(xw)}, export_with=backend)
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    assert result == {"branch": True, "where": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    same = torch.tensor([0.5, 1.5, 2.5, 3.5])        # takes the traced branch
    out = manager.run_policy({"branch/x": same, "where/x": B})
    torch.testing.assert_close(out["branch/y"], t_bool(same))
    torch.testing.assert_close(out["where/y"], rewritten(B))  # the other branch, exactly


def _plain_node(x):
    n, d = x.shape[0], x.size(-1)
    total = len(x) + x.numel() + x.dim() + x.ndim + n + d
    h = x.reshape(x.shape[0], -1) * total
    masked = x[x > 0]                     # a data-dependent value that is never read
    h = h + torch.where(x > 0, x, -x).sum() + masked.sum()
    text = f"{x}"                         # printing reads values, not the graph
    assert text
    return h.reshape(x.shape) + torch.zeros(x.size())


def test_ordinary_shape_arithmetic_reports_nothing_and_reenters_plain(bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        for x in (A, B, A * 3):
            out = _pass(_plain_node, x)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert type(out) is torch.Tensor
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}


def test_size_of_a_masked_value_is_a_guard(bundle, caplog):
    def masked(x):
        kept = x[x > 2]
        return x * kept.shape[0]  # guard
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _pass(masked, A)
    (record,) = _guard_records(caplog, _site(masked))
    assert "data-dependent size" in record.getMessage()


def test_one_traced_pass_is_said_in_the_compile_summary_and_log(bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    _pass(lambda x: x * 2, A)
    for x in (A, B):
        xs = annotate.input_tensors("twice", {"x": x.clone()})
        annotate.output_tensors("twice", {"y": xs + 1}, export_with="jit")
    leapp.stop()
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        leapp.compile_graph(visualize=False)
    lines = [r.getMessage() for r in caplog.records if "traced on one pass only" in r.getMessage()]
    assert len(lines) == 1 and lines[0].strip().startswith("n was traced on one pass only")
    with open(os.path.join(bundle.dir("g"), "log.txt"), encoding="utf-8") as handle:
        log = handle.read()
    assert "n was traced on one pass only" in log
    assert "twice was traced on one pass only" not in log
