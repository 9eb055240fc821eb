"""PyTorch's op database (OpInfo) through export_with="onnx", against eager.

The part of bench/opinfo.py that `make test` runs (`make opinfo` runs the whole
database, ours, torch's exporter behind ours and upstream 0.7.2; its census is in
docs/backends.md).  For each op of ``CASES`` (the hard cases of leapp's ONNX
writer: NaN handling, integer arithmetic and overflow, rounding modes, ties,
numerically delicate reductions and activations), the first drivable OpInfo
sample of each listed dtype becomes one traced node, exported with
``export_with="onnx"`` and compiled; the saved model runs in onnxruntime against
eager on the sample, on redrawn inputs and on adversarial copies (NaN, +-inf,
-0.0, large magnitudes, the integer dtype's edges and wide integers).

Every sample must be exact (written by leapp's writer or by torch's exporter
after it), or refused with a reason that names the op.  A silently wrong export
(validated, and different from eager on some input), an op that fails under
tracing although it runs eagerly, or a crash fails the test, naming the input
and the difference.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import opinfo  # noqa: E402

# (OpInfo name[.variant], dtypes): one sample per dtype.
CASES = [
    ("fmax", ("float32",)),
    ("fmin", ("float32",)),
    ("nanmean", ("float32",)),
    ("nansum", ("float32",)),
    ("clamp", ("float32", "int32")),
    ("max.binary", ("float32",)),
    ("min.binary", ("float32",)),
    ("maximum", ("float32",)),
    ("minimum", ("float32",)),
    ("pow", ("float32", "int32")),
    ("floor_divide", ("float32", "int32")),
    ("remainder", ("float32", "int32")),
    ("fmod", ("float32", "int32")),
    ("div.floor_rounding", ("float32", "int64")),
    ("div.trunc_rounding", ("float32", "int64")),
    ("var", ("float32",)),
    ("std", ("float32",)),
    ("where", ("float32",)),
    ("linalg.cross", ("float32",)),
    ("sort", ("float32",)),
    ("topk", ("float32",)),
    ("argsort", ("float32",)),
    ("cumsum", ("float32", "int64")),
    ("logcumsumexp", ("float32",)),
    ("take_along_dim", ("float32",)),
    ("nn.functional.softplus", ("float32",)),
    ("sigmoid", ("float32", "float16")),
    ("log_softmax", ("float32",)),
    ("amax", ("float32",)),
    ("argmax", ("float32",)),
    ("isnan", ("float32",)),
    ("nan_to_num", ("float32",)),
    ("sign", ("float32", "int32")),
    ("atan2", ("float32",)),
    ("abs", ("int32",)),
    ("sum", ("int32",)),
    ("logical_and", ("bool",)),
]


@pytest.fixture(scope="module")
def db():
    return {opinfo.op_key(op): op for op in opinfo.load_op_db()}


def _describe(rec):
    if rec["outcome"] == "wrong":
        return "; ".join("%s: %s" % (f["input"], f["diff"]) for f in rec["failures"][:4])
    return "%s (%s)" % (rec.get("reason", ""), rec.get("stage", ""))


# How a message names an op: `name`, torch.name (torch.linalg.name, ...), aten.name,
# aten::name or Tensor.name; a bare word ("where", "sum") could be any text.
NAMED = r"(`|\btorch\.(?:nn\.functional\.|linalg\.|special\.|fft\.)?|\baten(?:\.|::)|" \
        r"\bTensor\.)%s\b"


def _names(op):
    """How a refusal may name the op: its OpInfo name's last part, its aten name."""
    names = {op.name.split(".")[-1], op.name}
    aten = getattr(op, "aten_name", None)
    if aten:
        names.add(aten)
    return {n for n in names if n}


@pytest.mark.parametrize("key,dtypes", CASES, ids=[k for k, _ in CASES])
def test_op_exact_or_refused_by_name(db, key, dtypes):
    assert key in db, f"{key} is no longer in PyTorch's op database"
    op = db[key]
    records = opinfo.run_op(op, list(dtypes), 1)
    driven = [r for r in records if r["outcome"] != "skipped"]
    assert driven, f"no sample of {key} for {dtypes} was driven: " + "; ".join(
        "%s %s" % (r["dtype"], r.get("reason")) for r in records)
    bad = []
    for rec in driven:
        where = "%s %s sample %s" % (key, rec["dtype"], rec["index"])
        if rec["outcome"] in ("wrong", "trace_error", "crashed"):
            bad.append("%s: %s: %s" % (where, rec["outcome"], _describe(rec)))
        elif rec["outcome"] == "refused":
            message = rec.get("message") or rec.get("reason") or ""
            if not any(re.search(NAMED % re.escape(n), message) for n in _names(op)):
                bad.append("%s: refused without naming the op: %s" % (
                    where, " ".join(message.split())[:400]))
        else:
            assert rec["outcome"] in ("exact", "fell_back"), rec
            assert rec["checked"] >= 3, rec  # the sample and both redraws at least
    assert not bad, "\n".join(bad)


