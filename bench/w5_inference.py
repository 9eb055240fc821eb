"""W5: InferenceManager.run_policy overhead beyond the node models' own calls.

Plain script on the public API only, so it runs against this package and
against upstream leapp alike:

    python bench/w5_inference.py            # this package
    .compat-venv/bin/python bench/w5_inference.py   # upstream 0.7.2 (make upstream-venv)

It writes two bundles by hand into a temporary directory (TorchScript
models + YAML in the exported layout, no tracing involved):

* ``w1``: normalise -> MLP 3x256 -> clamp/scale, batch 1 (3 nodes);
* ``chain10``: 10 small elementwise nodes in a chain.

For each it measures the median time of one ``run_policy`` call and the time of
calling every model directly, once each, with the inputs it sees in the pipeline
(``model(x)``, the ``nn.Module`` call a user would write).  Batches of the two are
interleaved and the overhead is the median of the paired differences:

* ``overhead_us`` / ``overhead_per_node_us``: run_policy minus the direct pass;
* ``overhead_vs_forward_us``: baseline ``model.forward(x)`` (no ``Module.__call__``);
* ``overhead_vs_separate_us``: baseline the sum of per-model medians, each model
  timed alone in its own loop (hot caches: flatters the models);
* ``overhead_min_us``: fastest batches compared (interference only adds time).

Ours only (skipped under upstream): what ``run_policy``'s thread lock and
missing-input check add to a call straight into the C step program
(``manager._program.run`` through a function shaped like ``run_policy`` before
them: the "before" of that change, measured in the same run):

* ``step_guard_ratio``: run_policy / before on the real step, median of
  per-batch ratios (the step's own noise dominates on a busy machine);
* ``guard_us``: run_policy minus before with the step replaced by a no-op C
  call, so that only the guard is timed (paired median); ``guard_min_us`` the
  same from the fastest batches (interference only adds time).

It prints one JSON line.
"""
from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import time

import torch
import yaml

try:
    from leapp import InferenceManager
except ImportError:  # the facade's __init__ may not exist yet in a work tree
    from leapp.inference_manager import InferenceManager

OBS, ACT, HIDDEN = 48, 12, 256


