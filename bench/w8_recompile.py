"""W8: re-compile W7 after changing the constants of one node, in the same process.

W7 (bench/w7_compile.py) is a 4-node pipeline traced for 3 steps: a normaliser exported with
"onnx", a GRU cell with declared state (state_tensors / update_state) with
"jit", an actor MLP with "jit-trace" and an action scaler with static `kp` /
`kd` outputs with "pt2".

One process, one bundle directory, what a notebook user does:

  first_compile_s     the first compile_graph(validate=True, visualize=False)
                      of the process (cold: the exporters' lazy imports included)
  recompile_s         trace again with the scaler's kp / kd changed and compile
                      into the same bundle: three nodes are unchanged
  recompile_normaliser_s  the same with the normaliser's mean changed (the
                      slowest node to export, onnx, is the one that changed)
  warm_full_compile_s the scaler change compiled into a fresh directory: every
                      node exported again, nothing cold left (for scale)
  recompile_ratio     recompile_s / first_compile_s (budget <= 0.25)
  recompile_normaliser_ratio  recompile_normaliser_s / first_compile_s
  recompile_vs_warm_ratio     recompile_s / warm_full_compile_s

Re-compiles alternate between the two changes so that every one of them
changes exactly one node; each figure is the median over --repeats.  Under
upstream leapp (no incremental compile) the same script runs and shows what a
re-compile costs there.
"""

import torch

import leapp
from _common import emit, median, now, parse_args, quiet_stdout, tempdir
from w7_compile import W7Pipeline, trace_pipeline

def compile_once(label):
    t0 = now()
    result = leapp.compile_graph(validate=True, visualize=False)
    seconds = now() - t0
    if isinstance(result, dict) and not all(v is True for v in result.values()):
        raise SystemExit("W8 %s: validation failed: %r" % (label, result))
    return seconds


def main():
    args = parse_args(__doc__, repeats=3)
    repeats = 1 if args.quick else args.repeats
    pipe = W7Pipeline()
    recompiles, normaliser, warm = [], [], []
    with quiet_stdout(), tempdir() as root:
        trace_pipeline(root, graph_name="w7", pipeline=pipe)
        first = compile_once("first compile")
        for _ in range(repeats):
            pipe.kp += 1.0
            pipe.kd += 0.01
            trace_pipeline(root, graph_name="w7", pipeline=pipe)
            recompiles.append(compile_once("re-compile (scaler changed)"))
            pipe.obs_mean += 0.01
            trace_pipeline(root, graph_name="w7", pipeline=pipe)
            normaliser.append(compile_once("re-compile (normaliser changed)"))
            with tempdir() as fresh:
                pipe.kp += 1.0
                trace_pipeline(fresh, graph_name="w7", pipeline=pipe)
                warm.append(compile_once("full compile in a fresh directory"))
    recompile = median(recompiles)
    emit(
        "W8", "re-compile W7 after changing one node's constants, same process",
        figures={
            "first_compile_s": first,
            "recompile_s": recompile,
            "recompile_normaliser_s": median(normaliser),
            "warm_full_compile_s": median(warm),
            "recompile_ratio": recompile / first,
            "recompile_normaliser_ratio": median(normaliser) / first,
            "recompile_vs_warm_ratio": recompile / median(warm),
        },
        budgets={"recompile_ratio": {"max": 0.25}},
        info={"repeats": repeats, "steps": 3, "torch_threads": torch.get_num_threads()},
    )


if __name__ == "__main__":
    main()
