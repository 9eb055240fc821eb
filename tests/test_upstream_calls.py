"""Public calls that behave as upstream leapp 0.7.2 does.

Each scenario is one script using only the public API: it traces a small
pipeline, records what each annotated call gave (its outcome and values),
compiles the bundle and replays it with ``leapp.InferenceManager`` on inputs
other than the traced ones, next to the eager result.  It writes
``OUT/result.json``; the bundle is ``OUT/<graph>/<graph>.yaml``.

* (a) runs the script in this process with both the jit and the onnx
  backend and checks what it recorded: the calls succeed, the ports are the
  expected ones and the bundle computes what eager code computes.
* (b) runs the same script under this package and under upstream's
  interpreter (``compat.find_upstream_python()``, skipped when there is
  none) and requires the same outcomes, the same values and the same YAML
  (key by key, as bench/compat.py compares bundles).

The scenarios:

1. ``@annotate.method`` call shapes: keywords that skip a tensor default,
   keyword order, shared defaults, keyword-only arguments, ``*args`` and
   ``**kwargs``, bound methods, a method called through its class with self
   passed explicitly, a function under ``torch.no_grad()``.  Inputs are
   declared in call order; defaults not passed are constants of the node.
2. ``annotate.mirror_leapp_tags(tensor, ndarray)``: the returned array
   carries the tensor's provenance, so the node reading it is wired.
3. A declared input the node never reads, sharing memory with a buffer the
   node writes with ``copy_`` and returns: the input is trimmed and the node
   exports.
4. ``annotate.output_tensors`` gives back the payload's own values (nested
   dicts and lists, TensorSemantics references), as passed.
5. ``environment_constants`` naming a ``torch.jit.trace``-d module: the node
   exports, the traced module's ops inside it.

A first call of an ``@annotate.method`` function that raises leaves no
half-built node (upstream's next call fails with a duplicate-name error;
ours works), checked in this process only.
"""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch

import leapp
from leapp import annotate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402

UPSTREAM = compat.find_upstream_python()
OURS = compat.resolve_python(os.environ.get("LEAPP_OURS_PYTHON") or sys.executable)
TOL = 1e-5

PRELUDE = '''
import json, os, sys
import numpy as np
import torch
import leapp
from leapp import annotate

OUT, BACKEND = sys.argv[1], sys.argv[2]
RESULT = {"calls": [], "compile": None, "replay": []}


def lists(value):
    """value with tensors and arrays as nested lists (JSON)."""
    if isinstance(value, dict):
        return {str(k): lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [lists(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        return np.asarray(value).tolist()
    return value


def attempt(label, call):
    """Run one annotated call; record its outcome and value."""
    try:
        value = call()
    except Exception as exc:  # recorded, compared across implementations
        RESULT["calls"].append([label, type(exc).__name__, None])
        return None
    RESULT["calls"].append([label, "ok", lists(value)])
    return value


def fact(label, *truths):
    """Record facts about returned objects (identity, types): all must hold."""
    RESULT["calls"].append(["fact:" + label, "ok", [bool(t) for t in truths]])


def compile_and_replay(graph, feeds):
    """Compile; then run each (inputs, expected) through InferenceManager."""
    try:
        leapp.compile_graph(visualize=False)
        RESULT["compile"] = "ok"
    except Exception as exc:
        RESULT["compile"] = type(exc).__name__ + ": " + str(exc).splitlines()[0]
        return
    manager = leapp.InferenceManager(os.path.join(OUT, graph, graph + ".yaml"))
    for inputs, expected in feeds:
        got = manager.run_policy({k: torch.as_tensor(v).clone() for k, v in inputs.items()})
        step = {}
        for key, want in expected.items():
            if key not in got:
                step[key] = "missing"
                continue
            have = torch.as_tensor(np.asarray(got[key]) if isinstance(got[key], np.ndarray)
                                   else got[key]).detach().float()
            want = torch.as_tensor(np.asarray(want)).detach().float()
            step[key] = (float((have - want).abs().max()) if have.shape == want.shape
                         else "shape %s != %s" % (list(have.shape), list(want.shape)))
        RESULT["replay"].append(step)


def finish():
    with open(os.path.join(OUT, "result.json"), "w") as f:
        json.dump(RESULT, f)
'''

