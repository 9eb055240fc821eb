"""W4: annotations with no session started (the cost left in training code).

Measured with timeit: median over repeats of the per-call time of many
iterations, minus timeit's empty-loop cost; the dict argument is built once
outside the loop so only the call is measured:

  input_tensors_us    annotate.input_tensors("node", {"obs": t})
  output_tensors_us   annotate.output_tensors("node", {"action": t})
  method_call_us      calling an @annotate.method(export_with="jit")-decorated
                      function minus calling the same undecorated function
  state_tensors_us    annotate.state_tensors("node", {"h": t})      (info)
  update_state_us     annotate.update_state("node", {"h": t})       (info)
  plain_call_us       the undecorated function call itself, for scale
"""

import sys
import timeit

import torch

import leapp  # noqa: F401 - importing the package is part of the contract
from leapp import annotate
from _common import emit, median, parse_args

T = torch.zeros(1, 16)
IN = {"obs": T}
OUT = {"action": T}
STATE = {"h": T}


def plain(x):
    return x


@annotate.method(export_with="jit")
def decorated(x):
    return x


STMTS = {
    "input_tensors_us": 'annotate.input_tensors("node", IN)',
    "output_tensors_us": 'annotate.output_tensors("node", OUT)',
    "state_tensors_us": 'annotate.state_tensors("node", STATE)',
    "update_state_us": 'annotate.update_state("node", STATE)',
    "decorated_call_us": "decorated(T)",
    "plain_call_us": "plain(T)",
    "empty_us": "pass",
}


def main():
    args = parse_args(__doc__, repeats=5, number=(100000, "iterations per repeat"))
    repeats = 3 if args.quick else args.repeats
    number = args.number // 4 if args.quick else args.number

    # Sanity: with no session the annotations must hand back the tensor.
    assert annotate.input_tensors("node", IN) is T or torch.equal(
        annotate.input_tensors("node", IN), T)
    assert torch.equal(decorated(T), T)

    g = globals()
    raw = {}
    for name, stmt in STMTS.items():
        times = timeit.repeat(stmt, globals=g, number=number, repeat=repeats)
        raw[name] = median(times) / number * 1e6
    loop = raw.pop("empty_us")  # timeit's own loop cost, subtracted below
    fig = {k: max(v - loop, 0.0) for k, v in raw.items()}
    fig["method_call_us"] = max(fig["decorated_call_us"] - fig["plain_call_us"], 0.0)
    del fig["decorated_call_us"]

    order = ["input_tensors_us", "output_tensors_us", "method_call_us",
             "state_tensors_us", "update_state_us", "plain_call_us"]
    emit(
        "W4", "annotations with no session started (per call)",
        figures={k: fig[k] for k in order},
        budgets={k: {"max": 0.3} for k in
                 ("input_tensors_us", "output_tensors_us", "method_call_us")},
        info={"repeats": repeats, "number": number, "timeit_loop_us": loop,
              "statistic": "median of repeats, minus timeit's empty loop"},
    )


if __name__ == "__main__":
    sys.exit(main())
