"""Run every bench workload and print a table against the budgets.

    python bench/run.py                       # our interpreter only
    python bench/run.py --upstream /path/to/venv-or-python
    python bench/run.py --only W1,W3 --quick  # a smoke run

Each workload (bench/w*_*.py) runs in its own subprocess, first with our
interpreter (--ours, sys.executable by default) and then, when --upstream is
given, with upstream leapp's interpreter.  The table shows, per figure, our
median, upstream's median, the ratio ours/upstream, the budget and
whether it holds.  Budgets come from each workload's JSON line
("budgets"; see bench/_common.py), with the defaults below for workloads that
declare none.

Exit status: 0 when every workload ran (budget misses are reported, not
fatal, unless --strict), 1 with --strict and a budget miss, 2 when a workload
failed to run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

WORKLOADS = [
    ("W1", "w1_pipeline.py"),
    ("W2", "w2_ops.py"),
    ("W3", "w3_chain.py"),
    ("W4", "w4_passthrough.py"),
    ("W5", "w5_inference.py"),
    ("W6", "w6_memory.py"),
    ("W7", "w7_compile.py"),
    ("W8", "w8_recompile.py"),
    ("W9", "w9_fused.py"),
    ("W10", "oneshot.py"),
]

#: Workloads that run both implementations themselves (whole processes in alternating
#: pairs): run once, under our interpreter, given upstream's; their figures named
#: ``<x>_upstream_<y>`` are upstream's ``<x>_<y>``.
PAIRED = {"W10"}

# Used only for figures whose workload declares no budget of its own.
DEFAULT_BUDGETS = {
    "W5": {
        "overhead_per_node_us": {"max": 3.0, "max_ratio": 0.2},
    },
}


def resolve_python(path):
    """A venv directory or an interpreter path -> an absolute interpreter path
    (the workloads run from bench/; abspath, not realpath, keeps a venv's link)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        for cand in ("bin/python", "bin/python3", "Scripts/python.exe"):
            exe = os.path.join(path, cand)
            if os.path.exists(exe):
                return exe
        raise SystemExit("no Python interpreter under %s" % path)
    if not os.path.exists(path):
        raise SystemExit("no such interpreter: %s" % path)
    return path


def run_one(python, script, extra, timeout):
    """Run one workload; returns (record or None, seconds, error text)."""
    env = dict(os.environ)
    # The workload must import the leapp that belongs to `python`: never let
    # our checkout leak onto an upstream run (or the reverse).
    env.pop("PYTHONPATH", None)
    env.setdefault("PYTHONHASHSEED", "0")
    cmd = [python, os.path.join(HERE, script)] + list(extra)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="leapp-bench-cwd-") as cwd:
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, time.perf_counter() - t0, "timed out after %ss" % timeout
    elapsed = time.perf_counter() - t0
    record = None
    for line in reversed(proc.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                cand = json.loads(line)
            except ValueError:
                continue
            if isinstance(cand, dict):
                record = cand
                break
    if proc.returncode != 0 or record is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        return None, elapsed, "exit %d\n    %s" % (proc.returncode, "\n    ".join(tail))
    return record, elapsed, ""


def paired_run(wid, script, sides, extra, timeout, runs, failures):
    """Run a PAIRED workload once under our interpreter and split its figures by side."""
    upstream = dict(sides).get("upstream")
    print("[bench] %s %-18s %-8s ..." % (wid, script, "paired"), end="", file=sys.stderr,
          flush=True)
    record, secs, err = run_one(dict(sides)["ours"], script,
                                list(extra) + ["--upstream", upstream or "none"], timeout)
    print(" %.1fs%s" % (secs, "" if record else " FAILED"), file=sys.stderr, flush=True)
    if record is None:
        failures.append("%s (paired): %s" % (wid, err))
        return
    figures = figures_of(record)
    theirs = {name.replace("_upstream_", "_", 1): value for name, value in figures.items()
              if "_upstream_" in name}
    runs.setdefault("ours", []).append(dict(record, figures={
        name: value for name, value in figures.items() if "_upstream_" not in name}))
    info = record.get("info", {})
    if theirs:
        runs.setdefault("upstream", []).append(dict(record, figures=theirs, budgets={}, info={
            "leapp": info.get("upstream_leapp", "?"),
            "leapp_path": info.get("upstream_leapp_path", "?"),
            "python": "?", "torch": "?"}))


def figures_of(record):
    figs = record.get("figures")
    if isinstance(figs, dict):
        return figs
    # Tolerate a workload that prints its figures at the top level.
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def merge_rounds(records):
    """One record whose figures are the medians over several rounds."""
    if len(records) == 1:
        return records[0]
    merged = dict(records[-1])
    figs = [figures_of(r) for r in records]
    merged["figures"] = {
        name: statistics.median(f[name] for f in figs if name in f)
        for name in figs[-1]}
    merged.setdefault("info", {})
    merged["info"] = dict(merged["info"], rounds=len(records))
    return merged


def unit_of(name):
    for suffix, unit in (("_us", "us"), ("_s", "s"), ("_bytes", "B")):
        if name.endswith(suffix):
            return unit
    return ""


def fmt(value, unit):
    if value is None:
        return "-"
    if unit == "s":
        a = abs(value)
        if a >= 1:
            return "%.3f s" % value
        if a >= 1e-3:
            return "%.2f ms" % (value * 1e3)
        return "%.1f us" % (value * 1e6)
    if unit == "us":
        return "%.3f us" % value
    if unit == "B":
        return "%.1f B" % value
    return "%.4g" % value


def budget_text(budget, unit):
    parts = []
    if "max" in budget:
        parts.append("<= %s" % fmt(budget["max"], unit))
    if "max_ratio" in budget:
        parts.append("<= %gx upstream" % budget["max_ratio"])
    return ", ".join(parts) or "-"


def check(budget, ours, ratio):
    """'yes' / 'NO' / 'n/a' (a ratio budget with no upstream run)."""
    if not budget or ours is None:
        return "-"
    verdicts = []
    if "max" in budget:
        verdicts.append(ours <= budget["max"])
    if "max_ratio" in budget:
        verdicts.append(None if ratio is None else ratio <= budget["max_ratio"])
    if any(v is False for v in verdicts):
        return "NO"
    if any(v is None for v in verdicts):
        return "n/a" if not any(verdicts) else "yes (abs); ratio n/a"
    return "yes"


def table(rows, headers):
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    line = "  ".join("%-*s" % (w, h) for w, h in zip(widths, headers))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join("%-*s" % (w, c) for w, c in zip(widths, r)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", metavar="VENV_OR_PYTHON",
                    help="upstream leapp's venv directory or interpreter")
    ap.add_argument("--ours", metavar="PYTHON", default=sys.executable,
                    help="interpreter with our package (default: this one)")
    ap.add_argument("--only", help="comma-separated workload ids, e.g. W1,W4")
    ap.add_argument("--quick", action="store_true",
                    help="pass --quick to every workload (smoke run)")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds per workload run (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each workload this many times per side, "
                         "alternating sides, and take the median (less noise)")
    ap.add_argument("--json", metavar="PATH", help="also write all records here")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a budget does not hold")
    args = ap.parse_args()

    sides = [("ours", resolve_python(args.ours))]
    if args.upstream:
        sides.append(("upstream", resolve_python(args.upstream)))
    only = {w.strip().upper() for w in args.only.split(",")} if args.only else None
    extra = ["--quick"] if args.quick else []

    results = {}   # (wid, side) -> record (figures: median over rounds)
    failures = []
    skipped = []
    t_all = time.perf_counter()
    for wid, script in WORKLOADS:
        if only and wid not in only:
            continue
        if not os.path.exists(os.path.join(HERE, script)):
            skipped.append("%s (%s not present)" % (wid, script))
            continue
        runs = {}
        for rnd in range(max(args.rounds, 1)):
            if wid in PAIRED:
                paired_run(wid, script, sides, extra, args.timeout, runs, failures)
                continue
            for side, python in sides:
                print("[bench] %s %-18s %-8s ..." % (wid, script, side), end="",
                      file=sys.stderr, flush=True)
                record, secs, err = run_one(python, script, extra, args.timeout)
                print(" %.1fs%s" % (secs, "" if record else " FAILED"),
                      file=sys.stderr, flush=True)
                if record is None:
                    failures.append("%s (%s): %s" % (wid, side, err))
                    continue
                runs.setdefault(side, []).append(record)
        for side, records in runs.items():
            results[(wid, side)] = merge_rounds(records)

    rows = []
    misses = []
    for wid, script in WORKLOADS:
        ours = results.get((wid, "ours"))
        up = results.get((wid, "upstream"))
        if not ours and not up:
            continue
        base = ours or up
        budgets = dict(DEFAULT_BUDGETS.get(wid, {}))
        budgets.update(base.get("budgets") or {})
        ofigs = figures_of(ours) if ours else {}
        ufigs = figures_of(up) if up else {}
        for name in list(ofigs) + [n for n in ufigs if n not in ofigs]:
            unit = unit_of(name)
            o, u = ofigs.get(name), ufigs.get(name)
            ratio = (o / u) if (o is not None and u not in (None, 0)) else None
            b = budgets.get(name, {})
            holds = check(b, o, ratio)
            if holds == "NO":
                misses.append("%s %s" % (wid, name))
            rows.append([wid, name, fmt(o, unit), fmt(u, unit),
                         "-" if ratio is None else "%.3f" % ratio,
                         budget_text(b, unit) if b else "-", holds])

    print()
    for side, python in sides:
        rec = next((r for (w, s), r in results.items() if s == side), None)
        info = rec.get("info", {}) if rec else {}
        print("%-8s %s  (leapp %s from %s; python %s, torch %s)" % (
            side, python, info.get("leapp", "?"), info.get("leapp_path", "?"),
            info.get("python", "?"), info.get("torch", "?")))
    print()
    if rows:
        print(table(rows, ["workload", "figure", "ours", "upstream",
                           "ours/upstream", "budget", "holds"]))
    print()
    print("total %.1fs" % (time.perf_counter() - t_all))
    for s in skipped:
        print("skipped: %s" % s)
    for f in failures:
        print("FAILED: %s" % f)
    if misses:
        print("budget not met: %s" % ", ".join(misses))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sides": dict(sides),
                       "results": {"%s/%s" % k: v for k, v in results.items()},
                       "failures": failures, "skipped": skipped}, f, indent=1)
    if failures:
        return 2
    if misses and args.strict:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