# ---- the harness itself: it must see what it is there to see ---------------------------


def test_compare_sees_nan_inf_and_integer_differences():
    import numpy as np
    ref = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    assert opinfo.compare(ref, ref.numpy().copy()) is None
    assert "NaN" in opinfo.compare(ref, np.array([1.0, 3.0, np.inf, 2.0], np.float32))
    assert "inf" in opinfo.compare(ref, np.array([1.0, np.nan, -np.inf, 2.0], np.float32))
    assert "beyond" in opinfo.compare(ref, np.array([1.0, np.nan, np.inf, 2.01], np.float32))
    assert "dtype" in opinfo.compare(ref, ref.double().numpy())
    assert "shape" in opinfo.compare(ref, ref.numpy()[:3].copy())
    ints = torch.tensor([-858993459, 7], dtype=torch.int32)
    assert "integers differ" in opinfo.compare(ints, np.array([-2147483648, 7], np.int32))
    assert "bools differ" in opinfo.compare(torch.tensor([True]), np.array([False]))
    # float16's wider tolerance
    half = torch.tensor([1.0], dtype=torch.float16)
    assert opinfo.compare(half, np.array([1.0009765625], np.float16)) is None


def test_large_inputs_judge_overflow_not_rounding():
    """On inputs of magnitude 1e30 a sum's order decides what cancels: rounding at that
    magnitude and NaN against inf are no difference; a finite value where eager
    overflowed (softplus(1e30) written as log(1 + exp(x)) gives inf) is one."""
    import numpy as np
    ref = torch.tensor([0.72, float("nan"), 1e30, 3.0])
    assert opinfo.compare(ref, np.array([0.0, np.inf, 1e30, 3.0], np.float32),
                          overflow=1e30) is None
    assert "finite on one side" in opinfo.compare(
        ref, np.array([0.0, np.inf, np.inf, 3.0], np.float32), overflow=1e30)
    assert opinfo.compare(ref, np.array([0.0, np.inf, 1e30, 3.0], np.float32)) is not None


def test_inputs_keep_shapes_and_carry_the_special_values():
    x = torch.linspace(-2, 3, 12).reshape(3, 4)
    y = torch.tensor(0.5)
    i = torch.tensor([[0, 2, 1]], dtype=torch.int32)
    kinds = dict(opinfo.input_kinds([x, y, i], "seed"))
    assert {"sample", "redraw0", "redraw1", "nan/p0", "nan/p1", "posinf/p0", "neginf/p0",
            "negzero/p0", "large/p0", "mixed/p0", "int_min/p0", "int_max/p0",
            "int_wide"} <= set(kinds)
    for inputs in kinds.values():
        assert [t.shape for t in inputs] == [x.shape, y.shape, i.shape]
        assert [t.dtype for t in inputs] == [x.dtype, y.dtype, i.dtype]
    r = kinds["redraw0"]
    assert not torch.equal(r[0], x) and float(r[0].min()) >= -2 and float(r[0].max()) <= 3
    assert sorted(r[2].reshape(-1).tolist()) == [0, 1, 2]  # indices stay indices
    # two inputs never carry a special value at the same flat position
    p0, p1 = kinds["nan/p0"], kinds["nan/p1"]
    assert bool(torch.isnan(p0[0]).any()) and not bool(torch.isnan(p0[1]))
    assert bool(torch.isnan(p1[1])) and bool(torch.isnan(p1[0]).any())
    assert int(kinds["int_min/p0"][2].min()) == torch.iinfo(torch.int32).min
    assert int(kinds["int_max/p1"][2].max()) == torch.iinfo(torch.int32).max
    assert float(kinds["large/p0"][0].abs().max()) == pytest.approx(1e30)
    neg = kinds["negzero/p0"][0]
    assert bool(((neg == 0) & torch.signbit(neg)).any())


def test_a_silently_wrong_export_is_reported(db, tmp_path):
    """The harness's own check on a model that computes something else: an ONNX model
    written by hand for fmax (ONNX Max, which propagates NaN) is wrong on a NaN input."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Max", ["x0", "x1"], ["y0"])], "g",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("x1", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [3])])
    path = str(tmp_path / "max.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    sess = opinfo.ort_session(path)
    x = torch.tensor([1.0, -2.0, 0.5])
    y = torch.tensor([0.0, 1.0, -1.0])
    bad = None
    for kind, inputs in opinfo.input_kinds([x, y], "fmax"):
        got = sess.run(None, opinfo.feeds(sess, ["x0", "x1"], inputs))
        diff = opinfo.compare(torch.fmax(*inputs), got[0])
        if diff is not None:
            bad = (kind, diff)
            break
    assert bad is not None and bad[0].startswith(("nan", "mixed")) and "NaN" in bad[1], bad