METHOD_SHAPES = '''
T0 = torch.zeros(1, 2)
T1 = torch.ones(1, 2)


@annotate.method(node_name="skip", export_with=BACKEND)
def skip(a=T0, b=T1, c=T0):
    y = a + 2 * b + 3 * c
    return y


@annotate.method(node_name="kworder", export_with=BACKEND)
def kworder(a, b, c=T1):
    y = a - b * c
    return y


@annotate.method(node_name="shared", export_with=BACKEND)
def shared(a, b=T1, c=T1):
    y = a * b + c
    return y


@annotate.method(node_name="kwonly", export_with=BACKEND)
def kwonly(a, *, k, m=T1):
    y = a * k + m
    return y


@annotate.method(node_name="star", export_with=BACKEND)
def star(a, *args, **kwargs):
    y = a + sum(args) + sum(kwargs.values())
    return y


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1, 2), 3.0), requires_grad=False)

    @annotate.method(node_name="bound", export_with=BACKEND)
    def act(self, x, scale=T1):
        y = x * self.w * scale
        return y


class Offset:
    def __init__(self):
        self.k = torch.full((1, 2), 5.0)

    @annotate.method(node_name="viaclass", export_with=BACKEND)
    def shift(self, x):
        y = x + self.k
        return y


@annotate.method(node_name="nograd", export_with=BACKEND)
@torch.no_grad()
def nograd(a, b=T1):
    y = a * b
    return y


policy, offset = Policy(), Offset()


def v(base, i):
    return torch.tensor([[base + i, base - 0.5 * i]])


CALLS = {
    "skip": lambda i: skip(v(1, i), c=v(2, i)),
    "kworder": lambda i: kworder(v(1, i), c=v(4, i), b=v(2, i)),
    "shared": lambda i: shared(v(1, i)),
    "kwonly": lambda i: kwonly(v(1, i), k=v(2, i)),
    "star": lambda i: star(v(1, i), v(2, i), v(3, i), z=v(4, i)),
    "bound": lambda i: policy.act(x=v(1, i), scale=v(2, i)),
    "viaclass": lambda i: Offset.shift(offset, v(1, i)),
    "nograd": lambda i: nograd(b=v(3, i), a=v(1, i)),
}
leapp.start("shapes", save_path=OUT)
for i in range(2):
    for label, call in CALLS.items():
        attempt("%s/%d" % (label, i), lambda: call(i))
leapp.stop()
# New inputs; the decorated functions run eagerly without a session.
n = [torch.tensor([[0.25 * j + 7.0, -1.5 * j]]) for j in range(4)]
inputs = {"skip/a": n[0], "skip/c": n[1], "kworder/a": n[0], "kworder/c": n[1],
          "kworder/b": n[2], "shared/a": n[3], "kwonly/a": n[0], "kwonly/k": n[1],
          "star/a": n[0], "star/arg_0": n[1], "star/arg_1": n[2], "star/z": n[3],
          "bound/x": n[0], "bound/scale": n[1], "viaclass/x": n[2], "nograd/b": n[3],
          "nograd/a": n[0]}
expected = {"skip/y": skip(n[0], c=n[1]), "kworder/y": kworder(n[0], c=n[1], b=n[2]),
            "shared/y": shared(n[3]), "kwonly/y": kwonly(n[0], k=n[1]),
            "star/y": star(n[0], n[1], n[2], z=n[3]), "bound/y": policy.act(x=n[0], scale=n[1]),
            "viaclass/y": Offset.shift(offset, n[2]), "nograd/y": nograd(b=n[3], a=n[0])}
compile_and_replay("shapes", [(inputs, expected)])
finish()
'''

MIRROR_NUMPY = '''
leapp.start("mirror", save_path=OUT)
for i in range(2):
    xv = np.array([[1.0 + i, 2.0, 3.0 - i]], dtype=np.float32)
    x = annotate.input_tensors("A", {"x": torch.tensor(xv)})
    y = annotate.output_tensors("A", {"y": x * 2}, export_with=BACKEND)
    buffer = xv * 2  # the same values, computed outside the pipeline
    tagged = attempt("mirror/%d" % i, lambda: annotate.mirror_leapp_tags(y, buffer))
    fact("mirror_is_ndarray/%d" % i, isinstance(tagged, np.ndarray),
         np.shares_memory(np.asarray(tagged), buffer))
    both = attempt("mirror_dict/%d" % i,
                   lambda: annotate.mirror_leapp_tags({"y": y}, {"y": buffer}))
    z = annotate.input_tensors("B", {"z": both["y"]})
    w = annotate.output_tensors("B", {"w": z * 3 + 1}, export_with=BACKEND)
    RESULT["calls"].append(["w/%d" % i, "ok", lists(w)])
leapp.stop()
new = np.array([[5.0, -2.0, 0.5]], dtype=np.float32)
compile_and_replay("mirror", [({"A/x": torch.tensor(new)}, {"B/w": (new * 2) * 3 + 1})])
finish()
'''

