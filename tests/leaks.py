"""The one leak check of the suite: a scenario's step repeated in a fresh interpreter.

``measure(name)`` runs this file as a script in a new Python process (a test
process has loaded and cached too much to count on), where the scenario's
step runs WARMUP times, then ROUNDS times REPEAT more, with a snapshot after
the warm-up and after each round.  A snapshot holds, after a full collection:

* ``refcounts``: sys.getrefcount of the objects the step touches (the core
  module, its types, torch.Tensor and TracedTensor, the tensors and
  interned strings involved): a reference the C code takes and never gives
  back shows here even when the object lives forever;
* ``gc_objects``: how many objects the collector tracks;
* ``live``: how many instances of the core's types (TracedTensor, Carrier,
  Node, Port, Ref) are alive;
* ``total_refcount``: sys.gettotalrefcount() on a debug build of Python, else
  None (and then not compared).

A leak-free step leaves every snapshot equal to the first one.  Each
scenario also runs with ``leak=True``, where its step keeps one of the
objects it made (a Python-level leak, as a C one would): the snapshots must
then differ, so the check is shown to trip.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP, ROUNDS, REPEAT = 1000, 2, 1000

Step = Callable[[Callable[[Any], None]], None]
SCENARIOS: dict[str, Callable[[], tuple[Step, dict[str, Any]]]] = {}


def scenario(fn: Callable[[], tuple[Step, dict[str, Any]]]):
    SCENARIOS[fn.__name__] = fn
    return fn


# ---- the scenarios: setup() -> (step(keep), probes) --------------------------------

def _leapp_probes() -> dict[str, Any]:
    import torch

    import leapp
    from leapp import _core
    return {"leapp._core": _core, "torch.Tensor": torch.Tensor,
            "TracedTensor": leapp.TracedTensor, "Carrier": _core.Carrier,
            "Node": _core.Node, "Port": _core.Port, "Ref": _core.Ref,
            "'_leapp_carrier'": sys.intern("_leapp_carrier")}


@scenario
def op_handler():
    """Traced ops inside a tracing node: plain, in-place, view, copy and .to ops,
    a non-tensor result; the op log is emptied each step (it grows by design)."""
    import torch

    import leapp
    from leapp import _core, annotate
    leapp.start("leaks", save_path=tempfile.mkdtemp(prefix="leapp-leaks-"))
    x = annotate.input_tensors("n", {"x": torch.randn(4, 3)})
    node = _core.nodes()["n"]
    scale = torch.full((3,), 0.5)  # a tensor from outside the node: a constant

    def step(keep):
        y = torch.tanh(x * 2.0) + x
        y.add_(1.0)              # in place: recorded as its functional rewrite
        row = y[0]                # a view: joins an alias group
        z = (row * scale).clone().to(torch.float32)
        keep(z)
        _ = y.shape, z.sum().item()
        node.ops.clear()

    probes = dict(_leapp_probes(), x=x, scale=scale, node=node, tanh=torch.tanh,
                  add_=torch.Tensor.add_)
    return step, probes


@scenario
def stop_restores():
    """What stop() undoes, in a running session: tensors of the user's written by a
    node's ops (copy_, out=) and tensors computed outside every node from a published
    output (derived tags) are promoted, remembered and made plain again by
    release_traced() (stop()'s core call); the declared input and the published output
    are given their carriers back each step as the annotations would."""
    import torch

    import leapp
    from leapp import _core, annotate
    leapp.start("leaks", save_path=tempfile.mkdtemp(prefix="leapp-leaks-"))
    y = annotate.input_tensors("p", {"s": torch.randn(1, 3)}) * 2.0
    annotate.output_tensors("p", {"y": y})
    x = annotate.input_tensors("n", {"x": torch.randn(1, 3)})
    published, declared = _core.nodes()["p"], _core.nodes()["n"]
    y_vid, x_vid = _core.carrier_of(y).vid, _core.carrier_of(x).vid
    buf, out = torch.zeros(1, 3), torch.zeros(1, 3)

    def step(keep):
        _core.set_carrier(x, declared, x_vid, None, True)
        _core.set_carrier(y, published, y_vid, "y", False)
        buf.copy_(x * 2.0)              # written in the node
        torch.add(x, 1.0, out=out)      # written through out=
        e = (y + 1.0) * 2.0             # derived outside every node, twice
        assert type(buf) is type(e) is leapp.TracedTensor
        keep(e)
        released = _core.release_traced()
        assert released == 5, released  # x, y, buf, out, e (y + 1.0 is gone)
        assert type(buf) is type(e) is torch.Tensor and not vars(buf) and not vars(e)
        declared.ops.clear()

    probes = dict(_leapp_probes(), x=x, y=y, buf=buf, out=out, published=published,
                  declared=declared, copy_=torch.Tensor.copy_,
                  derived=sys.intern("_leapp_derived"))
    return step, probes


@scenario
def annotations():
    """The annotations without a session (the C fast paths) and while one runs, on a
    node's later passes (compared with the first, samples cached up to the limit)."""
    import torch

    import leapp
    from leapp import _core, annotate
    t = torch.randn(2, 3)
    h0 = torch.zeros(1, 3)

    def passes(keep, h):
        x = annotate.input_tensors("n", {"x": t})
        annotate.state_tensors("n", {"h": h})
        y = torch.relu(x) + h.sum()
        keep(y)
        annotate.update_state("n", {"h": h + 1.0})
        annotate.output_tensors("n", {"y": y}, export_with="jit")

    passes(lambda _: None, h0)  # no session: plain calls
    leapp.start("leaks", save_path=tempfile.mkdtemp(prefix="leapp-leaks-"), max_cached_io=3)
    passes(lambda _: None, h0)  # the first pass traces the node
    node = _core.nodes()["n"]

    def step(keep):
        passes(keep, h0)              # a later pass of the session

    probes = dict(_leapp_probes(), t=t, h0=h0, node=node, relu=torch.relu,
                  input_tensors=annotate.input_tensors)
    return step, probes


@scenario
def program_run():
    """InferenceManager.run_policy (Program.run) on bundles with feedback and state,
    jit and onnx, NumPy inputs (the convert hook), and its error paths (an input
    of the wrong shape; a NumPy array of the wrong dtype)."""
    import torch

    from leapp import _core
    from leapp.running.inference_manager import InferenceManager
    runs = []
    for name in ("feedback", "stateful"):
        manager = InferenceManager(os.path.join(ROOT, "tests", "data", "upstream", name,
                                                f"{name}.yaml"))
        inputs = {}
        for node, ports in manager.pipeline["inputs"].items():
            item = manager.nodes[node]
            for port in ports:
                shape = item.input_shapes[item.input_names.index(port)]
                inputs[f"{node}/{port}"] = torch.randn(*shape)
        runs.append((manager, inputs, {key: torch.zeros(7) for key in inputs},
                     {key: value.clone().numpy() for key, value in inputs.items()},
                     {key: value.double().numpy() for key, value in inputs.items()}))

    def step(keep):
        for manager, inputs, wrong, arrays, wrong_arrays in runs:
            keep(manager.run_policy(inputs))
            try:
                manager.run_policy(wrong)
            except ValueError:
                pass
            manager.run_policy(arrays)
            try:
                manager.run_policy(wrong_arrays)
            except TypeError:
                pass

    probes = dict(_leapp_probes(), Program=_core.Program)
    for manager, inputs, *_ in runs:
        probes.update({f"input {key}": value for key, value in inputs.items()})
    return step, probes


@scenario
def graph_and_yaml():
    """The core's graph code and YAML emitter with no torch at all: pruning, the
    pipeline's edges and statistics, YAML, and their error paths."""
    from support import finished_node, wire
    _core = sys.modules["leapp._core"]  # loaded alone (_load_core_alone)

    documents = [{"models": {"a": {
        "inputs": [{"name": "obs", "dtype": "float32", "shape": [1, 36], "type": "tensor",
                    "element_names": (("lf_hip", "rf_knee"), ("x", "y"))}],
        "parameters": {"model_path": "a.pt", "md5sum": "0" * 32, "backend": "jit",
                       "opset_version": 18, "tensorrt_compatible": True},
        "quoted": ["yes", "null", "1.0", "", "a: b", "- x", "#c", "\u00e9\n"],
        "numbers": [1.5, 1e-9, -0.0, 10**20, None, False]}}},
        {"pipeline": {"data_flow": {"a/y": ["b/y"]}, "inputs": {"a": ["x"]}}}]
    bad = [{"a": {"b": [1, 2, {"c": (1, {3})}]}}]

    def step(keep):
        a = finished_node(_core, "a", ["x", "m"], ["y"], 0)
        b = finished_node(_core, "b", ["y"], ["m"], 1)
        wire(b, "y", a, "y")
        wire(a, "m", b, "m")
        keep(_core.build_pipeline([a, b]))
        a.prune([a.outputs[0].vid])
        a.bind_const(object())    # a constant of the node and its Ref
        _core.emit_yaml(documents)
        for call, args in ((_core.build_pipeline, ([a, 3],)), (_core.emit_yaml, (bad,))):
            try:
                call(*args)
            except TypeError:
                pass

    probes = {"leapp._core": _core, "Node": _core.Node, "Port": _core.Port,
              "Ref": _core.Ref, "documents": documents, "bad": bad,
              "shape": documents[0]["models"]["a"]["inputs"][0]["shape"],
              "'float32'": sys.intern("float32")}
    return step, probes


# ---- the child: run one scenario, print the snapshots ---------------------------------

def snapshot(probes: dict[str, Any]) -> dict[str, Any]:
    while gc.collect():  # until a collection frees nothing: finalizers may free more
        pass
    refcounts = {name: sys.getrefcount(obj) for name, obj in probes.items()}
    names = {"TracedTensor", "Carrier", "Node", "Port", "Ref"}
    live = dict.fromkeys(sorted(names), 0)
    objects = gc.get_objects()
    for obj in objects:
        name = type(obj).__name__
        if name in names and type(obj).__module__ in ("leapp._core", "leapp.tracing.traced"):
            live[name] += 1
    count = len(objects)
    del objects
    total = sys.gettotalrefcount() if hasattr(sys, "gettotalrefcount") else None
    return {"refcounts": refcounts, "gc_objects": count, "live": live, "total_refcount": total}


def _load_core_alone() -> Any:
    """leapp._core loaded from its file without the package (and torch), as tests/c does:
    the built one, or the one LEAPP_CORE_PATH names (tests/test_debug_build.py)."""
    import glob
    import importlib.util
    path = os.environ.get("LEAPP_CORE_PATH") or \
        glob.glob(os.path.join(ROOT, "leapp", "_core*.so"))[0]
    spec = importlib.util.spec_from_file_location("leapp._core", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["leapp._core"] = module
    spec.loader.exec_module(module)
    return module


def _child(names: list[str]) -> None:
    sys.path.insert(0, ROOT)
    if names == ["graph_and_yaml"]:
        _load_core_alone()
    results = {name: _run(name) for name in names}
    print(json.dumps(results))


def _run(name: str) -> dict[str, list[dict[str, Any]]]:
    step, probes = SCENARIOS[name]()
    # Snapshots are kept as JSON text: a string is not tracked by the collector,
    # so keeping them does not change the next snapshot's object count.
    clean, leaky = [], []
    for _ in range(WARMUP):
        step(_drop)
    clean.append(json.dumps(snapshot(probes)))
    for _ in range(ROUNDS):
        for _ in range(REPEAT):
            step(_drop)
        clean.append(json.dumps(snapshot(probes)))
    kept: list = []
    for _ in range(REPEAT):
        step(kept.append)        # the same step, keeping one object each time
    leaky.append(json.dumps(snapshot(probes)))
    return {"clean": [json.loads(t) for t in clean], "leaky": [json.loads(t) for t in leaky]}


def _drop(obj: Any) -> None:
    """What a leak-free step does with the object a leaking one keeps."""


def measure(*names: str, env: dict[str, str] | None = None
            ) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{scenario: {"clean": snapshots, "leaky": snapshots}} of the scenarios named,
    run one after the other in one fresh interpreter.  "clean": after the warm-up
    and after each of ROUNDS rounds; "leaky": after one more round whose step
    keeps an object (to compare with the last clean snapshot).  graph_and_yaml
    runs alone: its interpreter never imports torch.  env: the child's environment."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *names],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def differences(snapshots: list[dict[str, Any]]) -> list[str]:
    """What changed between the first snapshot and each later one."""
    first, found = snapshots[0], []
    for index, later in enumerate(snapshots[1:], 1):
        for key in ("refcounts", "live"):
            for name, value in later[key].items():
                if value != first[key][name]:
                    found.append(f"round {index}: {key}[{name}] {first[key][name]} -> {value}")
        # Fewer tracked objects than after the warm-up is no leak: a third party
        # may release an object late (torch's import-time code, seen once).
        if later["gc_objects"] > first["gc_objects"]:
            found.append(f"round {index}: gc_objects {first['gc_objects']} -> "
                         f"{later['gc_objects']}")
        if later["total_refcount"] != first["total_refcount"]:
            found.append(f"round {index}: total_refcount {first['total_refcount']} -> "
                         f"{later['total_refcount']}")
    return found


if __name__ == "__main__":
    _child(sys.argv[1:])
