"""leapp's ONNX writer (leapp.compiling.onnx_writer), rule family by rule family.

Each case is traced with leapp (the writer's real input: the node's torch.fx
graph with the traced port values), written with the writer alone (a call
without a rule fails the test), checked by onnx.checker (full check) and run in
onnxruntime on fresh random inputs (fixed seeds, not the traced ones) against
torch eager: same dtype, same shape, values within float tolerance, or equal
where eager's rounding must be kept (float16 arithmetic, integer maths).

Then the backend: onnx / onnx-dynamo nodes go through the writer, a node with
an op that has no rule falls back to torch's exporter and log.txt and the
progress line name the op, LEAPP_ONNX_WRITER=torch forces torch's exporter
with the same YAML, and the examples and the rsl-rl-lib exports need no
fallback.
"""
from __future__ import annotations

import importlib.util
import math
import os
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

import leapp
from leapp import _core, annotate
from leapp.compiling import onnx_writer
from leapp.compiling.backends.onnx import deduplicate_names
from leapp.tracing.annotations import info

from support import ROOT, writer_census

FALLBACK = "torch's ONNX exporter"


@pytest.fixture(autouse=True)
def _the_writer_on(monkeypatch):
    """These are the writer's tests: LEAPP_ONNX_WRITER=torch (a whole-suite run with torch's
    exporter) does not apply to them; the test of that variable sets it itself."""
    monkeypatch.delenv(onnx_writer.ENV, raising=False)
DEFAULT_OPSET = 20

# ---------------------------------------------------------------------------
# inputs


class Spec:
    """How to draw one input: shape, dtype and a kind (normal, index below n, ...)."""

    def __init__(self, shape: tuple, dtype: torch.dtype = torch.float32, kind: str = "normal",
                 high: int = 10) -> None:
        self.shape, self.dtype, self.kind, self.high = shape, dtype, kind, high

    def draw(self, gen: torch.Generator) -> torch.Tensor:
        if self.kind == "index":
            return torch.randint(0, self.high, self.shape, generator=gen).to(self.dtype)
        if self.kind == "grid":  # small integers as floats: zeros, ties, exact halves
            return (torch.randint(-4, 5, self.shape, generator=gen) / 2).to(self.dtype)
        if self.dtype == torch.bool:
            return torch.rand(self.shape, generator=gen) > 0.5
        if not self.dtype.is_floating_point:
            low = 0 if self.dtype == torch.uint8 else -self.high
            return torch.randint(low, self.high, self.shape, generator=gen).to(self.dtype)
        return (torch.randn(self.shape, generator=gen) * 2).to(self.dtype)


def f(*shape: int, dtype: torch.dtype = torch.float32) -> Spec:
    return Spec(shape, dtype)


def i(*shape: int, dtype: torch.dtype = torch.int64, high: int = 10) -> Spec:
    return Spec(shape, dtype, high=high)


def idx(high: int, *shape: int) -> Spec:
    return Spec(shape, torch.int64, kind="index", high=high)


def grid(*shape: int, dtype: torch.dtype = torch.float32) -> Spec:
    return Spec(shape, dtype, kind="grid")


def b(*shape: int) -> Spec:
    return Spec(shape, torch.bool)


# ---------------------------------------------------------------------------
# tracing, writing, running


def _as_dict(result: Any) -> dict[str, torch.Tensor]:
    if isinstance(result, dict):
        return result
    if isinstance(result, (tuple, list)):
        return {f"out{k}": t for k, t in enumerate(result)}
    return {"out": result}


def trace_node(tmp_path: Any, fn: Callable, inputs: list[torch.Tensor]) -> Any:
    """Trace fn on inputs as node 'node' (not compiled); the C core's node."""
    names = [f"in{k}" for k in range(len(inputs))]
    leapp.start(name="writer", save_path=str(tmp_path))
    traced = annotate.input_tensors("node", dict(zip(names, inputs)))
    traced = traced if isinstance(traced, tuple) else (traced,)
    with torch.no_grad():
        outputs = _as_dict(fn(*traced))
    annotate.output_tensors("node", outputs, export_with="onnx")
    leapp.stop()
    return _core.nodes()["node"]


