"""One-shot export scripts: whole processes, ours against upstream, alternating pairs.

What a user waits for after training: a fresh Python process that imports leapp,
traces a policy and compiles it once (Isaac Lab's ``export.py``, every SB3 / skrl /
rsl-rl export).  Two scripts:

  w7      W7's 4-node pipeline (bench/w7_compile.py: onnx, jit + state, jit-trace,
          pt2 + static outputs), 3 traced steps, ``compile_graph()`` with defaults
  isaac   an Isaac Lab-style locomotion policy as one node: observation
          normalisation and an ELU MLP 48 -> 512 -> 256 -> 128 -> 12, exported with
          ``onnx-dynamo`` (what Isaac Lab's exporter uses), ``compile_graph()`` defaults

    python bench/oneshot.py --upstream /path/to/upstream/python --pairs 3
    python bench/oneshot.py --child isaac --out DIR       # one process, one export

Each pair runs the script once under this package and once under upstream, in an
order that alternates from pair to pair, so both see the same machine load.  The
figures are medians of the whole processes' wall times and their ratio; each child
also reports where its time went (``import torch``, ``import leapp``, tracing,
``compile_graph``), measured inside it.  Without ``--upstream`` only ours runs.
As a bench/run.py workload (``W10``) it prints the one JSON line of _common.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = ("w7", "isaac")

OBS_DIM, ACT_DIM = 48, 12


# ---- the child: one export in this process ---------------------------------------------


def _isaac(leapp, annotate, torch, save_path):
    """Trace the Isaac Lab-style policy (normaliser + actor MLP) for 3 steps."""
    torch.manual_seed(0)
    layers, width = [], OBS_DIM
    for hidden in (512, 256, 128):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ELU()]
        width = hidden
    actor = torch.nn.Sequential(*layers, torch.nn.Linear(width, ACT_DIM)).eval()
    mean = torch.randn(1, OBS_DIM) * 0.1
    std = torch.rand(1, OBS_DIM) + 0.5
    leapp.start("isaac_policy", save_path=save_path)
    with torch.no_grad():
        for i in range(3):
            obs = annotate.input_tensors("policy", {"obs": torch.randn(
                1, OBS_DIM, generator=torch.Generator().manual_seed(i))})
            actions = actor((obs - mean) / std)
            annotate.output_tensors("policy", {"actions": actions}, export_with="onnx-dynamo")
    leapp.stop()


def child(script: str, out: str) -> dict:
    started = time.perf_counter()
    import torch
    torch_s = time.perf_counter() - started
    t0 = time.perf_counter()
    import leapp
    from leapp import annotate
    leapp_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if script == "w7":
        sys.path.insert(0, HERE)
        from w7_compile import trace_pipeline
        trace_pipeline(out)
    else:
        _isaac(leapp, annotate, torch, out)
    trace_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = leapp.compile_graph()
    compile_s = time.perf_counter() - t0
    if isinstance(result, dict) and not all(v is True for v in result.values()):
        raise SystemExit(f"oneshot {script}: validation failed: {result!r}")
    return {"import_torch_s": torch_s, "import_leapp_s": leapp_s, "trace_s": trace_s,
            "compile_graph_s": compile_s, "in_process_s": time.perf_counter() - started,
            "leapp": getattr(leapp, "__version__", "?"),
            "leapp_path": os.path.dirname(os.path.abspath(leapp.__file__))}


# ---- the driver: whole processes, alternating pairs --------------------------------------


def run_process(python: str, script: str, tree: str | None, timeout: float) -> dict:
    """One whole process: its wall time and the phases it reported."""
    out = tempfile.mkdtemp(prefix="leapp-oneshot-")
    env = dict(os.environ, TQDM_DISABLE="1")
    if tree is not None:
        env["PYTHONPATH"] = tree
    else:
        env.pop("PYTHONPATH", None)
    try:
        t0 = time.perf_counter()
        done = subprocess.run([python, os.path.abspath(__file__), "--child", script,
                               "--out", out], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=out)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"oneshot {script} failed under {python}:\n{done.stderr[-3000:]}")
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(phases, wall_s=wall)


def _compile_bytecode() -> None:
    """Byte-compile this tree (the package and the scripts both sides run).

    An installed package is byte-compiled when pip installs it (upstream's is);
    a checkout run with PYTHONDONTWRITEBYTECODE=1 (or never run before) would
    compile ours from source in every child, a cost no user pays.
    """
    import compileall
    for folder in ("leapp", "bench"):
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=1,
                               legacy=False, force=False)


def compare(scripts, pairs: int, upstream: str | None, timeout: float,
            log=sys.stderr) -> dict:
    """{script: {"ours": [runs], "upstream": [runs]}}, pairs alternating in order."""
    sides = [("ours", sys.executable, ROOT)]
    if upstream:
        sides.append(("upstream", upstream, None))
    runs: dict = {s: {side: [] for side, _, _ in sides} for s in scripts}
    _compile_bytecode()
    for pair in range(pairs):
        for script in scripts:
            order = sides if pair % 2 == 0 else sides[::-1]
            for side, python, tree in order:
                record = run_process(python, script, tree, timeout)
                runs[script][side].append(record)
                print(f"[oneshot] {script:5} pair {pair + 1}/{pairs} {side:8} "
                      f"{record['wall_s']:6.2f} s  (leapp import {record['import_leapp_s']:.2f}"
                      f", compile {record['compile_graph_s']:.2f})", file=log, flush=True)
    return runs


def summary(runs: dict) -> tuple[dict, dict]:
    figures, info = {}, {}
    for script, sides in runs.items():
        for side, records in sides.items():
            if not records:
                continue
            prefix = f"{script}_" if side == "ours" else f"{script}_upstream_"
            label = "" if side == "ours" else "upstream_"
            info[f"{label}leapp"] = records[0]["leapp"]  # what the children imported
            info[f"{label}leapp_path"] = records[0]["leapp_path"]
            for phase in ("wall_s", "import_leapp_s", "trace_s", "compile_graph_s"):
                figures[prefix + phase] = statistics.median(r[phase] for r in records)
        if sides.get("upstream"):
            info[f"{script}_wall_ratio"] = round(
                figures[f"{script}_wall_s"] / figures[f"{script}_upstream_wall_s"], 3)
            info[f"{script}_pair_ratios"] = [
                round(a["wall_s"] / b["wall_s"], 3)
                for a, b in zip(sides["ours"], sides["upstream"])]
    return figures, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=SCRIPTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--scripts", default=",".join(SCRIPTS))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--upstream", default=os.environ.get("LEAPP_UPSTREAM_PYTHON"),
                        help="upstream leapp 0.7.2's python (default $LEAPP_UPSTREAM_PYTHON)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--quick", action="store_true", help="one pair")
    parser.add_argument("--repeats", type=int, help="pairs (bench/run.py's spelling)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.out)))
        return 0
    pairs = 1 if args.quick else (args.repeats or args.pairs)
    scripts = [s for s in args.scripts.split(",") if s]
    upstream = args.upstream if args.upstream and args.upstream != "none" else None
    if upstream and os.path.isdir(upstream):  # a venv, as `make bench UPSTREAM=...` takes
        upstream = os.path.join(upstream, "bin", "python")
    if upstream:  # the children run elsewhere: a relative path is the caller's
        upstream = os.path.abspath(upstream)
    runs = compare(scripts, pairs, upstream, args.timeout)
    figures, info = summary(runs)
    sys.path.insert(0, HERE)
    from _common import emit
    emit("W10", "one-shot export scripts (whole processes): W7 and an Isaac Lab-style "
         "onnx-dynamo policy", figures=figures,
         budgets={"w7_wall_s": {"max_ratio": 0.55}, "isaac_wall_s": {"max_ratio": 0.35}},
         info=dict(info, pairs=pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
