"""Export backends through the public API, checked in their real runtimes.

A catalogue of torch operations, grouped into a few nodes, is traced once and
exported with every backend (jit, jit-trace, onnx, onnx-torchscript, pt2); the
saved files are loaded with torch.jit.load / onnxruntime / torch.export.load
and compared with the eager results.  Then recurrent modules, backend_params
errors, ONNX port renaming for state ports, bring-your-own-model, and one ONNX
pipeline's YAML against upstream leapp's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import leapp
from leapp import annotate

from op_catalogue import GROUPS as SHARED_GROUPS

BACKENDS = ["jit", "jit-trace", "onnx", "onnx-torchscript", "pt2"]
from support import upstream_python  # noqa: E402

UPSTREAM_PYTHON = upstream_python() or "/nonexistent/upstream-python"


# ---------------------------------------------------------------------------
# the operation catalogue


def _modules() -> dict:
    torch.manual_seed(1234)
    mods = {
        "linear": torch.nn.Linear(8, 5),
        "conv2d": torch.nn.Conv2d(4, 6, 3, padding=1),
        "conv1d": torch.nn.Conv1d(4, 3, 3, stride=2),
        "bn": torch.nn.BatchNorm2d(4),
        "ln": torch.nn.LayerNorm(8),
        "gn": torch.nn.GroupNorm(2, 4),
    }
    with torch.no_grad():
        mods["bn"].running_mean.uniform_(-0.5, 0.5)
        mods["bn"].running_var.uniform_(0.5, 1.5)
    for mod in mods.values():
        mod.eval()
    return mods


MODS = _modules()
W = torch.randn(4, 5, generator=torch.Generator().manual_seed(7))

def _inplace_operators(x, y):
    z = x * 1.0
    z += y
    z *= 2.0
    z /= 4.0
    z **= 2
    z -= 1.0
    return z


def _inplace_methods(x, y):
    z = y * 1.0
    z.add_(x)
    z.mul_(0.5)
    z.clamp_(-1.0, 1.0)
    return z


ARITH = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / (y.abs() + 1.0),
    "radd": lambda x, y: 2.0 + x,
    "rsub": lambda x, y: 1.0 - x,
    "rmul": lambda x, y: 3.0 * y,
    "rdiv": lambda x, y: 1.0 / (x.abs() + 1.0),
    "pow": lambda x, y: x ** 2,
    "rpow": lambda x, y: 2.0 ** x,
    "neg": lambda x, y: -x,
    "abs": lambda x, y: torch.abs(x),
    "exp": lambda x, y: torch.exp(x),
    "log": lambda x, y: (x.abs() + 1.0).log(),
    "sqrt": lambda x, y: torch.sqrt(y.abs()),
    "rsqrt": lambda x, y: torch.rsqrt(y.abs() + 1.0),
    "sin": lambda x, y: torch.sin(x),
    "cos": lambda x, y: x.cos(),
    "tanh": lambda x, y: torch.tanh(x),
    "sigmoid": lambda x, y: torch.sigmoid(y),
    "clamp": lambda x, y: x.clamp(-0.5, 0.5),
    "minimum": lambda x, y: torch.minimum(x, y),
    "maximum": lambda x, y: torch.maximum(x, y),
    "where": lambda x, y: torch.where(x > 0, x, y),
    "floor": lambda x, y: torch.floor(x * 3.0),
    "ceil": lambda x, y: (y * 3.0).ceil(),
    "sign": lambda x, y: torch.sign(x),
    "atan2": lambda x, y: torch.atan2(x, y.abs() + 0.1),
    "lerp": lambda x, y: torch.lerp(x, y, 0.25),
    "reciprocal": lambda x, y: (y.abs() + 1.0).reciprocal(),
    "square": lambda x, y: x.square(),
    "gt": lambda x, y: x > y,
    "le_scalar": lambda x, y: x <= 0.1,
    "logical_and": lambda x, y: torch.logical_and(x > 0, y > 0),
    "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.5),
    "inplace_operators": _inplace_operators,
    "inplace_methods": _inplace_methods,
}

SHAPES = {
    "sum": lambda x, y: x.sum(),
    "sum_dim": lambda x, y: x.sum(dim=1),
    "mean_keepdim": lambda x, y: x.mean(dim=-1, keepdim=True),
    "amax": lambda x, y: x.amax(dim=0),
    "amin": lambda x, y: torch.amin(y, dim=2),
    "max_dim": lambda x, y: x.max(dim=1).values,
    "argmax": lambda x, y: x.argmax(dim=-1),
    "prod": lambda x, y: (y * 0.5 + 1.0).prod(dim=2),
    "std": lambda x, y: x.std(dim=1),
    "var": lambda x, y: torch.var(y, dim=0),
    "norm": lambda x, y: torch.linalg.vector_norm(x, dim=-1),
    "cumsum": lambda x, y: torch.cumsum(x, dim=2),
    "logsumexp": lambda x, y: torch.logsumexp(y, dim=1),
    "reshape": lambda x, y: x.reshape(6, 4) + 1.0,
    "view": lambda x, y: y.view(2, 12) * 2.0,
    "flatten": lambda x, y: torch.flatten(x, 1) - 1.0,
    "permute": lambda x, y: x.permute(2, 0, 1) * 1.5,
    "transpose": lambda x, y: y.transpose(1, 2) + 0.5,
    "unsqueeze": lambda x, y: x.unsqueeze(1) * 2.0,
    "squeeze": lambda x, y: x[:, :1].squeeze(1) + 1.0,
    "expand": lambda x, y: x[:, :, :1].expand(2, 3, 5) + 0.0,
    "repeat": lambda x, y: y.repeat(1, 2, 1),
    "flip": lambda x, y: torch.flip(x, dims=[2]),
    "roll": lambda x, y: torch.roll(y, 1, dims=1),
    "tril": lambda x, y: torch.tril(x[0]),
    "triu": lambda x, y: y[1].triu(1),
    "t": lambda x, y: x[0].t() * 1.0,
    "T": lambda x, y: y[1].T * 1.0,
    "matmul": lambda x, y: x @ W,
    "bmm": lambda x, y: torch.bmm(x, y.transpose(1, 2)),
    "einsum": lambda x, y: torch.einsum("bij,bkj->bik", x, y),
    "cat": lambda x, y: torch.cat([x, y], dim=1),
    "stack": lambda x, y: torch.stack([x, y], dim=0),
    "chunk": lambda x, y: torch.chunk(x, 2, dim=2)[1] * 1.0,
    "split": lambda x, y: torch.split(y, [1, 2], dim=1)[1] * 1.0,
}


def _setitem(x, y, i):
    z = x.clone()
    z[:, 0] = y[:, 0]
    return z


def _setitem_scalar(x, y, i):
    z = y * 1.0
    z[..., 1:3] = 0.0
    return z


INDEX = {
    "index_int": lambda x, y, i: x[0] * 1.0,
    "slice": lambda x, y, i: x[:, 1:3] * 1.0,
    "slice_step": lambda x, y, i: y[..., ::2] + 0.0,
    "none_index": lambda x, y, i: x[:, None] * 1.0,
    "neg_index": lambda x, y, i: y[-1, -2:] * 1.0,
    "adv_index": lambda x, y, i: x[i] * 1.0,
    "gather": lambda x, y, i: torch.gather(y, 2, i.view(2, 1, 1).expand(2, 3, 1)),
    "index_select": lambda x, y, i: torch.index_select(x, 1, i),
    "masked_fill": lambda x, y, i: x.masked_fill(y > 0, 0.0),
    "setitem": _setitem,
    "setitem_scalar": _setitem_scalar,
    "to_double": lambda x, y, i: x.to(torch.float64) * 2.0,
    "to_int": lambda x, y, i: (y * 10.0).int(),
    "long_to_float": lambda x, y, i: i.float() + 0.5,
    "to_bool": lambda x, y, i: (x > 0).to(torch.int32),
    "type_as": lambda x, y, i: i.type_as(x) * 2.0,
    "zeros_like": lambda x, y, i: torch.zeros_like(x) + y,
    "ones_like": lambda x, y, i: torch.ones_like(y) * x,
    "full_like": lambda x, y, i: torch.full_like(x, 3.0) - y,
    "arange": lambda x, y, i: x + torch.arange(4, dtype=torch.float32),
}

FUNCTIONAL = {
    "relu": lambda x: F.relu(x),
    "gelu": lambda x: F.gelu(x),
    "silu": lambda x: F.silu(x),
    "elu": lambda x: F.elu(x),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "softplus": lambda x: F.softplus(x),
    "hardtanh": lambda x: F.hardtanh(x),
    "softmax": lambda x: F.softmax(x, dim=1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "normalize": lambda x: F.normalize(x, dim=1),
    "layer_norm": lambda x: MODS["ln"](x),
    "batch_norm": lambda x: MODS["bn"](x),
    "group_norm": lambda x: MODS["gn"](x),
    "linear": lambda x: MODS["linear"](x),
    "conv2d": lambda x: MODS["conv2d"](x),
    "conv1d": lambda x: MODS["conv1d"](x.flatten(2)),
    "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 1),
    "pad": lambda x: F.pad(x, (1, 1, 2, 0)),
    "interpolate": lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"),
    "dropout_eval": lambda x: F.dropout(x, 0.5, training=False) * 1.0,
}

GROUPS = {
    "arith": (ARITH, ("x", "y")),
    "shapes": (SHAPES, ("x", "y")),
    "index": (INDEX, ("x", "y", "i")),
    "functional": (FUNCTIONAL, ("x",)),
}


def _group_inputs(group: str) -> dict:
    gen = torch.Generator().manual_seed(99)
    if group == "functional":
        return {"x": torch.randn(2, 4, 8, 8, generator=gen)}
    inputs = {"x": torch.randn(2, 3, 4, generator=gen), "y": torch.randn(2, 3, 4, generator=gen)}
    if group == "index":
        inputs["i"] = torch.tensor([1, 0], dtype=torch.int64)
    return inputs


def test_catalogue_size():
    assert sum(len(ops) for ops, _ in GROUPS.values()) >= 60


# ---------------------------------------------------------------------------
# helpers


def _load_yaml(bundle: str, graph: str) -> dict:
    """The bundle's YAML: one mapping with models, pipeline, system information."""
    with open(os.path.join(bundle, f"{graph}.yaml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def run_saved(path: str, backend: str, inputs: list) -> list:
    """Run a saved model file in its own runtime; returns a list of tensors."""
    if backend == "jit":
        result = torch.jit.load(path)(*inputs)
    elif backend == "onnx":
        import onnxruntime as ort
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        result = [torch.from_numpy(r) for r in
                  session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})]
    elif backend == "pt2":
        result = torch.export.load(path).module()(*inputs)
    else:
        raise AssertionError(backend)
    if isinstance(result, torch.Tensor):
        result = [result]
    return list(result)


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert tuple(got.shape) == tuple(want.shape), f"{name}: {got.shape} != {want.shape}"
    if want.dtype == torch.bool or not want.is_floating_point():
        assert torch.equal(got.to(want.dtype), want), name
    else:
        assert got.dtype == want.dtype, f"{name}: {got.dtype} != {want.dtype}"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