def write_node(node: Any, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """The node written as the onnx backend does (a state port named <name>_in / _out)."""
    module = info(node).graph_module.module
    inputs, outputs = deduplicate_names(node.name, [p.name for p in node.inputs],
                                        [p.name for p in node.outputs])
    model = onnx_writer.write_model(node.name, module, [p.value for p in node.inputs], inputs,
                                    outputs, opset)
    onnx.checker.check_model(model, full_check=True)
    return model


def run_model(model: onnx.ModelProto, feed: dict[str, torch.Tensor]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    wanted = [x.name for x in session.get_inputs()]
    return session.run(None, {name: _to_numpy(feed[name]) for name in wanted})


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        raise AssertionError("bfloat16 ports are not fed through numpy in these tests")
    return t.detach().numpy()


def check_case(tmp_path: Any, fn: Callable, specs: list[Spec], exact: bool = False,
               opset: int = DEFAULT_OPSET, draws: int = 3, rtol: float = 1e-5,
               atol: float = 1e-5) -> onnx.ModelProto:
    """Trace on one draw, write, then compare with eager on `draws` fresh draws."""
    gen = torch.Generator().manual_seed(1234)
    traced_inputs = [s.draw(gen) for s in specs]
    node = trace_node(tmp_path, fn, traced_inputs)
    model = write_node(node, opset)
    assert [o.name for o in model.graph.output] == [p.name for p in node.outputs]
    for _ in range(draws):
        fresh = [s.draw(gen) for s in specs]
        with torch.no_grad():
            want = _as_dict(fn(*fresh))
        got = run_model(model, {f"in{k}": t for k, t in enumerate(fresh)})
        assert len(got) == len(want)
        for (key, expected), actual in zip(want.items(), got):
            expected = expected.detach()
            actual_t = torch.from_numpy(np.array(actual))
            assert actual_t.dtype == expected.dtype, (key, actual_t.dtype, expected.dtype)
            assert tuple(actual_t.shape) == tuple(expected.shape), (key, actual_t.shape,
                                                                     expected.shape)
            if exact or not expected.dtype.is_floating_point:
                assert torch.equal(actual_t, expected) or (
                    expected.dtype.is_floating_point
                    and torch.equal(torch.nan_to_num(actual_t, 7.0),
                                    torch.nan_to_num(expected, 7.0))), \
                    (key, actual_t, expected)
            else:
                torch.testing.assert_close(actual_t, expected, rtol=rtol, atol=atol,
                                           equal_nan=True, msg=lambda m: f"{key}: {m}")
    return model


# ---------------------------------------------------------------------------
# elementwise maths

def _specials(x):
    """x with NaN at -1.5, -inf below -1.7 and +inf above 1.7 (x from grid: steps of 0.5
    in [-2, 2])."""
    inf = float("inf")
    return torch.where(x == -1.5, float("nan"), torch.where(x < -1.7, -inf,
                                                             torch.where(x > 1.7, inf, x)))


ELEMENTWISE = {
    "add_sub_mul_div": (lambda x, y: {"a": x + y, "s": x - y, "m": x * y, "d": x / y,
                                      "alpha": torch.add(x, y, alpha=2),
                                      "sub_alpha": torch.sub(x, y, alpha=0.5)},
                        [f(2, 3), f(2, 3)]),
    "scalars_reversed": (lambda x: {"radd": 2.0 + x, "rsub": 3.0 - x, "rmul": 2.5 * x,
                                    "rdiv": 1.0 / (x.abs() + 1), "rpow": 2.0 ** x,
                                    "neg": -x, "pos": +x}, [f(3, 4)]),
    "broadcasting": (lambda x, y, z: {"xy": x * y, "xz": x - z, "all": x + y * z},
                     [f(3, 1), f(4), f(2, 1, 1)]),
    "int_float_promotion": (lambda n, x: {"add": n + x, "mul_f": n * 0.5, "div_int": n / 3,
                                          "add_int": n + 2, "int_div_int": n / (n.abs() + 1)},
                            [i(2, 3), f(2, 3)]),
    "int32_int64": (lambda a, c: {"sum": a + c, "prod": a * c},
                    [i(4, dtype=torch.int32), i(4)]),
    "floor_divide": (lambda x, y: {"f": x // 0.5, "fy": x // y, "neg": (-x) // 0.3,
                                   "fn": torch.floor_divide(x, -0.7),
                                   "trunc": torch.div(x, y, rounding_mode="trunc"),
                                   "floor": torch.div(x, y, rounding_mode="floor")},
                     [grid(3, 4), Spec((3, 4), kind="grid")]),
    "int_division": (lambda a, c: {"floordiv": a // (c.abs() + 1), "neg": (-a) // 3,
                                   "trunc": torch.div(a, c.abs() + 1, rounding_mode="trunc"),
                                   "rem": a % 3, "rem_neg": a % -4,
                                   "fmod": torch.fmod(a, 3)}, [i(3, 5), i(3, 5)]),
    "remainder_float": (lambda x: {"mod": x % 0.7, "neg_mod": x % -0.7,
                                   "rem": torch.remainder(x, 1.5),
                                   "fmod": torch.fmod(x, 0.7)}, [f(4, 5)]),
    "powers": (lambda x: {"sq": x ** 2, "cube": x ** 3, "sqrt": x.abs() ** 0.5,
                          "inv": (x.abs() + 1) ** -1, "inv2": (x.abs() + 1) ** -2,
                          "rsqrt": (x.abs() + 1) ** -0.5, "gen": (x.abs() + 0.1) ** 1.7,
                          "one": x ** 1, "zero": x ** 0, "square": x.square(),
                          "tensor_exp": x.abs() ** (x * 0.1)}, [f(3, 4)]),
    "int_pow": (lambda a: {"sq": a ** 2, "pow3": torch.pow(a, 3)}, [i(5, high=6)]),
    "unary_maths": (lambda x: {
        "exp": torch.exp(x), "log": torch.log(x.abs() + 0.1), "sqrt": torch.sqrt(x.abs()),
        "rsqrt": torch.rsqrt(x.abs() + 0.1), "sin": torch.sin(x), "cos": x.cos(),
        "tan": torch.tan(x * 0.3), "asin": torch.asin(torch.tanh(x)),
        "acos": torch.acos(torch.tanh(x)), "atan": torch.atan(x), "sinh": torch.sinh(x),
        "cosh": torch.cosh(x), "asinh": torch.asinh(x), "acosh": torch.acosh(x.abs() + 1),
        "atanh": torch.atanh(torch.tanh(x) * 0.9), "erf": torch.erf(x),
        "reciprocal": (x.abs() + 1).reciprocal(), "log2": torch.log2(x.abs() + 1),
        "log10": torch.log10(x.abs() + 1), "log1p": torch.log1p(x.abs()),
        "log1p_tiny": torch.log1p(x * 1e-9) * 1e9,
        # +inf, -1 and below: inf, -inf, NaN as eager (the accurate form's inf / inf)
        "log1p_edges": torch.log1p(torch.where(x > 0.5, float("inf"), x * 3 - 1)),
        "log1p_huge": torch.log1p(x.abs() * 1e37 + 3e38 * (x > 1.5)),  # no overflow
        "expm1": torch.expm1(x), "exp2": torch.exp2(x), "abs": abs(x), "sign": x.sign(),
        "sigmoid": torch.sigmoid(x), "tanh": x.tanh()}, [f(4, 5)]),
    "rounding": (lambda x: {"floor": x.floor(), "ceil": torch.ceil(x), "round": x.round(),
                            "trunc": x.trunc(), "frac": torch.frac(x),
                            "int_floor": x.long().floor()}, [grid(4, 5)]),
    "atan2": (lambda y, x: {"atan2": torch.atan2(y, x), "axes": torch.atan2(y * 0, x),
                            "on_x0": torch.atan2(y, x * 0),
                            "origin": torch.atan2(y * 0, x * 0)}, [grid(5, 6), grid(5, 6)]),
    "clamp": (lambda x, lo: {"both": x.clamp(-0.5, 0.5), "min": torch.clamp(x, min=0.1),
                             "max": x.clamp(max=-0.2), "tensor": x.clamp(min=lo),
                             "tensors": torch.clamp(x, lo, lo + 1), "crossed": x.clamp(1, -1),
                             "clamp_min": x.clamp_min(0.0), "clip": x.clip(-1, 1)},
              [f(3, 4), f(4)]),
    "clamp_int": (lambda a: {"c": a.clamp(-2, 3), "f": a.clamp(min=0.5)}, [i(6)]),
    # a bound wraps to the tensor's type first: -2 is 254 for uint8
    "clamp_wrapping": (lambda u, s: {"u": u.clamp(-2, 3), "u_min": u.clamp(min=-2),
                                     "u_max": u.clamp(max=-1), "s": torch.clamp(s, -5, 5)},
                       [i(6, dtype=torch.uint8, high=256), i(6, dtype=torch.int8)]),
    "min_max_binary": (lambda x, y: {"max": torch.maximum(x, y), "min": torch.minimum(x, y),
                                     "max2": torch.max(x, y), "min2": torch.min(x, y)},
                       [f(3, 4), f(4)]),
    "lerp_addc": (lambda x, y, w: {"lerp": torch.lerp(x, y, 0.25),
                                   "lerp_hi": torch.lerp(x, y, 0.75),
                                   "lerp_t": torch.lerp(x, y, w),
                                   "addcmul": torch.addcmul(x, x, y, value=0.5),
                                   "addcdiv": torch.addcdiv(x, x, y.abs() + 1, value=2)},
                  [f(3, 4), f(3, 4), Spec((3, 4), kind="normal")]),
    "hypot_copysign_nan": (lambda x, y: {"hypot": torch.hypot(x, y),
                                         "copysign": torch.copysign(x, y),
                                         "nan_to_num": torch.nan_to_num(torch.log(x))},
                           [f(3, 4), f(3, 4)]),
    "float64": (lambda x, y: {"m": x * y + 1.5, "e": torch.exp(x) / (y.abs() + 1)},
                [f(3, dtype=torch.float64), f(3, dtype=torch.float64)]),
    "logaddexp": (lambda x, y, z: {"lae": torch.logaddexp(x, y), "lae2": torch.logaddexp2(x, y),
                                   "broadcast": torch.logaddexp(x, z), "method": y.logaddexp(z),
                                   "large": torch.logaddexp(x * 1e30, y * 1e30),
                                   "huge": torch.logaddexp2(x * 1e37, y * -1e37),
                                   "far": torch.logaddexp(x, y - 40),
                                   "far2": torch.logaddexp2(x, y - 60),
                                   # log1p of a tiny exp, scaled up: log(1 + tiny) would be 0
                                   "tiny": torch.logaddexp(x * 0, -30 - y.abs()) * 1e13,
                                   "tiny2": torch.logaddexp2(x * 0, -40 - y.abs()) * 1e12,
                                   "ties": torch.logaddexp(x, x),
                                   "int_float": torch.logaddexp(x, z.long()),
                                   "f64": torch.logaddexp(x.double() * 1e300, y.double() * 1e300)},
                  [f(3, 4), f(3, 4), f(4)]),
    # NaN at -1.5, -inf below -1.7, +inf above 1.7 (grid: steps of 0.5 in [-2, 2])
    "logaddexp_infinities": (lambda x, y: {"lae": torch.logaddexp(_specials(x), _specials(y)),
                                           "lae2": torch.logaddexp2(_specials(x), _specials(y)),
                                           "self": torch.logaddexp(_specials(x), _specials(x)),
                                           "half": torch.logaddexp(_specials(x).half(),
                                                                   _specials(y).half())},
                             [grid(6, 6), grid(6, 6)]),
}


@pytest.mark.parametrize("case", sorted(ELEMENTWISE))
def test_elementwise(tmp_path, case):
    fn, specs = ELEMENTWISE[case]
    check_case(tmp_path, fn, specs)


def test_float16_arithmetic_rounds_as_eager(tmp_path):
    """`(x.half() * 3.3).float()` computes in float16 (rounds after each op) and the
    Python number is not rounded to float16 first: bit-equal to eager."""
    def fn(x, y):
        h = x.half()
        return {"scaled": (h * 3.3).float(), "sum": (h + y.half()).float(),
                "chain": ((h * 3.3 + 0.1) / 7.0).float(), "half_out": h * y.half(),
                "exp": torch.exp(h), "cmp": h <= 0.1, "bf16": (x.bfloat16() * 3.3).float()}
    model = check_case(tmp_path, fn, [f(64), f(64)], exact=True)
    assert "Cast" in [n.op_type for n in model.graph.node]


def test_integer_wraparound(tmp_path):
    check_case(tmp_path, lambda a, c: {"mul": a * c, "add": a + c, "neg": -a},
               [i(8, dtype=torch.int8, high=100), i(8, dtype=torch.int8, high=100)])


def test_float16_rounds_python_numbers_and_steps_as_eager(tmp_path):
    """Eager rounds a Python number to float16 before remainder, fmod, pow and add's
    alpha (not before mul or div), and rounds after each step of softsign and
    tanhshrink: to the bit."""
    fn = lambda x: {"mod": x % 0.7, "neg_mod": x % -0.7, "fmod": torch.fmod(x, 0.7),  # noqa: E731
                    "pow": (x.abs() + 0.1) ** 1.7, "rpow": 1.3 ** x,
                    "alpha": torch.add(x, x, alpha=0.7123), "mul": x * 0.7123,
                    "softsign": F.softsign(x), "tanhshrink": F.tanhshrink(x)}
    check_case(tmp_path, fn, [f(8, 16, dtype=torch.float16)], exact=True, draws=4)


# ---------------------------------------------------------------------------
# special values: NaN, infinities, huge numbers, as eager gives them

_SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, 1.0, -1.0, 2.5, -0.5, 1e30, -3e25]


def _pairs():
    """Every pair of special values: y down the rows, x along the columns."""
    v = torch.tensor(_SPECIAL)
    return v[:, None].expand(len(v), len(v)).contiguous(), v[None, :].expand(len(v), len(v))


SPECIAL_CASES = {
    "atan2": lambda y, x: {"atan2": torch.atan2(y, x)},
    "hypot": lambda y, x: {"hypot": torch.hypot(y, x)},
    "clamp": lambda y, x: {"min": torch.clamp(y, min=0.1), "max": y.clamp(max=-0.2),
                           "both": y.clamp(-0.5, 0.5), "clamp_min": y.clamp_min(0.0),
                           "clamp_max": y.clamp_max(1.0), "tensor": torch.clamp(y, min=x)},
    "sign_pow0": lambda y, x: {"sign": torch.sign(y), "sgn": y.sgn(), "pow0": y ** 0},
    "copysign": lambda y, x: {"copysign": torch.copysign(y, x),
                              "zeros": torch.copysign(y, torch.nan_to_num(x * 0))},
    "extremes": lambda y, x: {"max": x.max(), "max_dim": x.max(dim=1).values,
                              "max_idx": x.max(dim=1).indices, "min_dim": x.min(0)[0],
                              "min_idx": x.min(0)[1], "amax": x.amax(1), "amin": x.amin(-1),
                              "argmax": x.argmax(1), "argmin": x.argmin(dim=0, keepdim=True),
                              "argmax_all": x.argmax(), "norm_inf": torch.linalg.vector_norm(
                                  x, float("inf"), dim=1),
                              "norm_neg_inf": torch.linalg.vector_norm(x, float("-inf"), dim=0)},
    "variance": lambda y, x: {"var": x.var(1), "std": x.std(1, keepdim=True),
                              "var0": torch.var(x, 0, correction=0),
                              "std_mean": torch.std_mean(x, dim=1)[0]},
}


def test_float64_hypot_and_float16_powers_at_special_values(tmp_path):
    """float64 hypot without overflow or underflow (1e200, 1e-200); float16 x ** 0.5 and
    x ** -0.5 through pow as eager's (pow(-inf, 0.5) = inf, pow(-0.0, -0.5) = inf)."""
    fn = lambda a, b, h: {"hypot": torch.hypot(a, b), "sqrt": h ** 0.5,  # noqa: E731
                          "rsqrt": h ** -0.5, "inverse": h ** -1}
    a = torch.tensor([1e200, 1e-200, 0.0, float("inf"), float("nan"), 3.0, -1e300],
                     dtype=torch.float64)
    b = torch.tensor([1e200, 1e-200, 0.0, float("nan"), 1.0, 4.0, 1e300], dtype=torch.float64)
    h = torch.tensor([float("-inf"), -0.0, 0.0, 4.0, float("inf"), float("nan"), 2.0]).half()
    node = trace_node(tmp_path, fn, [torch.rand(7).double(), torch.rand(7).double(),
                                     torch.rand(7).half()])
    got = run_model(write_node(node), {"in0": a, "in1": b, "in2": h})
    for (key, expected), actual in zip(fn(a, b, h).items(), got):
        actual = torch.from_numpy(actual)
        assert torch.equal(torch.isnan(actual), torch.isnan(expected)), key
        torch.testing.assert_close(actual, expected, rtol=1e-12 if key == "hypot" else 0,
                                   atol=0, equal_nan=True, msg=lambda m: f"{key}: {m}")
        assert torch.equal(torch.signbit(actual), torch.signbit(expected)), key


@pytest.mark.parametrize("case", sorted(SPECIAL_CASES))
def test_special_values_as_eager(tmp_path, case):
    """NaN stays NaN, infinities and huge values come out as eager's, and indices point
    where eager's do (a NaN first).  Signed zeros aside: onnxruntime's Where drops the
    sign of a -0.0 it selects (docs/compatibility.md)."""
    fn = SPECIAL_CASES[case]
    y, x = _pairs()
    if case in ("extremes", "variance"):  # ordinary numbers (with ties), one special
        n = len(_SPECIAL)                   # value per row and column, on the diagonal
        x = (torch.arange(n * n).reshape(n, n) % 7 - 3).float()
        x[range(n), range(n)] = torch.tensor(_SPECIAL)
    node = trace_node(tmp_path, fn, [torch.randn(y.shape), torch.randn(x.shape)])
    got = run_model(write_node(node), {"in0": y, "in1": x})
    want = _as_dict(fn(y, x))
    for (key, expected), actual in zip(want.items(), got):
        actual = torch.from_numpy(np.array(actual))
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, key
        if not expected.dtype.is_floating_point:
            assert torch.equal(actual, expected), (key, actual, expected)
            continue
        assert torch.equal(torch.isnan(actual), torch.isnan(expected)), (key, actual, expected)
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=0, equal_nan=True,
                                   msg=lambda m: f"{key}: {m}")
        if case == "copysign":  # where the sign is the point: zeros and NaN included
            assert torch.equal(torch.signbit(actual)[~torch.isnan(expected)],
                               torch.signbit(expected)[~torch.isnan(expected)]), key


