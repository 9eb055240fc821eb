"""Before / after: one workload run alternately under two checkouts of this package.

    python bench/ab.py --before ../leapp-before --only W2,W1 --rounds 7

Each round runs every workload once with ``PYTHONPATH`` set to the "before"
tree and once to the "after" tree (this one by default), in alternating order,
so both see the same machine load; both trees need their C core built in place.
The table gives, per figure, the median of each side and after / before.
This is how changes to the tracer's hot path are judged (budgets such as "W2's
per-op overhead within 3 % of before"), never with absolute times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import WORKLOADS  # noqa: E402


def run_once(tree: str, script: str, quick: bool, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), TQDM_DISABLE="1")
    argv = [sys.executable, os.path.join(HERE, script)] + (["--quick"] if quick else [])
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=os.path.abspath(tree))
    if done.returncode != 0:
        raise SystemExit(f"{script} failed under {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["figures"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="checkout with the baseline build")
    parser.add_argument("--after", default=os.path.dirname(HERE), help="default: this tree")
    parser.add_argument("--only", default="W2,W1", help="comma-separated workload ids")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    table = dict(WORKLOADS)
    for workload in wanted:
        sides: dict[str, list[dict]] = {"before": [], "after": []}
        for round_ in range(args.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for side in order:
                tree = args.before if side == "before" else args.after
                sides[side].append(run_once(tree, table[workload], args.quick, args.timeout))
        print(f"{workload} ({args.rounds} rounds, alternating)")
        print(f"  {'figure':32} {'before':>12} {'after':>12} {'after/before':>13}")
        for name in sides["before"][0]:
            before = statistics.median(f[name] for f in sides["before"])
            after = statistics.median(f[name] for f in sides["after"])
            ratio = after / before if before else float("nan")
            print(f"  {name:32} {before:12.6g} {after:12.6g} {ratio:13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
