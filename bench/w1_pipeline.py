"""W1: 3-node policy pipeline (normalise -> MLP 3x256 -> clamp/scale), batch 1.

Figures (medians over repeats; each repeat is a fresh leapp.start() in a fresh
temporary directory, after one untimed warm-up session that loads the lazy
parts of torch and of the package):

  trace_pass_s      the first pass of a session: all three nodes traced
  reentry_pass_s    a later pass of the same session (median of --reentries
                    passes per repeat, then median over repeats)
  compile_graph_s   leapp.stop() excluded; compile_graph(validate=True,
                    visualize=False) with every node exported with "jit"
  cold_trace_pass_s the very first pass in the process (warm-up), one sample
  eager_pass_s      the same computation without annotations, for scale
"""

import sys

import torch

import leapp
from _common import (W1Pipeline, emit, median, now, parse_args, quiet_stdout,
                     run_passes, tempdir)


def session(pipe, reentries):
    with tempdir() as d:
        leapp.start("w1_pipeline", save_path=d)
        # One call site for every pass: re-entry from a new caller context
        # is a (warned) special case upstream, not what W1 measures.
        times = run_passes(pipe, 0, 1 + reentries)
        trace, reentry = times[0], times[1:]
        leapp.stop()
        t0 = now()
        result = leapp.compile_graph(validate=True, visualize=False)
        compile_s = now() - t0
        if isinstance(result, dict) and not all(result.values()):
            raise SystemExit("W1: validation failed: %r" % (result,))
    return trace, median(reentry), compile_s


def main():
    args = parse_args(__doc__, repeats=7, reentries=(20, "re-entry passes per repeat"))
    repeats = 3 if args.quick else args.repeats
    pipe = W1Pipeline(export_with="jit")

    with quiet_stdout():
        cold_trace, _, _ = session(pipe, 2)  # warm-up, not counted
        traces, reentries, compiles = [], [], []
        for _ in range(repeats):
            t, r, c = session(pipe, args.reentries)
            traces.append(t)
            reentries.append(r)
            compiles.append(c)

    obs = pipe.make_obs(0)
    eager = []
    for _ in range(200):
        t0 = now()
        pipe.step_eager(obs)
        eager.append(now() - t0)

    emit(
        "W1", "3-node policy pipeline, batch 1, export_with=jit",
        figures={
            "trace_pass_s": median(traces),
            "reentry_pass_s": median(reentries),
            "compile_graph_s": median(compiles),
            "cold_trace_pass_s": cold_trace,
            "eager_pass_s": median(eager),
        },
        budgets={
            "trace_pass_s": {"max_ratio": 0.2},
            "reentry_pass_s": {"max_ratio": 1.0},
            "compile_graph_s": {"max_ratio": 0.5},
        },
        info={"repeats": repeats, "reentries": args.reentries,
              "torch_threads": torch.get_num_threads()},
    )


if __name__ == "__main__":
    sys.exit(main())