# ---------------------------------------------------------------------------
# activations

ACTIVATIONS = {
    "relu_family": (lambda x: {"relu": torch.relu(x), "F_relu": F.relu(x), "relu6": F.relu6(x * 4),
                               "leaky": F.leaky_relu(x, 0.1), "leaky_default": F.leaky_relu(x),
                               "hardtanh": F.hardtanh(x, -0.5, 0.7),
                               "prelu": nn.PReLU(3).eval()(x)}, [f(2, 3, 4)]),
    "exponential": (lambda x: {"elu": F.elu(x), "elu_a": F.elu(x, alpha=0.5), "selu": F.selu(x),
                               "celu": F.celu(x, 1.5), "softplus": F.softplus(x),
                               "softplus_beta": F.softplus(x * 10, beta=2, threshold=5),
                               "logsigmoid": F.logsigmoid(x), "mish": F.mish(x),
                               "silu": F.silu(x), "softsign": F.softsign(x),
                               "tanhshrink": F.tanhshrink(x)}, [f(3, 5)]),
    "gelu": (lambda x: {"erf": F.gelu(x), "tanh": F.gelu(x, approximate="tanh")}, [f(4, 5)]),
    "hard": (lambda x: {"hs": F.hardsigmoid(x * 3), "hw": F.hardswish(x * 3)}, [f(4, 5)]),
    "softmax": (lambda x: {"sm": F.softmax(x, dim=-1), "sm0": torch.softmax(x, 0),
                           "lsm": torch.log_softmax(x, dim=1),
                           "sm64": F.softmax(x, dim=1, dtype=torch.float64),
                           "softmin": F.softmin(x, dim=2)}, [f(2, 3, 4)]),
    "glu_expit": (lambda x: {"glu": F.glu(x), "glu0": F.glu(x, 0),
                             "expit": torch.special.expit(x)}, [f(4, 6)]),
    "modules": (lambda x: {"seq": nn.Sequential(nn.ELU(), nn.Tanh(), nn.Sigmoid(), nn.SiLU(),
                                                 nn.Softplus(), nn.Mish(), nn.GELU(),
                                                 nn.Dropout(0.3)).eval()(x)}, [f(3, 5)]),
}


@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_activations(tmp_path, case):
    fn, specs = ACTIVATIONS[case]
    check_case(tmp_path, fn, specs)


@pytest.mark.parametrize("opset", [17, 18])
def test_activations_composed_below_their_opset(tmp_path, opset):
    """Gelu (an op from 20) and Mish (from 18) are compositions below those opsets."""
    model = check_case(tmp_path, lambda x: {"g": F.gelu(x), "gt": F.gelu(x, approximate="tanh"),
                                            "m": F.mish(x)}, [f(4, 5)], opset=opset)
    ops = {n.op_type for n in model.graph.node}
    assert "Gelu" not in ops
    assert ("Mish" in ops) == (opset >= 18)
    assert model.opset_import[0].version == opset


# ---------------------------------------------------------------------------
# reductions

REDUCTIONS = {
    "sum_mean": (lambda x: {"sum": x.sum(), "sum1": x.sum(dim=1), "sumneg": x.sum(-1, keepdim=True),
                            "sum_dims": x.sum(dim=(0, 2)), "mean": x.mean(),
                            "mean_keep": x.mean(dim=-1, keepdim=True),
                            "sum64": x.sum(dim=0, dtype=torch.float64), "prod": (x * 0.5).prod(1),
                            "amax": torch.amax(x, dim=(0, 1)), "amin": x.amin(-1)},
                 [f(2, 3, 4)]),
    "integer_sums": (lambda a, m: {"sum": a.sum(), "sum_dim": a.sum(1), "count": m.sum(),
                                   "count_dim": m.sum(dim=-1), "cumsum": a.cumsum(1),
                                   "i32": a.int().sum(0), "nz": torch.count_nonzero(a, dim=1)},
                     [i(3, 4), b(3, 4)]),
    "max_min": (lambda x: {"max": x.max(), "max_dim": x.max(dim=1).values,
                           "max_idx": x.max(dim=1).indices,
                           "min_keep": torch.min(x, dim=-1, keepdim=True)[0],
                           "min_idx": torch.min(x, -1, True)[1], "argmax": x.argmax(dim=-1),
                           "argmax_all": x.argmax(), "argmin_keep": x.argmin(1, keepdim=True)},
                [grid(2, 5, 4)]),
    "statistics": (lambda x: {"std": x.std(dim=1), "var": x.var(), "std_all": x.std(),
                              "var0": x.var(dim=-1, unbiased=False),
                              "corr": torch.var(x, dim=(0, 1), correction=0, keepdim=True),
                              "std_keep": torch.std(x, 2, keepdim=True)}, [f(2, 3, 4)]),
    "norms": (lambda x: {"norm": x.norm(dim=-1), "norm_all": x.norm(),
                         "l1": x.norm(p=1, dim=1), "inf": torch.linalg.vector_norm(x, float("inf"),
                                                                                   dim=-1),
                         "p3": torch.linalg.vector_norm(x, 3, dim=(1, 2), keepdim=True),
                         "lse": torch.logsumexp(x, dim=1)}, [f(2, 3, 4)]),
    "cumsum_any_all": (lambda x: {"cumsum": torch.cumsum(x, dim=2), "cumsum0": x.cumsum(0),
                                  "any": (x > 1).any(dim=-1), "all": (x > -3).all(),
                                  "any_all": (x > 0).any(), "all_keep": (x > -1).all(1, True)},
                       [f(2, 3, 4)]),
    "norm_var_mean": (lambda x: {"linalg": torch.linalg.norm(x, dim=-1),
                                 "fro": torch.linalg.norm(x[0]), "l1": torch.linalg.norm(x, 1, -1),
                                 "var_mean0": torch.var_mean(x, dim=1)[0],
                                 "var_mean1": torch.var_mean(x, dim=1)[1],
                                 "std_mean": torch.std_mean(x, dim=(0, 2), keepdim=True)[0]},
                      [f(2, 3, 4)]),
    "sort_topk": (lambda x: {"topk_v": x.topk(2).values, "topk_i": x.topk(2).indices,
                             "small": torch.topk(x, 3, dim=0, largest=False)[0],
                             "sort_v": torch.sort(x, dim=1)[0],
                             "sort_desc": x.sort(descending=True)[0],
                             "argsort": x.argsort(dim=-1)}, [f(4, 6)]),
}


@pytest.mark.parametrize("case", sorted(REDUCTIONS))
def test_reductions(tmp_path, case):
    fn, specs = REDUCTIONS[case]
    check_case(tmp_path, fn, specs)


def _nan_inf(x):
    """x with NaN below -1.2 and -inf above 1.7 (x from grid: steps of 0.5 in [-2, 2])."""
    return torch.where(x < -1.2, float("nan"), torch.where(x > 1.7, float("-inf"), x))


CUMULATIVE = {
    "cumprod_float": (lambda x: {"dim1": torch.cumprod(x, 1), "neg": x.cumprod(-1),
                                 "first": torch.cumprod(x, dim=0),
                                 "f64": torch.cumprod(x, 2, dtype=torch.float64),
                                 "half": x.half().cumprod(1),
                                 "to_half": x.cumprod(1, dtype=torch.float16),
                                 "to_int": torch.cumprod(x * 3, -1, dtype=torch.int32),
                                 "scalar": x[0, 0, 0].cumprod(0)}, [f(2, 5, 4)]),
    # long sums: eager's CPU kernel adds float32 in float64 and rounds each prefix once
    "cumsum_float": (lambda x: {"s": x.cumsum(1), "s0": torch.cumsum(x, 0),
                                "half": x.half().cumsum(-1), "to_half": x.cumsum(1, dtype=torch.float16),
                                "f64": x.double().cumsum(1)}, [f(3, 1000)]),
    "cumprod_float64": (lambda x: {"p": x.cumprod(0), "p1": torch.cumprod(x, -1)},
                        [f(6, 3, dtype=torch.float64)]),
    # 24 factors below 100: the int64 product wraps around, as eager's
    "cumprod_integers": (lambda a, c, m: {"long": a.cumprod(1), "int32": torch.cumprod(c, -1),
                                          "int8": c.to(torch.int8).cumprod(0),
                                          "keep32": c.cumprod(1, dtype=torch.int32),
                                          "uint8": c.abs().to(torch.uint8).cumprod(1),
                                          "bool": m.cumprod(1),
                                          "to_float": a.cumprod(0, dtype=torch.float32)},
                         [i(3, 24, high=100), i(2, 24, dtype=torch.int32, high=100), b(3, 5)]),
    # zeros, ties, exact halves; NaN and -inf put in by where
    "cummax_cummin": (lambda x: {"max_v": torch.cummax(x, 1).values,
                                 "max_i": torch.cummax(x, 1).indices,
                                 "min_v": x.cummin(-1)[0], "min_i": x.cummin(-1)[1],
                                 "first_v": torch.cummax(x, dim=0)[0],
                                 "first_i": torch.cummin(x, 0)[1],
                                 "nan_v": torch.cummax(_nan_inf(x), 1)[0],
                                 "nan_i": torch.cummax(_nan_inf(x), 1)[1],
                                 "nan_min_v": torch.cummin(_nan_inf(x), -1)[0],
                                 "nan_min_i": torch.cummin(_nan_inf(x), -1)[1],
                                 "neg_zero": torch.cummin(-x, 2)[0], "half": x.half().cummax(2)[0],
                                 "half_i": x.half().cummin(1)[1]}, [grid(3, 6, 5)]),
    "cummax_integers": (lambda a, m: {"v": a.cummax(1)[0], "i": a.cummax(1)[1],
                                      "i32": a.int().cummin(0)[1],
                                      "i8": a.to(torch.int8).cummax(-1)[0],
                                      "bool_v": m.cummax(1)[0], "bool_i": m.cummax(1)[1],
                                      "bool_min": m.cummin(0)[1], "scalar": a[0, 0].cummax(0)[1],
                                      "f64": (a * 0.5).double().cummin(1)[0]},
                        [i(4, 7, high=3), b(4, 7)]),
}


@pytest.mark.parametrize("case", sorted(CUMULATIVE))
def test_cumulative_products_maxima_minima(tmp_path, case):
    """Bit-equal to eager: the product in eager's order and accumulator type (float32
    in float64), the indices of cummax / cummin the last position of the running
    extreme (ties), NaN sticking as eager's."""
    fn, specs = CUMULATIVE[case]
    check_case(tmp_path, fn, specs, exact=True)


def test_cummax_at_opset_14(tmp_path):
    """Below opset 18 ReduceMax / ReduceMin take their axes as attributes."""
    fn, specs = CUMULATIVE["cummax_cummin"]
    model = check_case(tmp_path, fn, specs, exact=True, opset=14)
    assert model.opset_import[0].version == 14


