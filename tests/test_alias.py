"""In-place writes through aliases: the exported model computes what eager did.

Every case writes in place through a view or alias of a traced value (detach,
slices, chained views, transposes, splits, views of intermediates) and reads
another alias afterwards.  The bundle is compiled with validation on, then the
saved file is loaded by its own runtime and run on the original input: it must
give the eager result.
"""
from __future__ import annotations

import os

import pytest
import torch
import yaml

import leapp
from leapp import annotate


def _detach_mul(x):
    y = x.detach()
    y.mul_(2)
    return x + 1


def _full_slice(x):
    y = x[:]
    y.mul_(2)
    return x + 1


def _row(x):
    y = x[0]
    y.mul_(2)
    return x + 1


def _chain(x):
    y = x[1:]
    z = y[:, :2]
    z.add_(10)
    return x * 1


def _relu_alias(x):
    a = x.detach()
    torch.relu_(x)
    return a + 1


def _flat_view(x):
    y = x.view(12)
    y.add_(1)
    return x * 2


def _read_view_after_write(x):
    y = x[0]
    x.mul_(3)
    return y + 0


def _transpose_setitem(x):
    y = x.t()
    y[0] = 5.0
    return x + 0


def _two_writes(x):
    y = x[0]
    y.mul_(2)
    z = x[:, 1]
    z.add_(1)
    return x + y.sum()


def _split(x):
    a, b = x.split(2, dim=1)
    a.zero_()
    return x + b.sum()


def _nested_view_fill(x):
    y = x.unsqueeze(0)[0, 1]
    y.fill_(3.0)
    return x.sum(0)


def _copy_into_column(x):
    y = x[:, 0]
    y.copy_(x[:, 1] * 2)
    return x * 1


def _view_of_intermediate(x):
    h = x * 2
    v = h[1]
    v.sub_(1)
    return h.exp()


def _setitem_on_row(x):
    h = x + 0
    h[0][1] = 7.0
    return h * 1


def _expanded_reader(x):
    y = x[0:1].expand(3, 4)
    x[0].mul_(2)
    return y + 0


def _augmented_assign(x):
    y = x[:, 2:]
    y += 1
    y *= 3
    return x - 1


CASES = {f.__name__[1:]: f for f in (
    _detach_mul, _full_slice, _row, _chain, _relu_alias, _flat_view, _read_view_after_write,
    _transpose_setitem, _two_writes, _split, _nested_view_fill, _copy_into_column,
    _view_of_intermediate, _setitem_on_row, _expanded_reader, _augmented_assign)}


def _input() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(7))


def _trace(bundle, case, backend: str, graph: str = "g", inference_mode: bool = False):
    x0 = _input()
    leapp.start(graph, save_path=bundle.root)
    with torch.inference_mode(inference_mode):
        x = annotate.input_tensors("n", {"x": x0.clone()})
        r = CASES[case](x)
        annotate.output_tensors("n", {"r": r}, export_with=backend)
    leapp.stop()
    eager = r.detach().clone()
    assert leapp.compile_graph(validate=True) == {"n": True}
    return x0, eager


def _run_saved(path: str, x0: torch.Tensor) -> torch.Tensor:
    if path.endswith(".pt"):
        out = torch.jit.load(path)(x0.clone())
    elif path.endswith(".onnx"):
        import onnxruntime as ort
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        out = torch.from_numpy(session.run(None, {name: x0.numpy()})[0])
    else:
        out = torch.export.load(path).module()(x0.clone())
    return out[0] if isinstance(out, (tuple, list)) else out


def _artifact(bundle, graph: str) -> str:
    entry = bundle.yaml(graph)["models"]["n"]
    return os.path.join(bundle.dir(graph), entry["parameters"]["model_path"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_write_through_alias_exports_eager_result(bundle, case):
    x0, eager = _trace(bundle, case, "jit")
    got = _run_saved(_artifact(bundle, "g"), x0)
    torch.testing.assert_close(got, eager)


@pytest.mark.parametrize("case", ["row", "chain", "transpose_setitem", "split", "expanded_reader"])
@pytest.mark.parametrize("backend", ["onnx", "pt2"])
def test_alias_writes_through_onnx_and_pt2(bundle, case, backend):
    x0, eager = _trace(bundle, case, backend)
    got = _run_saved(_artifact(bundle, "g"), x0)
    torch.testing.assert_close(got, eager)


@pytest.mark.parametrize("case", ["detach_mul", "row", "two_writes"])
def test_alias_writes_under_inference_mode(bundle, case):
    x0, eager = _trace(bundle, case, "jit", inference_mode=True)
    got = _run_saved(_artifact(bundle, "g"), x0)
    torch.testing.assert_close(got, eager)


def test_eager_values_are_untouched_by_tracing(bundle):
    """User code sees exactly the values it sees without leapp."""
    for case, fn in CASES.items():
        expected = fn(_input())
        leapp.start(f"e_{case}", save_path=bundle.root, dry_run=True)
        x = annotate.input_tensors("n", {"x": _input()})
        got = fn(x)
        annotate.output_tensors("n", {"r": got})
        leapp.stop()
        torch.testing.assert_close(got.detach().clone().as_subclass(torch.Tensor), expected,
                                   msg=case)


def test_write_through_view_of_another_dtype_is_refused(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2, 3)})
    y = x.view(torch.int32)
    with pytest.raises(NotImplementedError, match="node 'n'.*view of dtype int32"):
        y.zero_()