# ---------------------------------------------------------------------------
# the catalogue through every backend


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group", list(GROUPS))
def test_catalogue(tmp_path, backend, group):
    ops, names = GROUPS[group]
    raw = _group_inputs(group)
    with torch.no_grad():
        eager = {op: fn(*raw.values()) for op, fn in ops.items()}
    leapp.start(name="cat", save_path=str(tmp_path))
    traced = annotate.input_tensors(group, dict(raw))
    traced = traced if isinstance(traced, tuple) else (traced,)
    outs = {op: fn(*traced) for op, fn in ops.items()}
    annotate.output_tensors(group, outs, export_with=backend)
    leapp.stop()
    result = leapp.compile_graph(visualize=False, rtol=1e-4, atol=1e-5)
    assert result == {group: True}

    bundle = tmp_path / "cat"
    entry = _load_yaml(str(bundle), "cat")["models"][group]
    yaml_backend = {"jit": "jit", "jit-trace": "jit", "onnx": "onnx",
                    "onnx-torchscript": "onnx", "pt2": "pt2"}[backend]
    assert entry["parameters"]["backend"] == yaml_backend
    assert [p["name"] for p in entry["inputs"]] == list(names)
    assert [p["name"] for p in entry["outputs"]] == list(ops)
    path = bundle / entry["parameters"]["model_path"]
    assert path.suffix == {"jit": ".pt", "onnx": ".onnx", "pt2": ".pt2"}[yaml_backend]
    got = run_saved(str(path), yaml_backend, [raw[n] for n in names])
    assert len(got) == len(ops)
    for (op, want), value in zip(eager.items(), got):
        _assert_close(f"{backend}/{op}", value, want)
    if yaml_backend == "onnx":
        import onnx
        proto = onnx.load(str(path))
        assert [v.name for v in proto.graph.input] == list(names)
        assert [v.name for v in proto.graph.output] == list(ops)
        assert entry["parameters"]["opset_version"] == torch.onnx._constants.ONNX_DEFAULT_OPSET
    if yaml_backend == "pt2":
        assert entry["parameters"]["torch_version"] == str(torch.__version__)