def test_reductions_at_opset_17(tmp_path):
    """Below opset 18 the Reduce* axes are attributes (ReduceSum's an input since 13)."""
    model = check_case(tmp_path, REDUCTIONS["sum_mean"][0], [f(2, 3, 4)], opset=17)
    means = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert means and all(len(n.input) == 1 for n in means)


# ---------------------------------------------------------------------------
# shapes and indexing

def _setitems(x, y):
    z = x.clone()
    z[:, 0] = 0.0
    z[0, 1:, 2] = y[0, 1:, 2]
    w = y.clone()
    w[w > 0] = 1.0
    u = torch.zeros(2, 3, 4)
    u[1] = x[0]
    v = x.clone()
    v[..., -1] += 2.0
    s = x.clone()
    s[:] = y  # every position in order (rsl-rl's exporter writes its state so)
    t = x.clone()
    t[:] = y[:, :1]  # every position, broadcast
    r = torch.zeros(3, 4)
    r[:] = y[:1]  # [1, 3, 4] into [3, 4]: torch drops the leading 1
    q = x.clone()
    q[1, 1:] = y[:1, 1:, :]  # [1, 2, 4] into [2, 4]
    return {"z": z, "w": w, "u": u, "v": v, "s": s * 2.0, "t": t + 1.0, "r": r - 1.0,
            "q": q * 3.0}


def _history(hist, obs):
    """An observation history shifted by one step (Isaac Lab's CircularBuffer as a cat)."""
    shifted = torch.cat([hist[:, 1:], obs.unsqueeze(1)], dim=1)
    return {"history": shifted, "flat": shifted.flatten(1), "last": shifted[:, -1]}