def test_write_through_published_value_into_tracing_node_is_refused(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("a", {"x": torch.ones(2, 3)})
    p = a * 2
    annotate.output_tensors("a", {"p": p}, export_with="jit")
    q = annotate.input_tensors("b", {"q": p})
    assert q is not p
    with pytest.raises(RuntimeError, match="changes memory that node 'b' is tracing"):
        p.mul_(3)


def test_write_through_declared_alias_unpublishes_the_source(bundle):
    """q (node b's input) shares p's memory: writing through q changes p, so p
    no longer stands for node a's output."""
    from leapp import _core
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("a", {"x": torch.ones(2, 3)})
    p = a * 2
    annotate.output_tensors("a", {"p": p}, export_with="jit")
    q = annotate.input_tensors("b", {"q": p})
    q.add_(1)
    annotate.output_tensors("b", {"r": q * 1}, export_with="jit")
    assert _core.carrier_of(p).port is None
    leapp.stop()


def test_untracked_alias_of_input_as_output_is_refused(bundle):
    """set_() makes a tensor share memory without leapp following it; returning it
    next to the declared input it aliases would export two different values."""
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2, 3)})
    y = (x * 0).set_(x)
    x.mul_(2)
    with pytest.raises(Exception, match="shares memory with declared input 'x', but they "
                                        "carry different tracing roots"):
        annotate.output_tensors("n", {"y": y, "x2": x + 1})


def test_view_round_trip_of_input_as_output_is_accepted(bundle):
    """squeeze(unsqueeze(x)) has x's very layout: a followed view, not a conflict."""
    x0 = _input()
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": x0.clone()})
    same = torch.squeeze(torch.unsqueeze(x, 0), 0)
    x.add_(1)
    annotate.output_tensors("n", {"same": same, "other": x * 2}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(validate=True) == {"n": True}
    got = torch.jit.load(_artifact(bundle, "g"))(x0.clone())
    torch.testing.assert_close(got[0], x0 + 1)


def test_buffer_declared_twice_is_one_port_keeping_semantics(bundle):
    """The same memory declared under a second name binds to the first port; the
    semantics given only on the second declaration are kept."""
    buf = torch.zeros(1, 4)
    leapp.start("g", save_path=bundle.root)
    for _ in range(3):
        second = buf.view_as(buf)
        a = annotate.input_tensors("n", {"a": buf})
        b = annotate.input_tensors("n", leapp.TensorSemantics(
            name="b", ref=second, kind=leapp.InputKindEnum.JOINT_POSITION))
        r = a + b
        annotate.output_tensors("n", {"r": r}, export_with="jit")
        buf = buf + 1
    leapp.stop()
    assert leapp.compile_graph(validate=True) == {"n": True}
    inputs = bundle.yaml("g")["models"]["n"]["inputs"]
    assert [t["name"] for t in inputs] == ["a"]
    assert inputs[0]["kind"] == leapp.InputKindEnum.JOINT_POSITION.value


def test_two_views_of_one_buffer_declared_separately_stay_consistent(bundle):
    """Two declared inputs over parts of one buffer: a write through one is seen
    through the other."""
    buf = _input()
    leapp.start("g", save_path=bundle.root)
    top = annotate.input_tensors("n", {"top": buf[:2]})
    mid = annotate.input_tensors("n", {"mid": buf[1:]})
    top.mul_(10)
    r = mid + 0
    annotate.output_tensors("n", {"r": r}, export_with="jit")
    leapp.stop()
    eager = r.detach().clone()
    assert leapp.compile_graph(validate=True) == {"n": True}
    fresh = _input()
    got = torch.jit.load(_artifact(bundle, "g"))(fresh[:2].clone(), fresh[1:].clone())
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got, eager)


def test_writes_through_numpy_views_reach_the_export(bundle):
    """t.numpy() and np.asarray(t) share t's memory: writes through their views
    (a row scaled, a column incremented) are in the exported graph."""
    import numpy as np
    x0 = _input()
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": x0.clone()})
    row = x.numpy()[1]
    row *= 3
    column = np.asarray(x)[:, 0]
    column += 1
    r = x + 0
    annotate.output_tensors("n", {"r": r}, export_with="jit")
    leapp.stop()
    eager = r.detach().clone()
    expected = x0.clone()
    expected[1] *= 3
    expected[:, 0] += 1
    torch.testing.assert_close(eager.as_subclass(torch.Tensor), expected)
    assert leapp.compile_graph(validate=True) == {"n": True}
    torch.testing.assert_close(torch.jit.load(_artifact(bundle, "g"))(x0.clone()), expected)
