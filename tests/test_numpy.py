"""NumPy inside traced nodes: traced arrays, their ops, dtype rules and export."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import leapp
from leapp import _core, annotate
from leapp.tracing.numpy_array import TracedArray, UnmappedNumpyError

X = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)
I = np.arange(12, dtype=np.int32).reshape(3, 4)


def _inputs(node: str = "n") -> tuple:
    return annotate.input_tensors(node, {"x": torch.from_numpy(X.copy()),
                                         "i": torch.from_numpy(I.copy())})


def _load_jit(bundle, node: str) -> torch.jit.ScriptModule:
    return torch.jit.load(os.path.join(bundle.dir("g"), f"{node}.pt"))


def _run_jit(bundle, node: str) -> torch.Tensor:
    model = _load_jit(bundle, node)
    names = [a.name for a in model.forward.schema.arguments][1:]
    feeds = {"x": X, "i": I}
    return model(*[torch.from_numpy(feeds[n].copy()) for n in names])


def _run_onnx(bundle, node: str) -> np.ndarray:
    import onnxruntime as ort
    session = ort.InferenceSession(os.path.join(bundle.dir("g"), f"{node}.onnx"),
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": X, "i": I}
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]


# --------------------------------------------------------------------------
# round trips


ROUND_TRIPS = {
    "numpy_from_numpy": lambda x: torch.from_numpy(x.numpy() * 2 + 1),
    "asarray_from_numpy": lambda x: torch.from_numpy(np.asarray(x) * 2 + 1),
    "array_as_tensor": lambda x: torch.as_tensor(np.array(x) * 2 + 1),
    "numpy_tensor": lambda x: torch.tensor(x.numpy() * 2 + 1),
    "asarray_as_tensor_dtype": lambda x: torch.as_tensor(np.asarray(x) * 2 + 1,
                                                         dtype=torch.float64),
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_round_trip_keeps_the_trace_and_exports(bundle, name):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    y = ROUND_TRIPS[name](x)
    assert type(y) is leapp.TracedTensor
    expected = torch.from_numpy(X * 2 + 1).to(y.dtype)
    torch.testing.assert_close(y.detach(), expected)
    annotate.output_tensors("n", {"y": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    torch.testing.assert_close(_run_jit(bundle, "n"), expected)


def test_conversions_give_traced_arrays_sharing_memory(bundle):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    for array in (x.numpy(), np.asarray(x), np.asanyarray(x)):
        assert type(array) is TracedArray
        assert np.shares_memory(array, x.detach().numpy())
    copied = np.array(x)
    assert type(copied) is TracedArray and not np.shares_memory(copied, x.detach().numpy())
    assert torch.from_numpy(x.numpy()) is x  # the array's shadow is the traced value
    leapp.stop()


def test_holds_active_sees_tensors_and_arrays_at_any_depth(bundle):
    """The one test the session patches and the TorchScript calls share: a traced tensor
    or a TracedArray of a tracing node, inside lists, tuples and dicts."""
    from leapp.tracing.numpy_array import holds_active
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    array = x.numpy()
    assert holds_active(x) and holds_active(array)
    assert holds_active([1, ({"a": array},)]) and holds_active({"k": [x]})
    assert not holds_active([X, torch.ones(2), {"a": 1.0}])
    annotate.output_tensors("n", {"y": x * 2.0}, export_with="jit")
    assert not holds_active([x, array])  # the node finished
    leapp.stop()


# --------------------------------------------------------------------------
# ufuncs, operators and functions: NumPy's values and dtypes, exported


OPS = {
    "mul_add": lambda a, i: a * 2 + 1,
    "rsub": lambda a, i: 1 - a,
    "rdiv": lambda a, i: 2 / (a + 5),
    "pow": lambda a, i: a ** 2,
    "neg_abs": lambda a, i: abs(-a),
    "floordiv": lambda a, i: i // 3,
    "mod": lambda a, i: i % 5,
    "tanh": lambda a, i: np.tanh(a),
    "exp": lambda a, i: np.exp(a),
    "sqrt_abs": lambda a, i: np.sqrt(np.abs(a)),
    "sign_floor": lambda a, i: np.sign(a) + np.floor(a),
    "clip": lambda a, i: np.clip(a, -1, 1),
    "clip_method": lambda a, i: a.clip(-1, 1),
    "maximum": lambda a, i: np.maximum(a, 0),
    "minimum_reversed": lambda a, i: np.minimum(0.5, a),
    "compare": lambda a, i: (a > 0.5) & (a < 1.5),
    "concatenate": lambda a, i: np.concatenate([a, a * 2], axis=1),
    "stack": lambda a, i: np.stack([a, a], axis=0),
    "hstack": lambda a, i: np.hstack([a, a]),
    "sum": lambda a, i: np.sum(a),
    "sum_axis": lambda a, i: np.sum(a, axis=0),
    "sum_method": lambda a, i: a.sum(axis=-1),
    "mean_keepdims": lambda a, i: np.mean(a, axis=1, keepdims=True),
    "mean_method": lambda a, i: a.mean(),
    "max_axis": lambda a, i: np.max(a, axis=1),
    "min_method": lambda a, i: a.min(),
    "std": lambda a, i: np.std(a, axis=0),
    "argmax": lambda a, i: np.argmax(a, axis=1),
    "cumsum": lambda a, i: np.cumsum(a, axis=1),
    "any": lambda a, i: np.any(a > 1, axis=1),
    "where": lambda a, i: np.where(a > 0, a, 0.1 * a),
    "where_scalars": lambda a, i: np.where(a > 0, 1, -1),
    "reshape": lambda a, i: a.reshape(4, 3),
    "np_reshape": lambda a, i: np.reshape(a, (-1,)),
    "transpose": lambda a, i: a.T + a.transpose(1, 0),
    "expand_squeeze": lambda a, i: np.squeeze(np.expand_dims(a * 2, 0)),
    "flip": lambda a, i: np.flip(a, axis=1),
    "slice": lambda a, i: a[1:, ::2],
    "row": lambda a, i: a[0],
    "element": lambda a, i: a[0, 1] * 3,
    "index_array": lambda a, i: a[np.array([0, 2])],
    "mask": lambda a, i: a[a > 0],
    "astype": lambda a, i: (a * 3).astype(np.int64),
    "copy": lambda a, i: a.copy() + 1,
    "flatten": lambda a, i: a.flatten(),
    "dot": lambda a, i: a.dot(a.T),
    "matmul": lambda a, i: a @ np.ones((4, 2), dtype=np.float32),
    "zeros_like": lambda a, i: np.zeros_like(a) + a,
    "broadcast": lambda a, i: a + np.arange(4, dtype=np.float32),
    "norm": lambda a, i: np.linalg.norm(a, axis=1),
    "tile": lambda a, i: np.tile(a, (2, 1)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_numpy_and_exports(bundle, name):
    fn = OPS[name]
    expected = np.asarray(fn(X.copy(), I.copy()))
    leapp.start("g", save_path=bundle.root)
    x, i = _inputs()
    result = fn(x.numpy(), i.numpy())
    assert type(result) is TracedArray
    assert result.dtype == expected.dtype and result.shape == expected.shape
    np.testing.assert_allclose(result.view(np.ndarray), expected, rtol=1e-6, atol=1e-6)
    annotate.output_tensors("n", {"y": result}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    exported = _run_jit(bundle, "n").numpy()
    assert exported.dtype == expected.dtype
    np.testing.assert_allclose(exported, expected, rtol=1e-6, atol=1e-6)


def test_one_node_of_numpy_ops_exports_to_onnx_and_jit(bundle):
    def body(a, i):
        h = np.concatenate([np.tanh(a * 0.5), np.clip(a, -1.0, 1.0)], axis=-1)
        h = h - np.mean(h, axis=-1, keepdims=True)
        h = np.where(h > 0, h, 0.1 * h) + np.maximum(a.sum(axis=1, keepdims=True), 0.0)
        return np.exp(-np.abs(h)).T.reshape(2, 12) + np.sqrt(np.square(h)).reshape(2, 12)

    expected = body(X.copy(), I.copy())
    eager = {}
    for backend in ("jit", "onnx"):
        leapp.start("g", save_path=bundle.root)
        x, i = _inputs()
        y = torch.from_numpy(body(x.numpy(), i.numpy()))
        eager[backend] = y.detach().clone()
        annotate.output_tensors("n", {"y": y}, export_with=backend)
        leapp.stop()
        assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
        # the bundle holds only its latest compile's model: check each in turn
        got = _run_jit(bundle, "n").numpy() if backend == "jit" else _run_onnx(bundle, "n")
        np.testing.assert_allclose(got, eager[backend].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(eager["jit"].numpy(), expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# NumPy's dtype rules


NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
DTYPE_RULES = {
    "int_true_division": (lambda a, i: i / 2, np.float64),
    "int_by_int_division": (lambda a, i: i / (i + 1), np.float64),
    "float64_scalar": (lambda a, i: a * np.float64(1.5), np.float64),
    "float32_scalar": (lambda a, i: a * np.float32(1.5), np.float32),
    "python_float": (lambda a, i: a * 1.5, np.float32),
    "int32_plus_float32": (lambda a, i: a + i, np.float64),
    "sqrt_of_int": (lambda a, i: np.sqrt(i), np.float64),
    "mean_of_int": (lambda a, i: np.mean(i, axis=0), np.float64),
    "sum_of_int32": (lambda a, i: np.sum(i, axis=1), np.int64),
    "sum_of_bool": (lambda a, i: np.sum(a > 0), np.int64),
    "float64_constant": (lambda a, i: a @ np.ones((4, 2)), np.float64),
}


@pytest.mark.parametrize("name", sorted(DTYPE_RULES))
def test_numpy_dtype_rules(bundle, name):
    fn, dtype = DTYPE_RULES[name]
    expected = np.asarray(fn(X.copy(), I.copy()))
    if NUMPY_2:
        assert expected.dtype == dtype
    else:
        # NumPy 1.x casts by value for scalars (no NEP 50): the traced array
        # must follow the NumPy that runs, whatever its rules.
        dtype = expected.dtype.type
    leapp.start("g", save_path=bundle.root)
    x, i = _inputs()
    result = fn(x.numpy(), i.numpy())
    assert result.dtype == dtype
    np.testing.assert_allclose(result.view(np.ndarray), expected, rtol=1e-12)
    annotate.output_tensors("n", {"y": result}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False, validate=True)
    assert bundle.yaml("g")["models"]["n"]["outputs"][0]["dtype"] == np.dtype(dtype).name
    exported = _run_jit(bundle, "n").numpy()
    assert exported.dtype == dtype
    np.testing.assert_allclose(exported, expected, rtol=1e-12)


# --------------------------------------------------------------------------
# in-place NumPy writes


def test_in_place_writes_are_recorded(bundle):
    def body(a):
        a = a * 1.0
        a *= 2
        np.add(a, 1, out=a)
        a[0, 0] = 100
        a[a > 3] = 0
        b = np.empty_like(a)
        np.copyto(b, a)
        b += 1
        return b

    expected = body(X.copy())
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    b = body(x.numpy())
    assert type(b) is TracedArray
    np.testing.assert_array_equal(b.view(np.ndarray), expected)
    annotate.output_tensors("n", {"b": b}, export_with="onnx")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    np.testing.assert_array_equal(_run_onnx(bundle, "n"), expected)


def test_in_place_ufunc_returns_its_out_array(bundle):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    a = x.numpy() + 0
    same = a
    a *= 2
    assert a is same and type(a) is TracedArray
    assert np.multiply(a, 2, out=a) is a
    leapp.stop()


# --------------------------------------------------------------------------
# NumPy in annotations


def test_numpy_input_comes_back_traced_and_wires(bundle):
    leapp.start("g", save_path=bundle.root)
    for step in range(2):
        raw = X.astype(np.float64) + step
        a = annotate.input_tensors("n", {"raw": raw})
        if step == 0:
            assert type(a) is TracedArray and np.shares_memory(a, raw)
        else:
            assert type(a) is np.ndarray  # re-entry gives plain values
        out = annotate.output_tensors("n", {"y": np.tanh(a) * 2.0, "m": a.mean(axis=1)},
                                      export_with="jit")
        b = annotate.input_tensors("k", {"y": out[0]})
        annotate.output_tensors("k", {"z": torch.from_numpy(b) + 1.0}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True, "k": True}
    doc = bundle.yaml("g")
    assert doc["models"]["n"]["inputs"][0] == {"name": "raw", "dtype": "float64",
                                              "shape": [3, 4], "type": "tensor"}
    assert [o["dtype"] for o in doc["models"]["n"]["outputs"]] == ["float64", "float64"]
    assert doc["pipeline"]["data_flow"] == {"n/y": ["k/y"]}
    model = _load_jit(bundle, "n")
    y, m = model(torch.from_numpy(X.astype(np.float64)))
    np.testing.assert_allclose(y.numpy(), np.tanh(X.astype(np.float64)) * 2.0)
    np.testing.assert_allclose(m.numpy(), X.astype(np.float64).mean(axis=1))


def test_plain_numpy_output_is_refused(bundle):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="non-traced tensors"):
        annotate.output_tensors("n", {"y": np.ones(2)})
    leapp.stop()


def test_copy_of_a_published_array_keeps_its_port(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.from_numpy(X.copy())})
    y = annotate.output_tensors("a", {"y": x.numpy() * 2}, export_with="jit")
    assert type(y) is TracedArray
    assert type(y + 1) is np.ndarray  # ops on a finished node's arrays are plain numpy
    z = annotate.input_tensors("b", {"z": torch.as_tensor(np.array(y))})
    annotate.output_tensors("b", {"w": z + 1}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    assert bundle.yaml("g")["pipeline"]["data_flow"] == {"a/y": ["b/z"]}


# --------------------------------------------------------------------------
# global_patching, sessions, errors


def test_global_patching_off_keeps_arrays_plain(bundle):
    original = (torch.from_numpy, torch.as_tensor, torch.tensor, np.asarray, np.array)
    leapp.start("g", save_path=bundle.root, dry_run=True, global_patching=False)
    assert (torch.from_numpy, torch.as_tensor, torch.tensor, np.asarray, np.array) == original
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    for array in (x.numpy(), np.asarray(x), np.array(x)):
        assert type(array) is np.ndarray
    y = torch.from_numpy(x.numpy() * 2)
    assert _core.carrier_of(y) is None
    with pytest.raises(RuntimeError, match="non-traced tensors"):
        annotate.output_tensors("n", {"y": y})
    leapp.stop()


def test_patches_are_removed_by_stop(bundle):
    original = (torch.from_numpy, torch.as_tensor, torch.tensor, np.asarray, np.array,
                np.asanyarray)
    leapp.start("g", save_path=bundle.root, dry_run=True)
    assert np.asarray is not original[3]
    leapp.stop()
    assert (torch.from_numpy, torch.as_tensor, torch.tensor, np.asarray, np.array,
            np.asanyarray) == original


def test_unmappable_function_raises_a_clear_error(bundle):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("policy", {"x": torch.ones(8)})
    with pytest.raises(UnmappedNumpyError) as info:
        np.fft.fft(x.numpy())
    message = str(info.value)
    assert "numpy.fft.fft" in message and "'policy'" in message and "torch" in message
    assert isinstance(info.value, NotImplementedError)
    with pytest.raises(UnmappedNumpyError, match=r"numpy\.cumsum\(out=\.\.\.\)"):
        np.cumsum(x.numpy(), out=np.empty(8, dtype=np.float32))
    leapp.stop()


def test_functions_giving_python_values_run_unrecorded(bundle):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("n", {"x": torch.ones(2, 3)})
    a = x.numpy()
    assert np.allclose(a, 1.0) is True
    assert np.shape(a) == (2, 3) and len(a) == 2
    assert float(a.sum()) == 6.0
    leapp.stop()


def test_outside_a_session_arrays_are_plain(bundle):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    a = x.numpy()
    annotate.output_tensors("n", {"y": torch.from_numpy(a * 2)})
    leapp.stop()
    assert type(x.numpy()) is np.ndarray
    assert type(a * 2) is np.ndarray and type(np.tanh(a)) is np.ndarray
    assert type(np.concatenate([a, a])) is np.ndarray
    assert _core.carrier_of(torch.from_numpy(a)) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a[0, 0] = 5.0  # writes go to the memory as in plain numpy
    assert x.detach()[0, 0].item() == 5.0


def test_numpy_ufunc_on_a_traced_tensor_is_recorded(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    y = np.tanh(x) + np.maximum(x, 0.0)
    assert type(y) is leapp.TracedTensor
    annotate.output_tensors("n", {"y": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    expected = np.tanh(X) + np.maximum(X, 0.0)
    np.testing.assert_allclose(_run_jit(bundle, "n").numpy(), expected, rtol=1e-6)


def test_numpy_ufunc_on_a_traced_tensor_outside_a_session_acts_as_on_a_tensor():
    from leapp.tracing.traced import alias
    t = alias(torch.ones(2))
    assert torch.equal(np.tanh(t), np.tanh(torch.ones(2)))
    assert type(np.add(t, 1)) is torch.Tensor
    assert np.greater(t, 0).dtype == np.greater(torch.ones(2), 0).dtype


@pytest.mark.parametrize("call", ["sum_where", "max_initial"])
def test_unsupported_keywords_are_refused_not_ignored(bundle, call):
    leapp.start("g", save_path=bundle.root, dry_run=True)
    x = annotate.input_tensors("n", {"x": torch.ones(3)})
    a = x.numpy()
    with pytest.raises(UnmappedNumpyError, match="where=|initial="):
        if call == "sum_where":
            np.sum(a, where=np.array([True, False, True]))
        else:
            np.max(a, initial=5.0)
    leapp.stop()


def test_numpy_state_becomes_feedback(bundle):
    leapp.start("g", save_path=bundle.root)
    for step in range(3):
        x = annotate.input_tensors("n", {"x": np.full(3, float(step), dtype=np.float32)})
        h = annotate.state_tensors("n", {"h": np.zeros(3, dtype=np.float32)})
        new = 0.5 * h + x
        annotate.update_state("n", {"h": new})
        annotate.output_tensors("n", {"y": new * 2}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    doc = bundle.yaml("g")
    assert doc["pipeline"]["feedback_flow"] == {"n/h": ["n/h"]}
    assert [p["name"] for p in doc["models"]["n"]["outputs"]] == ["y", "h"]


def test_in_place_write_through_the_array_reaches_its_tensor(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.from_numpy(X.copy())})
    y = x * 1.0
    a = y.numpy()
    a *= 2
    a[0] = -1.0
    expected = X * 2
    expected[0] = -1.0
    np.testing.assert_array_equal(y.detach().numpy(), expected)
    annotate.output_tensors("n", {"y": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False, validate=True) == {"n": True}
    np.testing.assert_array_equal(_run_jit(bundle, "n").numpy(), expected)