SHAPES = {
    "views": (lambda x: {"view": x.view(2, 12), "reshape": x.reshape(-1), "flat": torch.flatten(x, 1),
                         "unflatten": x.unflatten(2, (2, 2)), "unsq": x.unsqueeze(-1),
                         "sq": x[:1].squeeze(0), "sq_all": x[:1, :1].squeeze(),
                         "view_as": x.view_as(torch.zeros(4, 6)), "ravel": x.ravel()},
              [f(2, 3, 4)]),
    "permutations": (lambda x: {"permute": x.permute(2, 0, 1), "transpose": x.transpose(0, -1),
                                "mT": x.mT, "T": x[0].T, "t": x[0].t(),
                                "movedim": torch.movedim(x, 0, -1),
                                "swap": x.swapaxes(1, 2), "contig": x.transpose(1, 2).contiguous()},
                     [f(2, 3, 4)]),
    "expand_repeat": (lambda x: {"expand": x[:, :1].expand(2, 3, 4), "expand_neg": x[..., :1].expand(-1, -1, 5),
                                 "expand_as": x[:1].expand_as(x), "repeat": x.repeat(1, 2, 1),
                                 "repeat_more": x.repeat(2, 1, 1, 1), "tile": x.tile((2,)),
                                 "broadcast": torch.broadcast_to(x[0, 0], (3, 4)),
                                 "tensors0": torch.broadcast_tensors(x[0, :, :1], x[1, 0])[0],
                                 "tensors1": torch.broadcast_tensors(x[0, :, :1], x[1, 0])[1]},
                      [f(2, 3, 4)]),
    "flip_roll": (lambda x: {"flip": torch.flip(x, dims=[2]), "flip2": x.flip(0, -1),
                             "roll": x.roll(1, dims=1), "roll_neg": torch.roll(x, -2, 2),
                             "roll_flat": x.roll(3), "roll_two": x.roll((1, 1), (0, 2))},
                  [f(2, 3, 4)]),
    "cat_stack": (lambda x, y, n: {"cat": torch.cat([x, y], dim=-1), "cat0": torch.cat((x, y)),
                                   "cat_promote": torch.cat([x, n], dim=1),
                                   "stack": torch.stack([x, y]), "stack_neg": torch.stack([x, y], -1),
                                   "single": torch.cat([x]), "concat": torch.concat([y, x], 1)},
                  [f(2, 3), f(2, 3), i(2, 3)]),
    "splits": (lambda x: {"chunk0": x.chunk(2, -1)[0], "chunk1": torch.chunk(x, 2, dim=-1)[1],
                          "split": x.split([1, 2], dim=1)[1], "split_eq": x.split(2, -1)[1],
                          "unbind": torch.unbind(x, 0)[1], "unbind_last": x.unbind(-1)[3],
                          "tsplit": torch.tensor_split(x, 3, dim=1)[2],
                          "narrow": x.narrow(2, 1, 2), "narrow_neg": x.narrow(-1, -3, 2),
                          "select": x.select(1, -1)}, [f(2, 3, 4)]),
    "getitem_basic": (lambda x: {"int": x[0], "neg": x[-1, -1], "slice": x[:, 1:3],
                                 "step": x[..., ::2], "none": x[:, None], "ellipsis": x[..., 1],
                                 "mixed": x[1, :, None, 2:], "range": x[:, -2:, :-1],
                                 "clamped": x[:, 1:100], "empty_tail": x[0, ..., None]},
                      [f(2, 3, 4)]),
    "getitem_tensor": (lambda x, k: {"const_idx": x[:, torch.tensor([2, 0, 1])],
                                     "traced_idx": x[:, k], "traced_last": x[..., k],
                                     "list_idx": x[[1, 0]],
                                     "two_const": x[torch.tensor([0, 1]), torch.tensor([2, 0])],
                                     "const_mask": x[:, torch.tensor([True, False, True])],
                                     "index_select": torch.index_select(x, 2, k),
                                     "gather": torch.gather(x, 2, k.view(1, 1, 3).expand(2, 3, 3)),
                                     "take": torch.take_along_dim(x, k.view(1, 3, 1).expand(2, 3, 1),
                                                                  dim=2)},
                       [f(2, 3, 4), idx(3, 3)]),
    # the aten forms TorchScript records (a jit node written for the fused model)
    "aten_slice_index": (lambda x, k: {
        "slice": torch.ops.aten.slice.Tensor(x, 1, 1, 3),
        "step": torch.ops.aten.slice.Tensor(x, 2, 0, 2 ** 63 - 1, 2),
        "neg": torch.ops.aten.slice.Tensor(x, -1, -3, -1),
        "all": torch.ops.aten.slice.Tensor(x, 0, None, None),
        "past_end": torch.ops.aten.slice.Tensor(x, 1, 2, 100),
        "index": torch.ops.aten.index.Tensor(x, [None, k]),
        "index_last": torch.ops.aten.index.Tensor(x, [None, None, k]),
        "index_consts": torch.ops.aten.index.Tensor(x, [torch.tensor([0, 1]), None,
                                                        torch.tensor([2, 0])]),
        # a 0-dim index broadcasts (it does not select, as in Python's x[...]): the
        # separated index dims go to the front, (3, 3) here, not (3, 3) transposed
        "zero_dim": torch.ops.aten.index.Tensor(x, [k.remainder(2), None, k[0]]),
        "zero_dim_inner": torch.ops.aten.index.Tensor(  # (3, 3, 2) either way: values differ
            torch.cat([x, x[:1]]).view(3, 3, 2, 2), [None, k, None, k[0].remainder(2)]),
        "zero_dim_consts": torch.ops.aten.index.Tensor(
            torch.cat([x, x[:1]]).view(3, 3, 2, 2),
            [None, torch.tensor([1, 0, 2]), None, torch.tensor(1)])},
        [f(2, 3, 4), idx(3, 3)]),
    # k: int64 in [-3, 3), n: int32 in [-4, 4) (negative values count from the end),
    # j: int64 in [0, 4); eager's placement: adjacent index dims stay in place, index
    # dims separated by a slice or None put the broadcast dims in front
    "getitem_mixed": (lambda x, k, n, j: {
        "tensor_int": x[k, 2], "int_tensor": x[2, :, n], "tensor_slice": x[k, :, 1:3],
        "ellipsis": x[..., n], "neg_int": x[-1, k], "neg_ints": x[k, -2, -1],
        "two": x[k, n], "separated": x[k, :, j], "none_between": x[k, None, j],
        "none_first": x[None, k, :, j], "broadcast": x[k.view(3, 1), j], "adjacent": x[:, n, j],
        "slices_around": x[1:, n, ::2], "list": x[:, [0, 2, 1], k],
        "zero_dim": x[:, k[0]], "zero_dim_first": x[k[1], :, n],
        "const_mask": x[torch.tensor([True, False, True]), :, k[:2]],
        "three": x[k, j, n.view(3, 1)], "int32_alone": x.transpose(0, 1)[n],
        "half": x.half()[k, :, j]},
        [f(3, 4, 5), i(3, high=3), i(3, dtype=torch.int32, high=4), idx(4, 3)]),
    "setitem": (_setitems, [f(2, 3, 4), f(2, 3, 4)]),
    "masked": (lambda x, m: {"fill": x.masked_fill(x < 0, -1.0), "fill_m": x.masked_fill(m, 2.0),
                             "bool": (x > 0).masked_fill(m, True),
                             "int16": (x * 4).to(torch.int16).masked_fill(m, -3),
                             "where": torch.where(m, x, torch.zeros_like(x))},
               [f(3, 4), b(3, 4)]),
    "history": (_history, [f(2, 5, 3), f(2, 3)]),
    "diagonals": (lambda x, v, m: {
        "vec": torch.diag(v), "vec_up": torch.diag(v, 2), "vec_down": v.diag(-1),
        "mat": torch.diag(m), "mat_up": torch.diag(m, 1), "mat_down": m.diag(-2),
        "mat_outside": torch.diag(m, 6), "diagonal": torch.diagonal(x),
        "diagonal_off": torch.diagonal(x, 1, 0, 2), "diagonal_neg": x.diagonal(-1, -1, 0),
        "diagonal_swapped": torch.diagonal(x, offset=2, dim1=2, dim2=1),
        "embed": torch.diag_embed(m), "embed_off": torch.diag_embed(x, 1, 0, 2),
        "embed_neg": torch.diag_embed(m, -2, dim1=2, dim2=0), "flat": torch.diagflat(m),
        "flat_off": torch.diagflat(v, -1), "int": torch.diag(v.long() * 3),
        "bool": torch.diag(v > 0),
        "int16": torch.diag_embed(m.to(torch.int16)), "half": torch.diag(v.half(), 1),
        # infinities on the diagonal, zeros (not NaN) off it
        "inf": torch.diag(v / (v * 0))}, [f(2, 3, 4), f(4), f(3, 5)]),
    "likes": (lambda x: {"zeros": torch.zeros_like(x), "ones": torch.ones_like(x) * x,
                         "full": torch.full_like(x, 3.0), "new": x.new_zeros(2, 2),
                         "arange": x + torch.arange(4)}, [f(3, 4)]),
    "scatter_tril": (lambda x, k: {"scatter": torch.zeros(3, 4).scatter(1, k.view(3, 1), x[:, :1]),
                                   "scatter_add": x.scatter_add(1, k.view(3, 1), x[:, 1:2]),
                                   "tril": x.tril(), "triu": torch.triu(x, 1)},
                     [f(3, 4), idx(4, 3)]),
    "pad": (lambda x: {"constant": F.pad(x, (1, 2)), "value": F.pad(x, (0, 1, 2, 0), value=-1.5),
                       "reflect": F.pad(x[0], (2, 1), mode="reflect"),
                       "replicate": F.pad(x, (1, 1, 1, 0), mode="replicate"),
                       "circular": F.pad(x, (1, 2, 0, 1), mode="circular"),
                       "crop": F.pad(x, (-1, 1))}, [f(1, 3, 4, 5)]),
    # onnxruntime has no int16 Pad kernel: padded in int32
    "pad_int16": (lambda a: {"constant": F.pad(a, (1, 2), value=-7),
                             "reflect": F.pad(a[0], (2, 1), mode="reflect"),
                             "replicate": F.pad(a, (1, 1, 1, 0), mode="replicate")},
                  [i(1, 3, 4, 5, dtype=torch.int16)]),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_shapes_and_indexing(tmp_path, case):
    fn, specs = SHAPES[case]
    check_case(tmp_path, fn, specs, exact=True)


def test_views_write_static_shapes(tmp_path):
    """Reshape and Expand get eager's shape, never a -1 (a kept leading dimension may
    be a 0, copied from the input)."""
    model = check_case(tmp_path, lambda x: {"r": x.reshape(-1, 2), "e": x[:1].expand(-1, 4)},
                       [f(3, 4)])
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("Reshape", "Expand"):
            assert (consts[node.input[1]] >= 0).all(), node


def test_a_reshape_keeps_its_inputs_leading_dimensions_open(tmp_path):
    """A reshape copies the dimensions its input leads with and it keeps (0): the same
    model on the traced shapes, and one that steps a batch stacked on that axis (what
    the batched fused model does with an onnx node's file as the bundle holds it)."""
    fn = lambda x: {"flat": x.flatten(1), "view": x.view(1, 3, 2)}  # noqa: E731
    x = torch.randn(1, 2, 3)
    node = trace_node(tmp_path, fn, [x])
    module = info(node).graph_module.module
    model = onnx_writer.write_model("node", module, [x], ["in0"], ["flat", "view"],
                                    DEFAULT_OPSET)
    onnx.checker.check_model(model, full_check=True)
    consts = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    assert sorted(consts[n.input[1]] for n in model.graph.node
                  if n.op_type == "Reshape") == [[0, 3, 2], [0, 6]]
    for actual, expected in zip(run_model(model, {"in0": x}), fn(x).values()):
        assert torch.equal(torch.from_numpy(actual), expected)
    batch = torch.randn(3, 2, 3)  # three rows stacked on the leading axis
    batched = onnx.ModelProto()
    batched.CopyFrom(model)
    del batched.graph.value_info[:]
    for value in list(batched.graph.input) + list(batched.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "robots"
    session = ort.InferenceSession(batched.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    flat, view = session.run(["flat", "view"], {"in0": batch.numpy()})
    assert torch.equal(torch.from_numpy(flat), batch.flatten(1))
    assert torch.equal(torch.from_numpy(view), batch.view(3, 3, 2))


#: Rules written as compositions (ONNX has no CumProd, CumMax, LogAddExp, ...).
COMPOSED = {"logaddexp": ELEMENTWISE["logaddexp"], "diagonals": SHAPES["diagonals"],
            "getitem_mixed": SHAPES["getitem_mixed"], **CUMULATIVE}


@pytest.mark.parametrize("case", sorted(COMPOSED))
def test_composed_rules_use_tensorrt_ops(tmp_path, case):
    """Their ops are all in TensorRT's documented set (what `leapp check --deploy` lists)."""
    from leapp.compiling.tensorrt_ops import op_counts, outside
    fn, specs = COMPOSED[case]
    gen = torch.Generator().manual_seed(0)
    model = write_node(trace_node(tmp_path, fn, [s.draw(gen) for s in specs]))
    assert outside(op_counts(model)) == {}


# ---------------------------------------------------------------------------
# casts, comparisons, where

CASTS = {
    "to": (lambda x: {"f64": x.to(torch.float64), "double": x.double(), "int": (x * 10).int(),
                      "long": (x * 10).long(), "half_back": x.half().float(), "bool": x.bool(),
                      "type_as": (x * 3).type_as(torch.zeros(1, dtype=torch.int32)),
                      "kw": x.to(dtype=torch.float64), "byte": (x.abs() * 10).byte(),
                      "short": (x * 100).short(), "same": x.to(torch.float32),
                      "device": x.to("cpu")}, [f(3, 4)]),
    "comparisons": (lambda x, y: {"gt": x > y, "le": x <= 0.1, "eq": x == y, "ne": x != 0.5,
                                  "lt": torch.lt(x, y), "ge": x >= 0, "float": (x > 0).float(),
                                  "half_cmp": x.half() <= 0.1, "int_vs_float": x.long() > 0.5,
                                  "bool_eq": (x > 0) == (y > 0)}, [grid(4, 5), grid(4, 5)]),
    "logical": (lambda m, n, x: {"and": m & n, "or": m | n, "xor": m ^ n, "not": ~m,
                                 "land": torch.logical_and(m, x > 0),
                                 "lor": torch.logical_or(m, x), "lnot": torch.logical_not(x),
                                 "lxor": torch.logical_xor(m, n)},
                [b(3, 4), b(3, 4), grid(3, 4)]),
    "bitwise_ints": (lambda a, c: {"and": a & c, "or": a | c, "xor": a ^ c, "not": ~a},
                     [i(6, high=50), i(6, high=50)]),
    "where": (lambda m, x, n: {"w": torch.where(m, x, -x), "scalar": torch.where(m, x, 0.0),
                               "both_scalar": torch.where(m, 1.0, -1.0),
                               "promote": torch.where(m, n, x), "ints": torch.where(m, n, 7),
                               "half": torch.where(m, x.half(), x.half() * 2),
                               # no Where kernel in onnxruntime for these two
                               "int16": torch.where(m, n.short(), n.short() * 3),
                               "bool": torch.where(m, x > 0, n > 0)},
              [b(3, 4), f(3, 4), i(3, 4)]),
    "float_tests": (lambda x: {"isnan": torch.isnan(torch.log(x)), "isinf": torch.isinf(1 / x),
                               "isfinite": torch.isfinite(torch.log(x) / x)}, [grid(4, 5)]),
}


@pytest.mark.parametrize("case", sorted(CASTS))
def test_casts_comparisons_where(tmp_path, case):
    fn, specs = CASTS[case]
    check_case(tmp_path, fn, specs, exact=True)


# ---------------------------------------------------------------------------
# linear algebra and layers

torch.manual_seed(0)
_M = torch.randn(4, 5)
_LIN = nn.Linear(4, 6).eval()
_MLP = nn.Sequential(nn.Linear(48, 64), nn.ELU(), nn.Linear(64, 32), nn.ELU(),
                     nn.Linear(32, 12)).eval()
_LN = nn.LayerNorm(4).eval()
_BN = nn.BatchNorm2d(3).eval()
with torch.no_grad():
    _BN.running_mean.uniform_(-0.5, 0.5)
    _BN.running_var.uniform_(0.5, 1.5)
_CONV = nn.Conv2d(3, 4, 3, padding=1).eval()
_CONV_SAME = nn.Conv1d(3, 2, 4, padding="same", dilation=2).eval()
_CONV_GROUPS = nn.Conv2d(4, 4, 3, stride=2, groups=2, bias=False).eval()
_CONV_T = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1).eval()
_EMB = nn.Embedding(10, 3).eval()


def _quat_mul(q1, q2):
    w1, x1, y1, z1 = q1[:, 0], q1[:, 1], q1[:, 2], q1[:, 3]
    w2, x2, y2, z2 = q2[:, 0], q2[:, 1], q2[:, 2], q2[:, 3]
    ww = (z1 + x1) * (x2 + y2)
    yy = (w1 - y1) * (w2 + z2)
    zz = (w1 + y1) * (w2 - z2)
    xx = ww + yy + zz
    qq = 0.5 * (xx + (z1 - x1) * (x2 - y2))
    w = qq - ww + (z1 - y1) * (y2 - z2)
    x = qq - xx + (x1 + w1) * (x2 + w2)
    y = qq - yy + (w1 - x1) * (y2 + z2)
    z = qq - zz + (z1 + y1) * (w2 - x2)
    return torch.stack([w, x, y, z], dim=-1)


def _quat_apply(quat, vec):
    xyz = quat[:, 1:]
    t = xyz.cross(vec, dim=-1) * 2
    return vec + quat[:, 0:1] * t + xyz.cross(t, dim=-1)


def _quat_rotate_inverse(q, v):
    q_w = q[:, 0]
    q_vec = q[:, 1:]
    a = v * (2.0 * q_w ** 2 - 1.0).unsqueeze(-1)
    b_ = torch.cross(q_vec, v, dim=-1) * q_w.unsqueeze(-1) * 2.0
    c = q_vec * torch.bmm(q_vec.view(q.shape[0], 1, 3), v.view(q.shape[0], 3, 1)).squeeze(-1) * 2.0
    return a - b_ + c


def _yaw_quat(quat):
    q = F.normalize(quat, dim=-1)
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    yaw = torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    out = torch.zeros_like(q)
    out[:, 0] = torch.cos(yaw / 2)
    out[:, 3] = torch.sin(yaw / 2)
    return F.normalize(out, dim=-1)


def _isaac_terms(quat, vec, vel):
    q = quat / quat.norm(p=2, dim=-1, keepdim=True).clamp(min=1e-9)
    return {"apply": _quat_apply(q, vec), "rot_inv": _quat_rotate_inverse(q, vel),
            "mul": _quat_mul(q, q.flip(-1)), "yaw": _yaw_quat(quat),
            "heading": torch.atan2(vec[:, 1], vec[:, 0]),
            "wrap": torch.remainder(vec[:, 2] + math.pi, 2 * math.pi) - math.pi}


LAYERS = {
    "matmul": (lambda x, y, v: {"op": x @ _M, "mm": torch.mm(x[0], _M), "bmm": torch.bmm(x, y.transpose(1, 2)),
                                "vec": x @ v, "vecmat": v @ _M, "dot": torch.dot(v, v),
                                "outer": torch.outer(v, v), "einsum": torch.einsum("bij,jk->bik", x, _M),
                                "addmm": torch.addmm(torch.ones(5), x[0], _M, beta=0.5)},
               [f(2, 3, 4), f(2, 3, 4), f(4)]),
    "linear": (lambda x: {"F": F.linear(x, _M.T, torch.ones(5)), "nobias": F.linear(x[0], _M.T),
                          "module": _LIN(x), "module2d": _LIN(x[0])}, [f(2, 3, 4)]),
    "mlp_policy": (lambda obs: {"actions": _MLP((obs - 0.1) / 1.5)}, [f(1, 48)]),
    "norms": (lambda x, s: {"layer": F.layer_norm(s, (16,)), "module": _LN(s[..., :4]),
                            "batch": _BN(x), "group": F.group_norm(x, 3),
                            "group_affine": nn.GroupNorm(1, 3).eval()(x),
                            "normalize": F.normalize(s, dim=-1),
                            "normalize_l1": F.normalize(s, p=1.0, dim=1)},
              [f(1, 3, 6, 6), f(1, 3, 16)]),
    "conv": (lambda img, seq: {"conv": _CONV(img), "same": _CONV_SAME(seq),
                               "groups": _CONV_GROUPS(torch.cat([img, img[:, :1]], 1)),
                               "transposed": _CONV_T(img),
                               "conv1d": F.conv1d(seq, torch.ones(2, 3, 3), stride=2),
                               "unbatched": F.conv1d(seq[0], torch.ones(2, 3, 3))},
             [f(1, 3, 8, 8), f(1, 3, 16)]),
    "pooling": (lambda img, seq: {"max": F.max_pool2d(img, 2), "avg": F.avg_pool2d(img, 2),
                                  "ceil": F.max_pool2d(img, 3, stride=2, ceil_mode=True),
                                  "pad": F.avg_pool2d(img, 3, 1, 1),
                                  "pad_exclude": F.avg_pool2d(img, 3, 1, 1, count_include_pad=False),
                                  "adaptive": F.adaptive_avg_pool2d(img, (2, 2)),
                                  "global": F.adaptive_avg_pool2d(img, 1),
                                  "max1d": F.max_pool1d(seq, 2)}, [f(1, 3, 8, 8), f(1, 3, 16)]),
    # output sizes that do not divide the input: overlapping windows of two widths
    "adaptive_pooling": (lambda img, seq, vol: {
        "avg_11_to_2": F.adaptive_avg_pool2d(img, (2, 2)),
        "avg_11_to_3x4": F.adaptive_avg_pool2d(img, (3, 4)),
        "avg_one_axis": F.adaptive_avg_pool2d(img, (5, None)),
        "avg_unbatched": F.adaptive_avg_pool2d(img[0], 3),
        "avg_1d": F.adaptive_avg_pool1d(seq, 3),
        "avg_3d": F.adaptive_avg_pool3d(vol, (2, 3, 2)),
        "max_11_to_3x4": F.adaptive_max_pool2d(img, (3, 4)),
        "max_1d": F.adaptive_max_pool1d(seq, 4)},
        [f(2, 3, 11, 11), f(1, 2, 10), f(1, 2, 5, 4, 3)]),
    "interpolate": (lambda img: {"nearest": F.interpolate(img, scale_factor=2.0),
                                 "size": F.interpolate(img, size=(5, 7)),
                                 "bilinear": F.interpolate(img, size=(6, 10), mode="bilinear"),
                                 "aligned": F.interpolate(img, size=(6, 10), mode="bilinear",
                                                          align_corners=True)},
                    [f(1, 2, 4, 5)]),
    "attention": (lambda q, k, v, m: {
        "plain": F.scaled_dot_product_attention(q, k, v),
        "causal": F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "masked": F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        "additive": F.scaled_dot_product_attention(q, k, v, attn_mask=m.float() * -2.0,
                                                   scale=0.3)},
        [f(2, 3, 4), f(2, 3, 4), f(2, 3, 5), Spec((3, 3), torch.bool)]),
    "one_hot": (lambda k: {"one_hot": F.one_hot(k, 10), "float": F.one_hot(k, 10).float()},
                [idx(10, 2, 3)]),
    "embedding": (lambda k: {"emb": _EMB(k)}, [idx(10, 2, 3)]),
    "isaac_lab_terms": (_isaac_terms, [f(4, 4), f(4, 3), f(4, 3)]),
}


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_linear_algebra_and_layers(tmp_path, case):
    fn, specs = LAYERS[case]
    check_case(tmp_path, fn, specs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("where", ["first", "inside", "last"])
def test_max_pooling_keeps_eagers_nan(tmp_path, where):
    """A NaN anywhere in a window makes its max NaN, as eager's (onnxruntime's MaxPool
    only sees one that comes first); the same for the adaptive and global forms."""
    def fn(img, seq):
        return {"pool": F.max_pool2d(img, 2), "strided": F.max_pool2d(img, 3, 2, 1),
                "pool1d": F.max_pool1d(seq, 3), "adaptive": F.adaptive_max_pool2d(img, 3),
                "dividing": F.adaptive_max_pool2d(img, 2), "global": F.adaptive_max_pool2d(img, 1),
                "overlapping": F.adaptive_max_pool2d(img, (4, 5))}
    img, seq = torch.randn(1, 2, 6, 6), torch.randn(1, 2, 9)
    node = trace_node(tmp_path, fn, [img, seq])
    model = write_node(node)
    at = {"first": 0, "inside": 1, "last": 2}[where]
    img[0, 1, at, at] = img[0, 0, 4, 5] = seq[0, 1, at] = float("nan")
    got = run_model(model, {"in0": img, "in1": seq})
    want = fn(img, seq)
    for (key, expected), actual in zip(want.items(), got):
        assert torch.isnan(expected).any(), key
        assert torch.equal(torch.nan_to_num(torch.from_numpy(actual), 7.0),
                           torch.nan_to_num(expected, 7.0)), key


def test_adaptive_average_pooling_keeps_eagers_nan_and_float16(tmp_path):
    """Non-dividing windows: a NaN reaches the mean of each window holding it; float16
    averages are computed in float32 and rounded once, as eager's."""
    def fn(img, half):
        return {"avg": F.adaptive_avg_pool2d(img, 2), "half": F.adaptive_avg_pool2d(half, (3, 2))}
    img = torch.randn(1, 2, 7, 5)
    half = torch.randn(1, 2, 7, 5).half()
    node = trace_node(tmp_path, fn, [img, half])
    model = write_node(node)
    img[0, 1, 3, 2] = float("nan")
    got = run_model(model, {"in0": img, "in1": half})
    want = fn(img, half)
    assert torch.isnan(want["avg"]).any()
    for (key, expected), actual in zip(want.items(), got):
        actual = torch.from_numpy(actual)
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_variance_is_eagers_to_the_bit(tmp_path):
    """Eager's CPU kernel accumulates a float32 variance in float64; so does the rule."""
    fn = lambda x: {"var": x.var(1), "std": x.std(0), "var_all": x.var()}  # noqa: E731
    check_case(tmp_path, fn, [Spec((7, 33), kind="grid")], exact=False, rtol=0, atol=0)
    check_case(tmp_path / "b", lambda x: fn(x * 100 + 1000), [f(7, 33)], rtol=0, atol=0)


def test_layer_norm_at_opset_14(tmp_path):
    """LayerNormalization is an op from 17; below it the writer composes it."""
    model = check_case(tmp_path, lambda s: {"ln": _LN(s)}, [f(2, 3, 4)], opset=14)
    assert "LayerNormalization" not in {n.op_type for n in model.graph.node}


def test_linear_is_gemm(tmp_path):
    model = check_case(tmp_path, LAYERS["mlp_policy"][0], [f(1, 48)])
    assert [n.op_type for n in model.graph.node] == ["Sub", "Div", "Gemm", "Elu", "Gemm", "Elu",
                                                      "Gemm"]


# ---------------------------------------------------------------------------
# multi-head attention (nn.MultiheadAttention, transformer layers)

torch.manual_seed(2)
_MHA = nn.MultiheadAttention(16, 4, batch_first=True).eval()
_MHA_SEQ_FIRST = nn.MultiheadAttention(16, 2).eval()
_MHA_NO_BIAS = nn.MultiheadAttention(16, 2, bias=False, batch_first=True).eval()
_MHA_KV_DIMS = nn.MultiheadAttention(16, 2, kdim=6, vdim=10, batch_first=True).eval()
_MHA_F64 = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
_ENCODER = nn.TransformerEncoder(nn.TransformerEncoderLayer(
    16, 4, dim_feedforward=32, dropout=0.1, batch_first=True), 2,
    enable_nested_tensor=False).eval()
_ENCODER_PRE = nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, activation="gelu",
                                          norm_first=True, batch_first=True).eval()
_CAUSAL = nn.Transformer.generate_square_subsequent_mask(5)


def _first_key_shown(mask):
    """mask with its first key visible.  Outside a trace, eager's nn.MultiheadAttention
    without weights takes torch's fused kernel, which gives NaN where every key is
    hidden; the traced call (the path the bundle exports) gives zeros there, like
    scaled_dot_product_attention.  The test below covers those rows."""
    return torch.cat([torch.zeros(mask.shape[0], 1, dtype=torch.bool), mask[:, 1:]], 1)


def _mha_one(a, w):
    return {"out": a, "weights": w} if w is not None else {"out": a}


MHA_CASES = {
    # self-attention, weights averaged over the heads (nn.MultiheadAttention's default)
    "self": (lambda t: _mha_one(*_MHA(t, t, t)), [f(2, 5, 16)]),
    "per_head_weights": (lambda t: _mha_one(*_MHA(t, t, t, average_attn_weights=False)),
                         [f(2, 5, 16)]),
    # no weights: eager goes through scaled_dot_product_attention
    "no_weights": (lambda t: _mha_one(*_MHA(t, t, t, need_weights=False)), [f(3, 4, 16)]),
    "padding_mask": (lambda t, m: _mha_one(*_MHA(t, t, t, key_padding_mask=m)),
                     [f(2, 5, 16), b(2, 5)]),
    "padding_mask_no_weights": (
        lambda t, m: _mha_one(*_MHA(t, t, t, key_padding_mask=_first_key_shown(m),
                                    need_weights=False)), [f(2, 5, 16), b(2, 5)]),
    "additive_padding": (lambda t, m: _mha_one(*_MHA(t, t, t, key_padding_mask=m)),
                         [f(2, 5, 16), f(2, 5)]),
    "bool_attn_mask": (lambda t, m: _mha_one(*_MHA(t, t, t, attn_mask=m)),
                       [f(2, 5, 16), b(5, 5)]),
    "float_attn_mask_3d": (lambda t, m: _mha_one(*_MHA(t, t, t, attn_mask=m,
                                                      need_weights=False)),
                           [f(2, 5, 16), f(8, 5, 5)]),
    "both_masks": (lambda t, m, k: _mha_one(*_MHA(t, t, t, attn_mask=m, key_padding_mask=k)),
                   [f(2, 5, 16), f(5, 5), f(2, 5)]),
    "causal": (lambda t: _mha_one(*_MHA(t, t, t, attn_mask=_CAUSAL, is_causal=True,
                                        need_weights=False)), [f(2, 5, 16)]),
    "causal_with_weights": (lambda t: _mha_one(*_MHA(t, t, t, attn_mask=_CAUSAL,
                                                     is_causal=True)), [f(2, 5, 16)]),
    # cross-attention: key is value (one packed product), then three different tensors
    "cross": (lambda q, kv: _mha_one(*_MHA(q, kv, kv)), [f(2, 3, 16), f(2, 6, 16)]),
    "three_tensors": (lambda q, k, v: _mha_one(*_MHA(q, k, v, need_weights=False)),
                      [f(2, 3, 16), f(2, 6, 16), f(2, 6, 16)]),
    "kv_dims": (lambda q, k, v: _mha_one(*_MHA_KV_DIMS(q, k, v)),
                [f(2, 3, 16), f(2, 4, 6), f(2, 4, 10)]),
    "sequence_first": (lambda t: _mha_one(*_MHA_SEQ_FIRST(t, t, t)), [f(5, 2, 16)]),
    "unbatched": (lambda t, m: _mha_one(*_MHA(t, t, t, key_padding_mask=m)),
                  [f(5, 16), b(5)]),
    "unbatched_per_head": (lambda t: _mha_one(*_MHA(t, t, t, average_attn_weights=False)),
                           [f(5, 16)]),
    "no_bias": (lambda t: _mha_one(*_MHA_NO_BIAS(t, t, t)), [f(2, 5, 16)]),
    "float64": (lambda t: _mha_one(*_MHA_F64(t, t, t)), [f(2, 3, 8, dtype=torch.float64)]),
    # transformer layers in evaluation: their attention is the rule above
    "encoder": (lambda t, m: {"out": _ENCODER(t, src_key_padding_mask=_first_key_shown(m))},
                [f(2, 5, 16), b(2, 5)]),
    "encoder_norm_first": (lambda t: {"out": _ENCODER_PRE(t)}, [f(2, 5, 16)]),
}


@pytest.mark.parametrize("case", sorted(MHA_CASES))
def test_multi_head_attention(tmp_path, case):
    fn, specs = MHA_CASES[case]
    model = check_case(tmp_path, fn, specs, rtol=1e-4, atol=1e-5)
    assert "Softmax" in {n.op_type for n in model.graph.node}


def _traced_path(t, mask, need_weights):
    """F.multi_head_attention_forward as nn.MultiheadAttention calls it in a trace."""
    s = t.transpose(0, 1)
    out, weights = F.multi_head_attention_forward(
        s, s, s, 16, 4, _MHA.in_proj_weight, _MHA.in_proj_bias, None, None, False, 0.0,
        _MHA.out_proj.weight, _MHA.out_proj.bias, training=False,
        key_padding_mask=torch.zeros(mask.shape).masked_fill(mask, float("-inf")),
        need_weights=need_weights)
    return out.transpose(0, 1), weights


def test_a_padding_mask_hiding_every_key_gives_the_traced_nans_and_zeros(tmp_path):
    """Every key of robot 1 masked: the weights path gives NaN rows, the
    scaled_dot_product_attention path zeros (then the output projection's bias)."""
    def fn(t, m):
        a, w = _MHA(t, t, t, key_padding_mask=m)
        a2, _ = _MHA(t, t, t, key_padding_mask=m, need_weights=False)
        return {"a": a, "w": w, "a2": a2}
    mask = torch.tensor([[False, True, False], [True, True, True]])
    t = torch.randn(2, 3, 16)
    node = trace_node(tmp_path, fn, [t, mask])
    got = run_model(write_node(node), {"in0": t, "in1": mask})
    with torch.no_grad():
        a, w = _traced_path(t, mask, True)
        want = {"a": a, "w": w, "a2": _traced_path(t, mask, False)[0]}
    assert torch.isnan(want["w"][1]).all() and not torch.isnan(want["a2"]).any()
    for (key, expected), actual in zip(want.items(), got):
        torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=1e-4, atol=1e-5,
                                   equal_nan=True, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("where", [None, "query", "key", "value", "hidden_key", "hidden_value",
                                   "infinite_query", "minus_infinite_query"])
def test_attention_keeps_eagers_nan(tmp_path, where):
    """NaN in a query, a key or a value, shown or hidden by the mask (row 1 hides every
    key: zeros, unless a NaN reaches it): the same NaN as eager's, the same numbers."""
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, False]])
    additive = torch.zeros(3, 3).masked_fill(~mask, float("-inf"))

    def fn(q, k, v):
        return {"plain": F.scaled_dot_product_attention(q, k, v),
                "bool": F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                "additive": F.scaled_dot_product_attention(q, k, v, attn_mask=additive),
                "causal": F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    node = trace_node(tmp_path, fn, [torch.randn(2, 3, 4) for _ in range(3)])
    model = write_node(node)
    inputs = [torch.randn(2, 3, 4) for _ in range(3)]
    at = {"query": (0, (1, 0, 2)), "key": (1, (0, 0, 1)), "value": (2, (1, 2, 3)),
          "hidden_key": (1, (0, 1, 0)), "hidden_value": (2, (0, 1, 0)),
          "infinite_query": (0, (1, 2, 0)), "minus_infinite_query": (0, (0, 0, 0))}.get(where)
    if at is not None:
        inputs[at[0]][at[1]] = float("nan")
    if where and where.endswith("infinite_query"):  # keys of one sign: scores all +-inf
        inputs[1] = inputs[1].abs() + 0.5
        inputs[0][at[1]] = float("-inf") if where.startswith("minus") else float("inf")
    got = run_model(model, {f"in{n}": t for n, t in enumerate(inputs)})
    want = fn(*inputs)
    assert (where in (None, "minus_infinite_query")) != any(torch.isnan(w).any()
                                                            for w in want.values())
    for (key, expected), actual in zip(want.items(), got):
        actual = torch.from_numpy(actual)
        assert torch.equal(torch.isnan(actual), torch.isnan(expected)), key
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_multi_head_attention_in_float16_is_refused(tmp_path):
    """Eager rounds every step to float16; the rule computes in float32 or float64 only."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True).half().eval()
    node = trace_node(tmp_path, lambda t: {"y": mha(t, t, t)[0]},
                      [torch.randn(1, 3, 8).half()])
    with pytest.raises(onnx_writer.NoRule, match="multi-head attention in torch.float16"):
        write_node(node)


# ---------------------------------------------------------------------------
# recurrent cells

torch.manual_seed(1)
_GRU = nn.GRU(5, 7, num_layers=2, batch_first=True).eval()
_GRU_BI = nn.GRU(5, 4, bidirectional=True).eval()
_LSTM = nn.LSTM(5, 6, num_layers=2).eval()
_LSTM_BF = nn.LSTM(5, 6, batch_first=True).eval()
_RNN = nn.RNN(5, 3, nonlinearity="relu").eval()
_GRU_CELL = nn.GRUCell(5, 7).eval()
_LSTM_CELL = nn.LSTMCell(5, 6).eval()
_GRU_NOBIAS = nn.GRU(5, 3, bias=False).eval()


def _gru(seq, h):
    out, hn = _GRU(seq, h)
    return {"out": out, "hn": hn}


def _lstm(seq, h, c):
    out, (hn, cn) = _LSTM(seq, (h, c))
    out2, (hn2, cn2) = _LSTM_BF(seq.transpose(0, 1), (h[:1], c[:1]))
    return {"out": out, "hn": hn, "cn": cn, "out_bf": out2, "hn_bf": hn2, "cn_bf": cn2}


RECURRENT = {
    "gru_two_layers": (_gru, [f(2, 4, 5), f(2, 2, 7)]),
    "gru_bidirectional": (lambda s, h: dict(zip(("out", "hn"), _GRU_BI(s, h))),
                          [f(4, 2, 5), f(2, 2, 4)]),
    "gru_no_bias": (lambda s: dict(zip(("out", "hn"), _GRU_NOBIAS(s))), [f(4, 1, 5)]),
    "lstm": (_lstm, [f(3, 2, 5), f(2, 2, 6), f(2, 2, 6)]),
    "rnn_relu": (lambda s, h: dict(zip(("out", "hn"), _RNN(s, h))), [f(4, 2, 5), f(1, 2, 3)]),
    "cells": (lambda x, h, c: {"gru": _GRU_CELL(x, h), "gru_zero": _GRU_CELL(x),
                               "lstm_h": _LSTM_CELL(x, (h[:, :6], c))[0],
                               "lstm_c": _LSTM_CELL(x, (h[:, :6], c))[1],
                               "unbatched": _GRU_CELL(x[0], h[0])},
              [f(2, 5), f(2, 7), f(2, 6)]),
}


@pytest.mark.parametrize("case", sorted(RECURRENT))
def test_recurrent(tmp_path, case):
    fn, specs = RECURRENT[case]
    check_case(tmp_path, fn, specs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(RECURRENT))
def test_recurrent_layers_keep_eagers_nan(tmp_path, case):
    """A NaN in the input at one step, in an initial hidden state or in an LSTM's initial
    cell state: the same NaN as eager's (onnxruntime's kernels give finite numbers
    there), the same values elsewhere."""
    fn, specs = RECURRENT[case]
    gen = torch.Generator().manual_seed(5)
    node = trace_node(tmp_path, fn, [s.draw(gen) for s in specs])
    model = write_node(node)
    tried = 0
    for k, spec in enumerate(specs):
        for position in (0, spec.shape[-1] + 1, -1):  # first, second row, last
            inputs = [s.draw(gen) for s in specs]
            inputs[k].view(-1)[position] = float("nan")
            want = _as_dict(fn(*inputs))
            got = run_model(model, {f"in{n}": t for n, t in enumerate(inputs)})
            for (key, expected), actual in zip(want.items(), got):
                actual = torch.from_numpy(actual)
                assert torch.equal(torch.isnan(actual), torch.isnan(expected)), (k, position, key)
                torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5,
                                           equal_nan=True)
            tried += int(any(torch.isnan(v).any() for v in want.values()))
    assert tried >= len(specs)


def test_gru_is_one_onnx_node_per_layer(tmp_path):
    model = check_case(tmp_path, _gru, [f(2, 4, 5), f(2, 2, 7)])
    grus = [n for n in model.graph.node if n.op_type == "GRU"]
    assert len(grus) == 2
    assert all(a.i == 1 for n in grus for a in n.attribute if a.name == "linear_before_reset")


# ---------------------------------------------------------------------------
# the catalogue the other backends' tests use


def test_op_catalogue_through_the_writer(tmp_path):
    from op_catalogue import GROUPS
    for group, (inputs, fn) in GROUPS.items():
        specs = [Spec(tuple(t.shape), t.dtype) for t in inputs]
        check_case(tmp_path / group, fn, specs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group", ["arith", "shapes", "index", "functional"])
def test_backend_catalogue_through_the_writer(tmp_path, group):
    """tests/test_backends.py's catalogue (run there through every backend)."""
    import test_backends
    ops, _ = test_backends.GROUPS[group]
    raw = test_backends._group_inputs(group)
    specs = [idx(2, *t.shape) if name == "i" else Spec(tuple(t.shape), t.dtype)
             for name, t in raw.items()]
    check_case(tmp_path, lambda *a: {op: fn(*a) for op, fn in ops.items()}, specs, rtol=1e-4,
               atol=1e-5)