@pytest.mark.parametrize("backend", ["onnx", "onnx-torchscript", "pt2"])
@pytest.mark.parametrize("group", sorted(SHARED_GROUPS))
def test_shared_catalogue(request, tmp_path, backend, group):
    """tests/op_catalogue.py (run through jit by test_ops_jit.py) in the other runtimes."""
    if (group, backend) == ("arithmetic", "onnx-torchscript"):
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="torch's TorchScript ONNX exporter rounds float floor_divide "
            "(x // 0.5) toward zero; validation reports the floordiv mismatch"))
    inputs, fn = SHARED_GROUPS[group]
    names = [f"in{i}" for i in range(len(inputs))]
    leapp.start(name="shared", save_path=str(tmp_path))
    traced = annotate.input_tensors("node", dict(zip(names, inputs)))
    traced = traced if isinstance(traced, tuple) else (traced,)
    annotate.output_tensors("node", fn(*traced), export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False, rtol=1e-4, atol=1e-5) == {"node": True}
    with torch.no_grad():
        eager = fn(*inputs)
    entry = _load_yaml(str(tmp_path / "shared"), "shared")["models"]["node"]
    kept = [p["name"] for p in entry["inputs"]]
    runtime = "pt2" if backend == "pt2" else "onnx"
    got = run_saved(str(tmp_path / "shared" / entry["parameters"]["model_path"]), runtime,
                    [t for n, t in zip(names, inputs) if n in kept])
    assert [p["name"] for p in entry["outputs"]] == list(eager)
    for (op, want), value in zip(eager.items(), got):
        _assert_close(f"{backend}/{op}", value, want)


