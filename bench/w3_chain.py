"""W3: 200 nodes in a chain, leapp.start(dry_run=True).

Each node takes the previous node's output, does two small ops and publishes
its result; node 0 takes the graph input.  compile_graph(visualize=False) in
dry-run mode builds the graph (edges, graph I/O, statistics) and writes the
YAML without exporting any model.

Figures (medians over repeats; each repeat is a fresh session in a fresh
temporary directory):

  compile_graph_s  compile_graph(visualize=False) on the dry-run session
  trace_s          tracing the 200 nodes (one pass), for scale
"""

import os
import sys

import torch

import leapp
from leapp import annotate
from _common import emit, median, now, parse_args, quiet_stdout, tempdir


def chain(x, nodes):
    for i in range(nodes):
        name = "node_%03d" % i
        h = annotate.input_tensors(name, {"x": x})
        h = torch.tanh(h * 0.5 + 0.1)
        x = annotate.output_tensors(name, {"y": h})
    return x


def once(nodes):
    with tempdir() as d:
        leapp.start("w3_chain", save_path=d, dry_run=True)
        t0 = now()
        chain(torch.randn(1, 16), nodes)
        t1 = now()
        leapp.stop()
        t2 = now()
        leapp.compile_graph(visualize=False)
        t3 = now()
        yaml_path = os.path.join(d, "w3_chain", "w3_chain.yaml")
        if not os.path.exists(yaml_path):
            raise SystemExit("W3: no YAML written at %s" % yaml_path)
    return t1 - t0, t3 - t2


def main():
    args = parse_args(__doc__, repeats=5, nodes=(200, "nodes in the chain"))
    repeats = 3 if args.quick else args.repeats
    with quiet_stdout():
        once(args.nodes)  # warm-up
        runs = [once(args.nodes) for _ in range(repeats)]
    emit(
        "W3", "%d-node chain, dry_run, compile_graph (graph + YAML)" % args.nodes,
        figures={
            "compile_graph_s": median(r[1] for r in runs),
            "trace_s": median(r[0] for r in runs),
        },
        budgets={"compile_graph_s": {"max": 0.5}},
        info={"repeats": repeats, "nodes": args.nodes},
    )


if __name__ == "__main__":
    sys.exit(main())