# ---------------------------------------------------------------------------
# refusals


def test_a_call_without_a_rule_is_named(tmp_path):
    node = trace_node(tmp_path, lambda x: {"y": torch.sinc(x) + 1}, [torch.randn(3)])
    with pytest.raises(onnx_writer.NoRule, match=r"torch\.sinc"):
        write_node(node)


def test_float64_without_an_onnxruntime_kernel_is_refused(tmp_path):
    """onnxruntime has no float64 Elu: refused (a fallback), not a model that fails to load."""
    node = trace_node(tmp_path, lambda x: {"y": F.elu(x.double())}, [torch.randn(3)])
    with pytest.raises(onnx_writer.NoRule, match="Elu on float64"):
        write_node(node)


@pytest.mark.parametrize("key", ["new_tensor", "full_like"])
def test_a_made_tensor_with_data_from_the_inputs_is_refused(tmp_path, key):
    """x.new_tensor(y) and full_like(x, y.sum()) take their values from the node's
    inputs: refused (torch's exporter then), not written as the traced values."""
    fn = {"new_tensor": lambda x, y: {"z": x.new_tensor(y) + x},
          "full_like": lambda x, y: {"z": torch.full_like(x, y.sum()) * x}}[key]
    node = trace_node(tmp_path, fn, [torch.randn(2, 3), torch.randn(2, 3)])
    with pytest.raises(onnx_writer.NoRule, match="a value computed from the node's inputs"):
        write_node(node)