# ---------------------------------------------------------------------------
# recurrent modules through onnx-torchscript


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_recurrent_onnx_torchscript(tmp_path, kind):
    torch.manual_seed(3)
    cls = torch.nn.GRU if kind == "gru" else torch.nn.LSTM
    rnn = cls(input_size=5, hidden_size=7, num_layers=2, batch_first=True).eval()
    seq = torch.randn(1, 4, 5)
    h0 = torch.randn(2, 1, 7)
    c0 = torch.randn(2, 1, 7)
    with torch.no_grad():
        if kind == "gru":
            want_out, want_h = rnn(seq, h0)
            wants = [want_out, want_h]
        else:
            want_out, (want_h, want_c) = rnn(seq, (h0, c0))
            wants = [want_out, want_h, want_c]
    leapp.start(name="rnn", save_path=str(tmp_path))
    if kind == "gru":
        s, h = annotate.input_tensors("rnn", {"seq": seq, "h0": h0})
        out, hn = rnn(s, h)
        annotate.output_tensors("rnn", {"out": out, "hn": hn}, export_with="onnx-torchscript")
        feed = [seq, h0]
    else:
        s, h, c = annotate.input_tensors("rnn", {"seq": seq, "h0": h0, "c0": c0})
        out, (hn, cn) = rnn(s, (h, c))
        annotate.output_tensors("rnn", {"out": out, "hn": hn, "cn": cn},
                                export_with="onnx-torchscript")
        feed = [seq, h0, c0]
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"rnn": True}
    got = run_saved(str(tmp_path / "rnn" / "rnn.onnx"), "onnx", feed)
    for name, value, want in zip(["out", "hn", "cn"], got, wants):
        _assert_close(name, value, want)


# ---------------------------------------------------------------------------
# backend_params and export_with errors


def _one_node(tmp_path, **kwargs):
    leapp.start(name="err", save_path=str(tmp_path))
    x = annotate.input_tensors("node", {"x": torch.randn(2, 3)})
    try:
        annotate.output_tensors("node", {"y": x * 2.0}, **kwargs)
    finally:
        leapp.stop()


@pytest.mark.parametrize("backend,good", [
    ("onnx", ["opset_version", "optimize", "report", "verify"]),
    ("onnx-torchscript", ["opset_version", "prescript", "report"]),
    ("pt2", ["strict"]),
])
def test_unknown_backend_param_names_accepted_keys(tmp_path, backend, good):
    with pytest.raises(ValueError) as info:
        _one_node(tmp_path, export_with=backend, backend_params={"bogus": 1})
    message = str(info.value)
    assert "node" in message and "bogus" in message
    for key in good:
        assert key in message


def test_unknown_export_with_lists_values(tmp_path):
    with pytest.raises(ValueError) as info:
        _one_node(tmp_path, export_with="tensorflow")
    message = str(info.value)
    assert "tensorflow" in message
    for value in ("jit-script", "jit-trace", "onnx-dynamo", "onnx-torchscript",
                  "exported-program"):
        assert value in message


@pytest.mark.parametrize("params,checks", [
    (None, [False]),                          # validation checks the traced model
    ({"check_trace": True}, [False, True]),   # torch's own check, when asked for
])
def test_jit_trace_runs_torchs_check_only_when_asked(tmp_path, monkeypatch, params, checks):
    real, seen = torch.jit.trace, []

    def trace(*args, **kwargs):
        seen.append(kwargs.get("check_trace", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.jit, "trace", trace)
    leapp.start(name="trace_check", save_path=str(tmp_path))
    x = annotate.input_tensors("a", {"x": torch.randn(2, 3)})
    annotate.output_tensors("a", {"y": torch.tanh(x) * 2.0}, export_with="jit-trace",
                            backend_params=params)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"a": True}
    assert seen == checks