UNUSED_ALIAS = '''
leapp.start("unused", save_path=OUT)
state = torch.zeros(1, 3)
for i in range(3):
    xin = torch.tensor([[1.0 + i, 2.0, 3.0 - i]])

    def step():
        x = annotate.input_tensors("n", {"x": xin})
        prev = annotate.input_tensors("n", {"prev": state[:]})  # held, never read
        buf = annotate.register_buffer("n", {"buf": state})
        buf.copy_(x * 2)
        y = annotate.output_tensors("n", {"y": buf}, export_with=BACKEND)
        del prev
        return y

    attempt("step/%d" % i, step)
leapp.stop()
new = torch.tensor([[-4.0, 0.5, 9.0]])
compile_and_replay("unused", [({"n/x": new}, {"n/y": new * 2})])
finish()
'''

OUTPUT_PAYLOADS = '''
from leapp.utils.tensor_description import TensorSemantics


def identity(result, payload):
    """Which objects of the payload the result is (top-level values, leaves)."""
    values = [payload.ref] if isinstance(payload, TensorSemantics) else \\
        [s.ref for s in payload] if isinstance(payload, list) else list(payload.values())
    got = list(result) if len(values) > 1 else [result]
    return [len(got) == len(values)] + [g is v for g, v in zip(got, values)]


CASES = ["single", "pair", "nested", "nested_pair", "listed", "mixed", "semantics",
         "semantics_list"]
leapp.start("payloads", save_path=OUT)
for i in range(2):
    for case in CASES:
        x = annotate.input_tensors(case, {"x": torch.tensor([[1.0 + i, -2.0]])})
        a, b, c = x * 2, x + 1, x - 1
        payload = {
            "single": {"a": a},
            "pair": {"a": a, "b": b},
            "nested": {"a": {"b": b, "c": c}},
            "nested_pair": {"a": {"b": b, "c": c}, "d": a},
            "listed": {"a": [b, c]},
            "mixed": {"a": [b, {"c": c}], "z": (a,)},
            "semantics": TensorSemantics(name="a", ref=a),
            "semantics_list": [TensorSemantics(name="a", ref=a),
                               TensorSemantics(name="b", ref=b)],
        }[case]
        result = attempt("%s/%d" % (case, i),
                         lambda: annotate.output_tensors(case, payload, export_with=BACKEND))
        fact("%s/%d/is" % (case, i), *identity(result, payload))
leapp.stop()
new = torch.tensor([[0.5, 4.0]])
inputs = {"%s/x" % case: new for case in CASES}
a, b, c = new * 2, new + 1, new - 1
expected = {"single/a": a, "pair/a": a, "pair/b": b, "nested/a_b": b, "nested/a_c": c,
            "nested_pair/a_b": b, "nested_pair/a_c": c, "nested_pair/d": a,
            "listed/a_0": b, "listed/a_1": c, "mixed/a_0": b, "mixed/a_1_c": c,
            "mixed/z_0": a, "semantics/a": a, "semantics_list/a": a, "semantics_list/b": b}
compile_and_replay("payloads", [(inputs, expected)])
finish()
'''

TRACED_CONSTANT = '''
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh()).eval()
traced = torch.jit.trace(net, torch.zeros(1, 3))


@annotate.method(node_name="policy", export_with=BACKEND, environment_constants=["traced"])
def policy(obs):
    action = traced(obs) * 2.0
    return action


leapp.start("envconst", save_path=OUT)
with torch.no_grad():
    for i in range(2):
        attempt("call/%d" % i, lambda: policy(torch.full((1, 3), 0.5 + i)))
leapp.stop()
new = torch.tensor([[0.1, -0.2, 0.3]])
with torch.no_grad():
    want = net(new) * 2.0
compile_and_replay("envconst", [({"policy/obs": new}, {"policy/action": want})])
finish()
'''