class Normalise(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.linspace(-1, 1, OBS).reshape(1, OBS))
        self.register_buffer("std", torch.linspace(0.5, 2, OBS).reshape(1, OBS))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.mean) / self.std


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(OBS, HIDDEN), torch.nn.ELU(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ELU(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ELU(),
            torch.nn.Linear(HIDDEN, ACT))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


class ClampScale(torch.nn.Module):
    def forward(self, action: torch.Tensor) -> torch.Tensor:
        return torch.clamp(action, -1.0, 1.0) * 0.5


class Step(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.99 + 0.01


def _port(name: str, shape: list[int]) -> dict:
    return {"name": name, "dtype": "float32", "shape": shape, "type": "tensor"}


def write_bundle(directory: str, name: str, nodes: list[tuple[str, torch.nn.Module,
                                                                str, str, list[int]]]) -> str:
    """nodes: (node name, module, input name, output name, first input shape)."""
    os.makedirs(directory, exist_ok=True)
    models = {}
    for node, module, inp, out, _ in nodes:
        path = os.path.join(directory, f"{node}.pt")
        torch.jit.script(module.eval()).save(path)
        data = open(path, "rb").read()
        models[node] = {
            "inputs": [_port(inp, None)],
            "outputs": [_port(out, None)],
            "parameters": {"model_path": f"{node}.pt",
                           "md5sum": hashlib.md5(data).hexdigest(),
                           "sha256sum": hashlib.sha256(data).hexdigest(),
                           "backend": "jit", "warp_segments": 0}}
    # output shapes: run the chain once
    x = torch.zeros(nodes[0][4])
    for node, module, _, _, _ in nodes:
        models[node]["inputs"][0]["shape"] = list(x.shape)
        x = module(x)
        models[node]["outputs"][0]["shape"] = list(x.shape)
    data_flow = {f"{a[0]}/{a[3]}": [f"{b[0]}/{b[2]}"] for a, b in zip(nodes, nodes[1:])}
    pipeline = {"data_flow": data_flow, "feedback_flow": {},
                "inputs": {nodes[0][0]: [nodes[0][2]]},
                "outputs": {nodes[-1][0]: [nodes[-1][3]]}}
    system = {"leapp config version": "1.3", "leapp version": "bench",
              "python version": sys.version.split()[0], "torch version": str(torch.__version__)}
    path = os.path.join(directory, f"{name}.yaml")
    with open(path, "w") as handle:
        handle.write(yaml.dump({"models": models}, sort_keys=False) + "\n")
        handle.write(yaml.dump({"pipeline": pipeline}) + "\n")
        handle.write(yaml.dump({"system information": system}) + "\n")
    return path


def median_us(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def measure(yaml_path: str, nodes: list, calls: int, repeats: int) -> dict:
    manager = InferenceManager(yaml_path)
    key = manager.inputs[0]
    inputs = {key: torch.randn(nodes[0][4])}
    directory = os.path.dirname(yaml_path)
    loaded = [torch.jit.load(os.path.join(directory, f"{n[0]}.pt")).eval() for n in nodes]
    args = []
    x = inputs[key]
    for model in loaded:
        args.append(x)
        x = model(x)
    for _ in range(200):  # warm-up (profiling executor)
        manager.run_policy(inputs)
        for model, a in zip(loaded, args):
            model(a)
    pairs = list(zip(loaded, args))

    def direct_pass() -> None:  # every model once, same inputs as in the pipeline
        for model, a in pairs:
            model(a)

    def forward_pass() -> None:
        for model, a in pairs:
            model.forward(a)

    run, direct, forward, separate, diffs, fdiffs = [], [], [], [], [], []
    for _ in range(repeats):  # interleaved: noise and drift hit both sides alike
        r = median_us(lambda: manager.run_policy(inputs), calls, 1)
        d = median_us(direct_pass, calls, 1)
        f = median_us(forward_pass, calls, 1)
        separate.append(sum(median_us(lambda m=m, a=a: m(a), calls, 1) for m, a in pairs))
        run.append(r)
        direct.append(d)
        forward.append(f)
        diffs.append(r - d)
        fdiffs.append(r - f)
    overhead = statistics.median(diffs)  # median of paired differences
    return {"nodes": len(nodes),
            "run_policy_us": round(statistics.median(run), 3),
            "models_us": round(statistics.median(direct), 3),
            "models_forward_us": round(statistics.median(forward), 3),
            "models_separate_us": round(statistics.median(separate), 3),
            "overhead_us": round(overhead, 3),
            "overhead_per_node_us": round(overhead / len(nodes), 3),
            "overhead_vs_forward_us": round(statistics.median(fdiffs), 3),
            "overhead_vs_separate_us": round(statistics.median(run) - statistics.median(separate), 3),
            # interference only ever adds time: the best batches are a second view
            "overhead_min_us": round(min(run) - min(direct), 3),
            **guard_cost(manager, inputs, calls, repeats)}


def guard_cost(manager, inputs: dict, calls: int, repeats: int) -> dict:
    """run_policy (lock, missing-input check) against the bare C step; ours only."""
    program = getattr(manager, "_program", None)
    if program is None:
        return {}

    def unguarded(self, inputs):  # run_policy as it was: a method straight into C
        return self._program.run(inputs)

    def pairs(calls: int) -> tuple[list[float], list[float]]:
        run, bare = [], []
        for _ in range(repeats):  # interleaved, as above
            run.append(median_us(lambda: manager.run_policy(inputs), calls, 1))
            bare.append(median_us(lambda: unguarded(manager, inputs), calls, 1))
        return run, bare

    run, bare = pairs(calls)
    ratio = statistics.median([r / b for r, b in zip(run, bare)])
    manager._program = type("NoStep", (), {"run": staticmethod(len)})()
    try:
        run, bare = pairs(calls * 50)
    finally:
        manager._program = program
    return {"guard_us": round(statistics.median([r - b for r, b in zip(run, bare)]), 3),
            "guard_min_us": round(min(run) - min(bare), 3),
            "step_guard_ratio": round(ratio, 4)}


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    calls = int(os.environ.get("W5_CALLS", "200"))
    repeats = int(os.environ.get("W5_REPEATS", "41"))
    import leapp

    result = {"workload": "W5", "leapp": getattr(leapp, "__file__", None) or
              str(getattr(leapp, "__path__", "")), "calls": calls, "repeats": repeats}
    with tempfile.TemporaryDirectory() as tmp:
        w1 = [("normalise", Normalise(), "obs", "features", [1, OBS]),
              ("mlp", Mlp(), "features", "raw_action", [1, OBS]),
              ("clamp_scale", ClampScale(), "raw_action", "action", [1, ACT])]
        path = write_bundle(os.path.join(tmp, "w1"), "w1", w1)
        result["w1"] = measure(path, w1, calls, repeats)
        chain = [(f"step{i}", Step(), "x", "y", [1, 32]) for i in range(10)]
        path = write_bundle(os.path.join(tmp, "chain10"), "chain10", chain)
        result["chain10"] = measure(path, chain, calls, repeats)
    from _common import emit
    figures, budgets = {}, {}
    for name in ("w1", "chain10"):
        measured = result[name]
        # The conservative baseline: each model's forward() called directly.
        per_node = measured["overhead_vs_forward_us"] / measured["nodes"]
        figures[f"{name}_overhead_per_node_us"] = round(per_node, 3)
        figures[f"{name}_run_policy_us"] = measured["run_policy_us"]
        budgets[f"{name}_overhead_per_node_us"] = {"max": 3.0, "max_ratio": 0.2}
        if "guard_us" in measured:
            figures[f"{name}_guard_us"] = measured["guard_us"]
            figures[f"{name}_guard_min_us"] = measured["guard_min_us"]
            figures[f"{name}_step_guard_ratio"] = measured["step_guard_ratio"]
    emit("W5", "run_policy overhead beyond the node models' own calls", figures, budgets,
         info={"calls": calls, "repeats": repeats, "detail": {k: result[k] for k in
                                                             ("w1", "chain10")}})


if __name__ == "__main__":
    main()