def test_a_constant_of_mixed_zeros_keeps_their_signs(tmp_path):
    """[0.0, -0.0] is not one value: concatenated to the data it is written as it is, so
    1 / it gives +inf and -inf as eager does (not an Expand of its first zero)."""
    zeros = torch.tensor([[0.0, -0.0]])
    check_case(tmp_path, lambda x: {"y": 1.0 / torch.cat([x, zeros], 0)}, [f(1, 2)],
               exact=True)


@pytest.mark.parametrize("key", ["mask", "mask_and_index"])
def test_a_traced_boolean_mask_is_refused(tmp_path, key):
    fn = {"mask": lambda x, k: {"y": x[:, k > 0]},
          "mask_and_index": lambda x, k: {"y": x[k[:1], k > 0]}}[key]
    node = trace_node(tmp_path, fn, [torch.randn(3, 3), torch.tensor([1, -1, 1])])
    with pytest.raises(onnx_writer.NoRule, match="data-dependent"):
        write_node(node)


# ---------------------------------------------------------------------------
# the backend


def _compile(tmp_path: Any, fn: Callable, inputs: list[torch.Tensor], export_with: str,
             graph: str = "g") -> tuple[str, str]:
    names = [f"in{k}" for k in range(len(inputs))]
    leapp.start(name=graph, save_path=str(tmp_path))
    traced = annotate.input_tensors("node", dict(zip(names, inputs)))
    traced = traced if isinstance(traced, tuple) else (traced,)
    annotate.output_tensors("node", _as_dict(fn(*traced)), export_with=export_with)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"node": True}
    bundle = os.path.join(str(tmp_path), graph)
    with open(os.path.join(bundle, "log.txt"), encoding="utf-8") as handle:
        log = handle.read()
    return bundle, log


