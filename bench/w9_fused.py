"""W9: one step of a fused model (leapp.fuse) against InferenceManager.run_policy.

The same bundle is run two ways in one process, batches interleaved so that
noise and drift hit both alike:

  run_policy_us       InferenceManager.run_policy(inputs), batch 1
  fused_onnx_us       the fused ONNX model, one onnxruntime session.run per
                      step with the data inputs and the state fed back (what
                      a runtime holding the model does)
  fused_onnx_api_us   the same through leapp.fusion.FusedModel.step (dicts of
                      torch tensors in and out, as run_policy takes them)
  fused_torchscript_us  the fused TorchScript model, module(*inputs, *state)
                      (only where every node can be TorchScript)

and the ratios fused / run_policy (``*_ratio``, medians of per-batch ratios;
the budget: fused_onnx_ratio <= 0.5).  Pipelines:

* W1: bench/w1_pipeline.py's 3 nodes (normalise -> MLP 3x256 -> clamp/scale),
  every node exported with "jit";
* W7: bench/w7_compile.py's 4 nodes (onnx normaliser, jit GRU cell with
  declared state, jit-trace actor, pt2 scaler with static kp/kd), when that
  module is present.

torch runs on one thread, onnxruntime with the session options
InferenceManager gives its own ONNX nodes.  This package only: upstream
0.7.2 has no fuse, so under its interpreter the workload reports no figures.
"""

import statistics
import sys

import torch

import leapp
from _common import W1Pipeline, emit, now, parse_args, quiet_stdout, tempdir

try:  # written on another branch; covered when present
    import w7_compile
except ImportError:  # pragma: no cover - depends on the checkout
    w7_compile = None


def compile_w1(directory):
    pipe = W1Pipeline(export_with="jit")
    leapp.start("w1_pipeline", save_path=directory)
    with torch.no_grad():
        for i in range(3):
            pipe.step(pipe.make_obs(i))
    leapp.stop()
    leapp.compile_graph(visualize=False)
    return "%s/w1_pipeline/w1_pipeline.yaml" % directory


def compile_w7(directory):
    w7_compile.trace_pipeline(directory)
    leapp.compile_graph(visualize=False)
    return "%s/w7_pipeline/w7_pipeline.yaml" % directory


def per_call_us(fn, calls):
    start = now()
    for _ in range(calls):
        fn()
    return (now() - start) / calls * 1e6


def measure(yaml_path, calls, repeats):
    from leapp.fusion import FusedModel, FuseError

    manager = leapp.InferenceManager(yaml_path)
    inputs = manager.get_mock_input()
    onnx_path = leapp.fuse(yaml_path)
    api = FusedModel(onnx_path, providers=["CPUExecutionProvider"])
    session = api.session  # the same session, driven with numpy arrays
    data_names = api.input_names
    state_names = api.state_inputs
    output_names = api.output_names + api.state_outputs
    count = len(api.output_names)
    feed = {name: inputs[name].numpy() for name in data_names}
    feed.update({name: value.numpy() for name, value in api.state.items()})

    def onnx_step():
        results = session.run(output_names, feed)
        for name, value in zip(state_names, results[count:]):
            feed[name] = value  # the state fed back

    def api_step():
        api.step(inputs)

    scripted = None
    try:
        ts_path = leapp.fuse(yaml_path, format="torchscript")
        scripted = FusedModel(ts_path)
    except FuseError:
        pass  # a node only exists as ONNX
    ts_state = dict(scripted.state) if scripted else {}
    ts_args = [inputs[name] for name in data_names]

    def ts_step():
        with torch.no_grad():
            results = scripted.module(*ts_args, *[ts_state[n] for n in state_names])
        for name, value in zip(state_names, results[count:]):
            ts_state[name] = value

    def im_step():
        manager.run_policy(inputs)

    steps = {"run_policy_us": im_step, "fused_onnx_us": onnx_step,
             "fused_onnx_api_us": api_step}
    if scripted is not None:
        steps["fused_torchscript_us"] = ts_step
    with torch.no_grad():
        for fn in steps.values():  # warm-up (profiling executor, arenas)
            for _ in range(200):
                fn()
        samples = {name: [] for name in steps}
        for _ in range(repeats):
            for name, fn in steps.items():
                samples[name].append(per_call_us(fn, calls))
    figures = {name: round(statistics.median(v), 3) for name, v in samples.items()}
    base = samples["run_policy_us"]
    for name in steps:
        if name != "run_policy_us":
            ratios = [f / b for f, b in zip(samples[name], base)]
            figures[name[:-len("_us")] + "_ratio"] = round(statistics.median(ratios), 4)
    return figures


def main():
    args = parse_args(__doc__, repeats=31, calls=(200, "steps per timed batch"))
    repeats = 5 if args.quick else args.repeats
    calls = 50 if args.quick else args.calls
    if not hasattr(leapp, "fuse"):
        emit("W9", "fused model step vs run_policy", figures={},
             info={"skipped": "this leapp has no fuse()"})
        return 0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    pipelines = [("w1", compile_w1)]
    if w7_compile is not None:
        pipelines.append(("w7", compile_w7))
    figures, budgets = {}, {}
    with tempdir() as directory:
        for name, build in pipelines:
            with quiet_stdout():
                yaml_path = build(directory)
            for figure, value in measure(yaml_path, calls, repeats).items():
                figures["%s_%s" % (name, figure)] = value
            budgets["%s_fused_onnx_ratio" % name] = {"max": 0.5}
    emit("W9", "fused model step vs InferenceManager.run_policy, batch 1", figures, budgets,
         info={"repeats": repeats, "calls": calls, "w7": w7_compile is not None,
               "torch_threads": torch.get_num_threads()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