def test_backend_params_are_forwarded(tmp_path):
    leapp.start(name="params", save_path=str(tmp_path))
    x = annotate.input_tensors("a", {"x": torch.randn(2, 3)})
    annotate.output_tensors("a", {"y": torch.relu(x) * 2.0}, export_with="onnx-torchscript",
                            backend_params={"opset_version": 17, "prescript": True})
    x = annotate.input_tensors("b", {"x": torch.randn(2, 3)})
    annotate.output_tensors("b", {"y": x.exp()}, export_with="onnx",
                            backend_params={"opset_version": 18, "optimize": False})
    x = annotate.input_tensors("c", {"x": torch.randn(2, 3)})
    annotate.output_tensors("c", {"y": x.sin()}, export_with="pt2",
                            backend_params={"strict": False})
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True, "c": True}
    import onnx
    models = _load_yaml(str(tmp_path / "params"), "params")["models"]
    assert models["a"]["parameters"]["opset_version"] == 17
    assert models["b"]["parameters"]["opset_version"] == 18
    opsets = {o.domain: o.version for o in onnx.load(str(tmp_path / "params" / "a.onnx"))
              .opset_import}
    assert opsets[""] == 17


# ---------------------------------------------------------------------------
# state ports: <name>_in / <name>_out in ONNX nodes


def _state_pipeline(tmp_path, backend, steps=3, extra_input=None):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).eval()
    leapp.start(name="state", save_path=str(tmp_path), max_cached_io=3)
    h = torch.zeros(1, 4)
    actions = []
    for step in range(steps):
        obs = torch.randn(1, 4)
        x = annotate.input_tensors("pre", {"obs": obs})
        feat = annotate.output_tensors("pre", {"feat": x * 2.0 + 1.0}, export_with=backend)
        inputs = {"feat": feat}
        if extra_input:
            inputs[extra_input] = torch.ones(1, 4)
        traced = annotate.input_tensors("rnn", inputs)
        f = traced[0] if isinstance(traced, tuple) else traced
        hh = annotate.state_tensors("rnn", {"h": h})
        nh = torch.tanh(lin(f) + hh)
        if extra_input:
            nh = nh + traced[1] * 0.0
        annotate.update_state("rnn", {"h": nh})
        act = annotate.output_tensors("rnn", {"action": nh * 0.5}, export_with=backend)
        actions.append(act)
        h = nh
    leapp.stop()
    return lin


@pytest.mark.parametrize("backend", ["onnx", "onnx-torchscript"])
def test_state_port_renamed_in_onnx(tmp_path, backend):
    _state_pipeline(tmp_path, backend)
    assert leapp.compile_graph(visualize=False) == {"pre": True, "rnn": True}
    bundle = tmp_path / "state"
    doc = _load_yaml(str(bundle), "state")
    rnn = doc["models"]["rnn"]
    assert [p["name"] for p in rnn["inputs"]] == ["feat", "h_in"]
    assert [p["name"] for p in rnn["outputs"]] == ["action", "h_out"]
    pipe = doc["pipeline"]
    assert pipe["data_flow"] == {"pre/feat": ["rnn/feat"]}
    assert pipe["feedback_flow"] == {"rnn/h_out": ["rnn/h_in"]}
    assert pipe["inputs"] == {"pre": ["obs"]}
    assert pipe["outputs"] == {"rnn": ["action"]}
    from safetensors.torch import load_file
    initial = load_file(str(bundle / pipe["initial_values"]))
    assert list(initial) == ["rnn/h_in"]
    assert torch.equal(initial["rnn/h_in"], torch.zeros(1, 4))
    import onnx
    proto = onnx.load(str(bundle / "rnn.onnx"))
    assert [v.name for v in proto.graph.input] == ["feat", "h_in"]
    assert [v.name for v in proto.graph.output] == ["action", "h_out"]


def test_state_port_not_renamed_in_jit(tmp_path):
    _state_pipeline(tmp_path, "jit")
    assert leapp.compile_graph(visualize=False) == {"pre": True, "rnn": True}
    doc = _load_yaml(str(tmp_path / "state"), "state")
    rnn = doc["models"]["rnn"]
    assert [p["name"] for p in rnn["inputs"]] == ["feat", "h"]
    assert doc["pipeline"]["feedback_flow"] == {"rnn/h": ["rnn/h"]}