SCENARIOS = {"method_shapes": ("shapes", METHOD_SHAPES),
             "traced_constant": ("envconst", TRACED_CONSTANT),
             "mirror_numpy": ("mirror", MIRROR_NUMPY),
             "unused_alias": ("unused", UNUSED_ALIAS),
             "output_payloads": ("payloads", OUTPUT_PAYLOADS)}

# The ports each scenario's bundle must have: {node: ([inputs], [outputs])}.
PORTS = {
    "method_shapes": {
        "skip": (["a", "c"], ["y"]), "kworder": (["a", "c", "b"], ["y"]),
        "shared": (["a"], ["y"]), "kwonly": (["a", "k"], ["y"]),
        "star": (["a", "arg_0", "arg_1", "z"], ["y"]), "bound": (["x", "scale"], ["y"]),
        "viaclass": (["x"], ["y"]), "nograd": (["b", "a"], ["y"])},
    "mirror_numpy": {"A": (["x"], ["y"]), "B": (["z"], ["w"])},
    "unused_alias": {"n": (["x"], ["y"])},
    "traced_constant": {"policy": (["obs"], ["action"])},
    "output_payloads": {
        "single": (["x"], ["a"]), "pair": (["x"], ["a", "b"]),
        "nested": (["x"], ["a_b", "a_c"]), "nested_pair": (["x"], ["a_b", "a_c", "d"]),
        "listed": (["x"], ["a_0", "a_1"]), "mixed": (["x"], ["a_0", "a_1_c", "z_0"]),
        "semantics": (["x"], ["a"]), "semantics_list": (["x"], ["a", "b"])},
}


def _write(tmp_path, name: str) -> str:
    path = os.path.join(str(tmp_path), name + ".py")
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(SCENARIOS[name][1]))
    return path


def _result(out: str) -> dict:
    with open(os.path.join(out, "result.json")) as f:
        return json.load(f)


def _run_here(script: str, out: str, backend: str) -> dict:
    """The script in this process (this package), as __main__."""
    os.makedirs(out, exist_ok=True)
    saved = sys.argv
    sys.argv = [script, out, backend]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    return _result(out)


def _run_in(python: str, script: str, out: str, backend: str, ours: bool) -> dict:
    """The script in a child interpreter (its own leapp)."""
    os.makedirs(out, exist_ok=True)
    proc = subprocess.run([python, script, out, backend], capture_output=True, text=True,
                          cwd=out, env=compat.clean_env(ours), timeout=600)
    assert proc.returncode == 0, f"{'ours' if ours else 'upstream'} failed:\n{proc.stdout[-3000:]}" \
                                 f"\n{proc.stderr[-3000:]}"
    return _result(out)


def _yaml_ports(path: str) -> dict:
    docs = compat.load_docs(path)
    models = {k: v for d in docs for k, v in d.items()}["models"]
    return {name: ([p["name"] for p in m["inputs"]], [p["name"] for p in m["outputs"]])
            for name, m in models.items()}