def _policy(obs, hist):
    return {"actions": _MLP(torch.cat([obs, hist.flatten(1)], -1)[:, :48]),
            "hist": torch.cat([hist[:, 1:], obs[:, None, :16]], 1)}


@pytest.mark.parametrize("export_with", ["onnx", "onnx-dynamo"])
def test_onnx_backends_use_the_writer(tmp_path, export_with):
    inputs = [torch.randn(1, 40), torch.randn(1, 3, 16)]
    bundle, log = _compile(tmp_path, _policy, inputs, export_with)
    assert FALLBACK not in log
    model = onnx.load(os.path.join(bundle, "node.onnx"))
    assert model.producer_name == "leapp"
    assert [v.name for v in model.graph.input] == ["in0", "in1"]
    assert [v.name for v in model.graph.output] == ["actions", "hist"]
    assert [p.key for p in model.metadata_props] == ["leapp_contract"]
    # the opset torch's exporter would choose in this environment (17 under torch 2.7)
    from torch.onnx import _constants
    assert model.opset_import[0].version == _constants.ONNX_DEFAULT_OPSET
    with open(os.path.join(bundle, "g.yaml"), encoding="utf-8") as handle:
        entry = yaml.safe_load(handle)["models"]["node"]
    assert entry["parameters"]["opset_version"] == _constants.ONNX_DEFAULT_OPSET
    got = run_model(model, {"in0": inputs[0], "in1": inputs[1]})
    with torch.no_grad():
        want = _policy(*inputs)
    for value, expected in zip(got, want.values()):
        torch.testing.assert_close(torch.from_numpy(value), expected, rtol=1e-5, atol=1e-6)


_NO_EXPORTER = """
import sys, tempfile, torch, leapp
from leapp import annotate
leapp.start(name="g", save_path=tempfile.mkdtemp())
x = annotate.input_tensors("node", {"x": torch.randn(1, 4)})
annotate.output_tensors("node", {"y": torch.tanh(x) * 2}, export_with="onnx-dynamo")
leapp.stop()
assert leapp.compile_graph(visualize=False) == {"node": True}
print(sorted(m for m in sys.modules if m.split(".")[0] in ("onnxscript", "onnx_ir")
             or m.startswith("torch.onnx")))
"""


def test_a_written_node_imports_no_torch_exporter(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p]), TQDM_DISABLE="1")
    env.pop(onnx_writer.ENV, None)
    done = subprocess.run([sys.executable, "-c", _NO_EXPORTER], capture_output=True, text=True,
                          cwd=str(tmp_path), env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_fallback_is_named_in_log_and_summary(tmp_path, caplog):
    bundle, log = _compile(tmp_path, lambda x, y: {"y": torch.sinc(x) * y},
                           [torch.randn(2, 3), torch.randn(2, 3)], "onnx-dynamo")
    assert FALLBACK in log and "torch.sinc" in log
    progress = [line for line in log.splitlines() if "1/1 node" in line]
    assert progress and "torch's exporter: no ONNX rule for torch.sinc" in progress[0]
    assert onnx.load(os.path.join(bundle, "node.onnx")).producer_name == "pytorch"


def test_a_written_model_onnxruntime_cannot_load_falls_back(tmp_path, monkeypatch):
    """A rule writing an op onnxruntime has no kernel for (here a stand-in tanh through
    an int16 Pad): the node goes to torch's exporter, named, and validates."""
    from leapp.compiling.onnx_writer import emit

    def unloadable(call):
        e, x = call.e, call.args[0]
        padded = e.op("Pad", [e.cast(x.name, torch.float32, torch.int16), e.ints([0] * 4)])
        return e.cast(padded, torch.int16, torch.float32)
    monkeypatch.setitem(emit.RULES, "tanh", unloadable)
    bundle, log = _compile(tmp_path, lambda x: {"y": torch.tanh(x)}, [torch.randn(2, 3)],
                           "onnx-dynamo")
    assert FALLBACK in log and "onnxruntime cannot load the written model" in log
    assert onnx.load(os.path.join(bundle, "node.onnx")).producer_name == "pytorch"


def test_the_suites_writer_census_counts_written_and_fallback_nodes(tmp_path):
    """The count the test run's summary prints: one node written, one sent to torch."""
    _compile(tmp_path / "a", lambda x: {"y": torch.tanh(x)}, [torch.randn(2, 3)], "onnx")
    _compile(tmp_path / "b", lambda x: {"y": torch.logit(x) * 2},  # no rule: torch's
             [torch.rand(2, 3) * 0.8 + 0.1], "onnx-dynamo")
    written, fallbacks = writer_census(str(tmp_path))
    assert written == 1
    assert [bundle for bundle, _ in fallbacks] == [os.path.join("b", "g")]
    assert "torch.logit" in fallbacks[0][1]


def _yaml_without_digests(bundle: str) -> str:
    with open(os.path.join(bundle, "g.yaml"), encoding="utf-8") as handle:
        return "".join(line for line in handle if "sum:" not in line)


def test_env_forces_torch_exporter_with_the_same_yaml(tmp_path, monkeypatch):
    """LEAPP_ONNX_WRITER=torch: torch's exporter, the same YAML (digests aside) and model
    interface; compiled into the same bundle, the writer's file is not reused."""
    inputs = [torch.randn(1, 40), torch.randn(1, 3, 16)]
    bundle, log = _compile(tmp_path, _policy, inputs, "onnx")
    assert FALLBACK not in log
    ours_yaml = _yaml_without_digests(bundle)
    ours = onnx.load(os.path.join(bundle, "node.onnx"))
    assert ours.producer_name == "leapp"
    monkeypatch.setenv(onnx_writer.ENV, "torch")
    bundle, log = _compile(tmp_path, _policy, inputs, "onnx")
    assert FALLBACK not in log  # chosen, not a fallback
    assert "reused" not in " ".join(line for line in log.splitlines() if "1/1 node" in line)
    theirs = onnx.load(os.path.join(bundle, "node.onnx"))
    assert theirs.producer_name == "pytorch"
    assert _yaml_without_digests(bundle) == ours_yaml
    for a, c in ((ours.graph.input, theirs.graph.input), (ours.graph.output, theirs.graph.output)):
        assert [(v.name, v.type) for v in a] == [(v.name, v.type) for v in c]
    # the writer writes the opset the YAML states; torch 2.7's dynamo exporter writes 18
    # when asked for fewer (17 is its default there), later releases what they are asked
    with open(os.path.join(bundle, "g.yaml"), encoding="utf-8") as handle:
        stated = yaml.safe_load(handle)["models"]["node"]["parameters"]["opset_version"]
    assert [(o.domain, o.version) for o in ours.opset_import] == [("", stated)]
    release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    allowed = [[("", stated)]] + ([[("", 18)]] if release < (2, 8) else [])
    assert [(o.domain, o.version) for o in theirs.opset_import] in allowed


# ---------------------------------------------------------------------------
# every example node and the rsl-rl-lib exports, without a fallback


def _load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"writer_example_{name}",
                                                  os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLES = ["getting_started", "complete_pipeline", "feedback_example", "method_node",
            "module_buffers", "state_tensors", "stateful_gru_export"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_node_goes_through_the_writer(tmp_path, name):
    """Each example runs as shipped; then every node it traced is written by the writer
    (no call without a rule) and reproduces the node's traced outputs in onnxruntime."""
    torch.manual_seed(0)
    _load_example(name).main(str(tmp_path))
    nodes = _core.nodes()
    assert nodes
    for node in nodes.values():
        model = write_node(node)
        names, _ = deduplicate_names(node.name, [p.name for p in node.inputs],
                                     [p.name for p in node.outputs])
        got = run_model(model, {name: p.value for name, p in zip(names, node.inputs)})
        for port, value in zip(node.outputs, got):
            torch.testing.assert_close(torch.from_numpy(value), port.value.detach(),
                                       rtol=1e-5, atol=1e-6, msg=f"{name}/{node.name}")


def test_stateful_gru_example_with_the_onnx_backend(tmp_path):
    bundle = _load_example("stateful_gru_export").main(str(tmp_path), export_with="onnx")
    with open(os.path.join(bundle, "log.txt"), encoding="utf-8") as handle:
        assert FALLBACK not in handle.read()


@pytest.mark.parametrize("memory", [None, "gru", "lstm"])
def test_rsl_rl_exports_need_no_fallback(tmp_path, memory):
    import contextlib
    import test_rsl_rl
    with contextlib.contextmanager(test_rsl_rl.jit_disabled.__wrapped__)():
        yaml_path = test_rsl_rl.export_actor_critic(str(tmp_path), memory,
                                                    reset_between_steps=memory == "lstm")
    with open(os.path.join(os.path.dirname(yaml_path), "log.txt"), encoding="utf-8") as handle:
        assert FALLBACK not in handle.read()
    for name in ("actor", "critic"):
        model = onnx.load(os.path.join(os.path.dirname(yaml_path), f"{name}.onnx"))
        assert model.producer_name == "leapp"


def test_rl_games_export_needs_no_fallback(tmp_path):
    """rl_games' LSTM player (tests/test_client_exports.py) through the onnx backend: its
    torch.distributions calls (broadcast_tensors) and LSTM are written by the writer."""
    pytest.importorskip("rl_games")
    import test_client_exports
    path = test_client_exports.export_rl_games(str(tmp_path), "onnx")
    bundle = path if os.path.isdir(path) else os.path.dirname(path)
    with open(os.path.join(bundle, "log.txt"), encoding="utf-8") as handle:
        assert FALLBACK not in handle.read()