def test_state_port_rename_clash_is_an_error(tmp_path):
    _state_pipeline(tmp_path, "onnx-torchscript", steps=1, extra_input="h_in")
    with pytest.raises(ValueError, match=r"h_in"):
        leapp.compile_graph(visualize=False)


# ---------------------------------------------------------------------------
# ONNX export details: dropped inputs, in-memory model


def test_onnx_dropped_input_is_reported(tmp_path, caplog):
    """y only feeds zeros_like: the torchscript exporter folds it away."""
    x0, y0 = torch.randn(2, 3), torch.randn(2, 3)
    leapp.start(name="drop", save_path=str(tmp_path))
    x, y = annotate.input_tensors("node", {"x": x0, "y": y0})
    annotate.output_tensors("node", {"z": x * 2.0 + torch.zeros_like(y)},
                            export_with="onnx-torchscript")
    leapp.stop()
    with caplog.at_level("INFO", logger="leapp"):
        result = leapp.compile_graph(visualize=False)
    assert result == {"node": True}
    assert "[node] ONNX export optimized away 1 inputs: ['y']" in caplog.text
    doc = _load_yaml(str(tmp_path / "drop"), "drop")
    assert [p["name"] for p in doc["models"]["node"]["inputs"]] == ["x"]
    assert doc["pipeline"]["inputs"] == {"node": ["x"]}
    import onnx
    proto = onnx.load(str(tmp_path / "drop" / "node.onnx"))
    assert [v.name for v in proto.graph.input] == ["x"]
    got = run_saved(str(tmp_path / "drop" / "node.onnx"), "onnx", [x0])
    _assert_close("z", got[0], x0 * 2.0)


@pytest.mark.parametrize("fault", ["invalid", "checker"])
def test_onnx_check_failures_are_warnings_naming_the_node(tmp_path, caplog, monkeypatch, fault):
    """Faults planted in onnx.checker: a model it finds invalid and a checker that itself
    fails are both said at WARNING, naming the node and what failed; the node still
    exports and validates."""
    import onnx.checker

    def check_model(path, *args, **kwargs):
        if fault == "invalid":
            raise onnx.checker.ValidationError("planted: Field 'type' of 'value_info' is required")
        raise OSError("planted: the checker cannot read the file")

    monkeypatch.setattr(onnx.checker, "check_model", check_model)
    leapp.start(name="checked", save_path=str(tmp_path))
    x = annotate.input_tensors("node", {"x": torch.randn(2, 3)})
    annotate.output_tensors("node", {"z": x * 2.0}, export_with="onnx-torchscript")
    leapp.stop()
    with caplog.at_level("WARNING", logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"node": True}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
                and "ONNX model validation warning" in r.getMessage()]
    prefix = "ONNX model validation warning (model still saved): [node] "
    want = {"invalid": prefix + "node.onnx breaks an ONNX rule: planted: Field 'type' of "
                                "'value_info' is required",
            "checker": prefix + "the ONNX checker could not check node.onnx (OSError: planted: "
                                "the checker cannot read the file); onnxruntime's validation "
                                "of the node still runs"}[fault]
    assert warnings == [want]


@pytest.mark.parametrize("backend", ["onnx", "onnx-torchscript"])
def test_onnx_output_names_that_shadow_op_names(tmp_path, backend):
    """Outputs named like the exporter's own values, a passthrough and a duplicate."""
    x0 = torch.randn(2, 3)
    leapp.start(name="names", save_path=str(tmp_path))
    x = annotate.input_tensors("node", {"x": x0})
    doubled = x * 2.0
    annotate.output_tensors("node", {"mul": x + 1.0, "add": doubled, "same": doubled,
                                     "gt": x > 0, "mul_1": x.clone()}, export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"node": True}
    got = run_saved(str(tmp_path / "names" / "node.onnx"), "onnx", [x0])
    for value, want in zip(got, [x0 + 1.0, x0 * 2.0, x0 * 2.0, x0 > 0, x0]):
        _assert_close("output", value, want)


def test_onnx_model_takes_numpy_views():
    from leapp.models.onnx_runner import _to_numpy
    t = torch.randn(3, 4)
    assert np.shares_memory(_to_numpy(t), t.numpy())
    strided = t.t()
    assert _to_numpy(strided).flags["C_CONTIGUOUS"]


# ---------------------------------------------------------------------------
# bring your own model


class _Affine(torch.nn.Module):
    def forward(self, x):
        return x * 3.0 - 1.0


def _byom_pipeline(tmp_path, backend_params, name="byom"):
    x0 = torch.randn(2, 3)
    leapp.start(name=name, save_path=str(tmp_path / "bundles"))
    x = annotate.input_tensors("own", {"x": x0})
    annotate.output_tensors("own", {"y": x * 3.0 - 1.0}, export_with=None,
                            backend_params=backend_params)
    leapp.stop()
    return x0