@pytest.mark.parametrize("backend", ["jit", "onnx"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_end_to_end(name, backend, tmp_path):
    """(a) ours: every call succeeds, the ports are upstream's, the bundle replays as eager."""
    out = os.path.join(str(tmp_path), "out")
    result = _run_here(_write(tmp_path, name), out, backend)
    failed = [c for c in result["calls"] if c[1] != "ok"
              or c[0].startswith("fact:") and not all(c[2])]
    assert not failed, failed
    assert result["compile"] == "ok", result["compile"]
    graph = SCENARIOS[name][0]
    assert _yaml_ports(os.path.join(out, graph, graph + ".yaml")) == PORTS[name]
    assert result["replay"], "nothing replayed"
    for step in result["replay"]:
        bad = {k: d for k, d in step.items() if not isinstance(d, float) or d > TOL}
        assert not bad, f"exported bundle differs from eager: {bad}"


def test_scenario_checks_can_fail(tmp_path):
    """The replay check sees a wrong expectation (the harness is not vacuous)."""
    script = _write(tmp_path, "unused_alias")
    with open(script) as f:
        text = f.read()
    with open(script, "w") as f:
        f.write(text.replace('{"n/y": new * 2}', '{"n/y": new * 3}'))
    result = _run_here(script, os.path.join(str(tmp_path), "out"), "jit")
    assert result["replay"][0]["n/y"] > 1.0


def test_output_payload_identity(bundle):
    """The caller's containers and leaves come back themselves, on every pass."""
    leapp.start("ident", save_path=bundle.root, dry_run=True)
    try:
        for i in range(2):
            x = annotate.input_tensors("n", {"x": torch.ones(1, 2) * (i + 1)})
            inner, listed, leaf = {"b": x + 1, "c": x - 1}, [x * 3, x * 4], x * 2
            got = annotate.output_tensors("n", {"a": inner, "l": listed, "d": leaf},
                                          export_with="jit")
            assert got[0] is inner and got[1] is listed and got[2] is leaf
            assert got[0]["b"] is inner["b"] and got[1][0] is listed[0]
    finally:
        leapp.stop()


def test_method_call_that_raises_leaves_no_half_built_node(bundle):
    """A first call that raises is forgotten: the next call traces the node afresh."""
    boom = {"on": True}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("h", torch.zeros(1, 2))

    net = Net()

    @annotate.method(node_name="flaky", export_with="jit")
    def flaky(a, b=torch.ones(1, 2)):
        annotate.module("flaky", net)
        net.h = net.h + a
        if boom["on"]:
            raise ValueError("boom")
        y = a * b + net.h
        return y

    leapp.start("flaky", save_path=bundle.root)
    a0 = torch.ones(1, 2)
    with pytest.raises(ValueError, match="boom"):
        flaky(a0)
    # The user's tensor and the module's buffer are plain again.
    assert type(a0) is torch.Tensor and type(net.h) is torch.Tensor
    assert leapp._core.find_node("flaky") is None
    with pytest.raises(TypeError):
        flaky()  # a bad call shape: the plain call's error, and again nothing left behind
    assert leapp._core.find_node("flaky") is None
    boom["on"] = False
    for i in range(2):
        flaky(torch.full((1, 2), 2.0 + i))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"flaky": True}
    doc = bundle.yaml("flaky")
    assert [p["name"] for p in doc["models"]["flaky"]["inputs"]] == ["a", "h"]


def test_positional_only_default_skipped(bundle):
    """A skipped positional-only tensor default is passed by position (upstream cannot)."""
    @annotate.method(node_name="po", export_with="jit")
    def po(a, b=torch.full((1, 2), 2.0), /, *, c=torch.ones(1, 2)):
        y = a * b + c
        return y

    leapp.start("po", save_path=bundle.root)
    for i in range(2):
        got = po(torch.full((1, 2), 1.0 + i))
        torch.testing.assert_close(got, torch.full((1, 2), 2.0 * (1 + i) + 1.0))
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"po": True}
    assert [p["name"] for p in bundle.yaml("po")["models"]["po"]["inputs"]] == ["a"]


@pytest.mark.skipif(UPSTREAM is None,
                    reason="no upstream leapp interpreter: run `make compat` (creates "
                           ".compat-venv) or set LEAPP_UPSTREAM_PYTHON")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_matches_upstream(name, tmp_path):
    """(b) the same script under both: same outcomes and values, same YAML."""
    script = _write(tmp_path, name)
    ours_out, up_out = os.path.join(str(tmp_path), "ours"), os.path.join(str(tmp_path), "up")
    ours = _run_in(OURS, script, ours_out, "jit", ours=True)
    upstream = _run_in(UPSTREAM, script, up_out, "jit", ours=False)
    assert upstream["compile"] == "ok", upstream["compile"]
    assert ours["compile"] == upstream["compile"]
    assert [c[:2] for c in ours["calls"]] == [c[:2] for c in upstream["calls"]]
    for mine, theirs in zip(ours["calls"], upstream["calls"]):
        if mine[1] == "ok":
            torch.testing.assert_close(torch.tensor(_flat(mine[2])),
                                       torch.tensor(_flat(theirs[2])), msg=mine[0])
        else:
            assert mine == theirs
    graph = SCENARIOS[name][0]
    diffs = compat.compare_yaml(os.path.join(ours_out, graph, graph + ".yaml"),
                                os.path.join(up_out, graph, graph + ".yaml"))
    assert not diffs, "\n".join(diffs)


def _flat(value) -> list:
    """The numbers of a recorded value, in order (nested lists and dicts)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flat(v)]
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [float(value)]