def _make_model(directory, suffix):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"affine{suffix}"
    example = (torch.randn(2, 3),)
    module = _Affine().eval()
    if suffix == ".pt":
        torch.jit.script(module).save(str(path))
    elif suffix == ".onnx":
        torch.onnx.export(module, example, str(path), dynamo=False, input_names=["x"],
                          output_names=["y"])
    else:
        torch.export.save(torch.export.export(module, example), str(path))
    return path


@pytest.mark.parametrize("suffix,backend", [(".pt", "jit"), (".onnx", "onnx"), (".pt2", "pt2")])
def test_byom_outside_bundle_is_copied(tmp_path, suffix, backend, caplog):
    path = _make_model(tmp_path / "bundles" / "models", suffix)
    _byom_pipeline(tmp_path, {"model_path": str(path)})
    with caplog.at_level("INFO", logger="leapp"):
        result = leapp.compile_graph(visualize=False)
    assert result == {"own": True}
    assert "[PASS] own passed validation (1 example)" in caplog.text
    bundle = tmp_path / "bundles" / "byom"
    params = _load_yaml(str(bundle), "byom")["models"]["own"]["parameters"]
    assert params["backend"] == backend
    # the bundle is self-contained: InferenceManager refuses paths leaving it
    assert params["model_path"] == f"affine{suffix}"
    import hashlib
    assert params["sha256sum"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (bundle / f"affine{suffix}").read_bytes() == path.read_bytes()
    assert "lies outside the bundle directory: copied into the bundle" in caplog.text
    assert f"- own: {bundle / f'affine{suffix}'}" in caplog.text
    from leapp.running.inference_manager import InferenceManager
    manager = InferenceManager(str(bundle / "byom.yaml"))
    x = torch.randn(2, 3)
    torch.testing.assert_close(manager({"own/x": x})["own/y"], x * 3.0 - 1.0)


def test_byom_inside_bundle_is_referenced(tmp_path, caplog):
    path = _make_model(tmp_path / "bundles" / "byom" / "models", ".pt")
    _byom_pipeline(tmp_path, {"model_path": str(path)})
    with caplog.at_level("INFO", logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"own": True}
    bundle = tmp_path / "bundles" / "byom"
    params = _load_yaml(str(bundle), "byom")["models"]["own"]["parameters"]
    assert params["model_path"] == "models/affine.pt"
    assert not (bundle / "affine.pt").exists()
    assert f"- own: {path}" in caplog.text  # the artifact summary names the real file
    from leapp.running.inference_manager import InferenceManager
    InferenceManager(str(bundle / "byom.yaml"))


def test_byom_copy_original_model_false_keeps_reference(tmp_path, caplog):
    path = _make_model(tmp_path / "bundles" / "models", ".pt")
    _byom_pipeline(tmp_path, {"model_path": str(path), "copy_original_model": False})
    with caplog.at_level("INFO", logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"own": True}
    bundle = tmp_path / "bundles" / "byom"
    params = _load_yaml(str(bundle), "byom")["models"]["own"]["parameters"]
    assert params["model_path"] == "../models/affine.pt"
    assert not (bundle / "affine.pt").exists()
    assert "allow_external_paths=True" in caplog.text
    from leapp.running.inference_manager import InferenceManager
    with pytest.raises(ValueError, match="outside the bundle directory"):
        InferenceManager(str(bundle / "byom.yaml"))
    InferenceManager(str(bundle / "byom.yaml"), allow_external_paths=True)


def test_byom_copy_original_model(tmp_path):
    path = _make_model(tmp_path / "elsewhere", ".pt")
    _byom_pipeline(tmp_path, {"model_path": str(path), "copy_original_model": True})
    assert leapp.compile_graph(visualize=False) == {"own": True}
    bundle = tmp_path / "bundles" / "byom"
    params = _load_yaml(str(bundle), "byom")["models"]["own"]["parameters"]
    assert params["model_path"] == "affine.pt"
    assert (bundle / "affine.pt").read_bytes() == path.read_bytes()


def test_byom_wrong_model_fails_validation(tmp_path):
    path = tmp_path / "models" / "identity.pt"
    path.parent.mkdir()
    torch.jit.script(torch.nn.Identity()).save(str(path))
    _byom_pipeline(tmp_path, {"model_path": str(path)})
    assert leapp.compile_graph(visualize=False, strict=False) == {"own": False}


def test_byom_unknown_suffix(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"0")
    _byom_pipeline(tmp_path, {"model_path": str(path)})
    with pytest.raises(ValueError, match=r"Unsupported model file suffix: \.tflite"):
        leapp.compile_graph(visualize=False)


def test_byom_missing_file(tmp_path):
    _byom_pipeline(tmp_path, {"model_path": str(tmp_path / "missing.pt")})
    with pytest.raises(FileNotFoundError, match="Model file not found at .*missing.pt"):
        leapp.compile_graph(visualize=False)


def test_byom_without_model_path(tmp_path, caplog):
    _byom_pipeline(tmp_path, None)
    with caplog.at_level("INFO", logger="leapp"):
        result = leapp.compile_graph(visualize=False)
    assert result == {"own": True}
    assert "No model path provided for own" in caplog.text
    assert "Model own does not have a compiled model. Skipping validation." in caplog.text
    params = _load_yaml(str(tmp_path / "bundles" / "byom"), "byom")["models"]["own"][
        "parameters"]
    assert params["model_path"] is None and params["md5sum"] is None
    assert params["sha256sum"] is None and params["backend"] is None
    assert sorted(os.listdir(tmp_path / "bundles" / "byom")) == [
        "byom.yaml", "byom_analytics.json", "log.txt"]


# ---------------------------------------------------------------------------
# one ONNX pipeline with a state port, against upstream leapp


UPSTREAM_SCRIPT = textwrap.dedent("""
    import sys, torch, leapp
    from leapp import annotate
    save_path = sys.argv[1]
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).eval()
    leapp.start(name="state", save_path=save_path, max_cached_io=3)
    h = torch.zeros(1, 4)
    for step in range(3):
        obs = torch.randn(1, 4)
        x = annotate.input_tensors("pre", {"obs": obs})
        feat = annotate.output_tensors("pre", {"feat": x * 2.0 + 1.0}, export_with="onnx")
        f = annotate.input_tensors("rnn", {"feat": feat})
        hh = annotate.state_tensors("rnn", {"h": h})
        nh = torch.tanh(lin(f) + hh)
        annotate.update_state("rnn", {"h": nh})
        annotate.output_tensors("rnn", {"action": nh * 0.5}, export_with="onnx")
        h = nh
    leapp.stop()
    leapp.compile_graph(visualize=False)
""")


def _without_checksums(value):
    """Checksums dropped; the implementation's own version (e.g. 0.7.2+c1) masked."""
    if isinstance(value, dict):
        return {k: "<version>" if k == "leapp version" else _without_checksums(v)
                for k, v in value.items() if k not in ("md5sum", "sha256sum")}
    if isinstance(value, list):
        return [_without_checksums(v) for v in value]
    return value


def _diff_keys(ours, theirs, path=""):
    """Every key path where the two documents differ (keys and key order included)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        problems = []
        if list(ours) != list(theirs):
            problems.append(f"{path}: keys {list(ours)} != {list(theirs)}")
        for key in ours:
            if key in theirs:
                problems += _diff_keys(ours[key], theirs[key], f"{path}/{key}")
        return problems
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        problems = []
        for i, (a, b) in enumerate(zip(ours, theirs)):
            problems += _diff_keys(a, b, f"{path}[{i}]")
        return problems
    return [] if ours == theirs else [f"{path}: {ours!r} != {theirs!r}"]


@pytest.mark.skipif(not os.path.exists(UPSTREAM_PYTHON), reason="upstream leapp venv missing")
def test_state_pipeline_yaml_matches_upstream(tmp_path):
    up_dir = tmp_path / "upstream"
    up_dir.mkdir()
    script = tmp_path / "upstream_state.py"
    script.write_text(UPSTREAM_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([UPSTREAM_PYTHON, str(script), str(up_dir)], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = _load_yaml(str(up_dir / "state"), "state")

    ours_dir = tmp_path / "ours"
    namespace = {"__name__": "__leapp_test__"}
    sys_argv = sys.argv
    try:
        sys.argv = ["upstream_state.py", str(ours_dir)]
        exec(compile(UPSTREAM_SCRIPT, "upstream_state.py", "exec"), namespace)
    finally:
        sys.argv = sys_argv
    ours = _load_yaml(str(ours_dir / "state"), "state")

    assert list(ours) == list(theirs) == ["models", "pipeline", "system information"]
    problems = _diff_keys(_without_checksums(ours), _without_checksums(theirs))
    assert not problems, json.dumps(problems, indent=1)
    from safetensors.torch import load_file
    name = ours["pipeline"]["initial_values"]
    ours_init = load_file(str(ours_dir / "state" / name))
    theirs_init = load_file(str(up_dir / "state" / name))
    assert list(ours_init) == list(theirs_init)
    for key in ours_init:
        assert torch.equal(ours_init[key], theirs_init[key])
