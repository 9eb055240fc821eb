"""W8: re-compile W7 after changing the constants of one node, in the same process.

W7 is a 4-node pipeline traced for 3 steps: a normaliser exported with
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
from leapp import annotate
from _common import emit, median, now, parse_args, quiet_stdout, tempdir

OBS_DIM = 48
HIDDEN = 64
ACT_DIM = 12
STEPS = 3


class W7Pipeline:
    """The W7 pipeline's modules and constants; ``trace(root)`` runs one session."""

    def __init__(self, seed=0):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.obs_mean = torch.randn(1, OBS_DIM, generator=gen) * 0.1
        self.obs_std = torch.rand(1, OBS_DIM, generator=gen) + 0.5
        self.gru = torch.nn.GRUCell(OBS_DIM, HIDDEN).eval()
        self.actor = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, 128), torch.nn.ELU(),
            torch.nn.Linear(128, 128), torch.nn.ELU(),
            torch.nn.Linear(128, ACT_DIM)).eval()
        self.scale = torch.full((1, ACT_DIM), 0.5)
        self.kp = torch.full((1, ACT_DIM), 20.0)
        self.kd = torch.full((1, ACT_DIM), 0.5)
        self.observations = [torch.randn(1, OBS_DIM, generator=gen) for _ in range(STEPS)]

    def step(self, obs, h):
        x = annotate.input_tensors("normaliser", {"obs": obs})
        x = torch.clamp((x - self.obs_mean) / self.obs_std, -5.0, 5.0)
        x = annotate.output_tensors("normaliser", {"obs_norm": x}, export_with="onnx")

        x = annotate.input_tensors("memory", {"obs_norm": x})
        state = annotate.state_tensors("memory", {"h": h})
        new_h = self.gru(x, state)
        annotate.update_state("memory", {"h": new_h})
        features = annotate.output_tensors("memory", {"features": torch.tanh(new_h)},
                                           export_with="jit")

        f = annotate.input_tensors("actor", {"features": features})
        raw = annotate.output_tensors("actor", {"raw_action": self.actor(f)},
                                      export_with="jit-trace")

        a = annotate.input_tensors("scaler", {"raw_action": raw})
        return annotate.output_tensors(
            "scaler", {"action": torch.tanh(a) * self.scale},
            static_outputs={"kp": self.kp.clone(), "kd": self.kd.clone()},
            export_with="pt2")

    def trace(self, root, graph="w7"):
        """One session of STEPS passes into root/graph, stopped, not compiled."""
        leapp.start(graph, save_path=root)
        with torch.no_grad():
            h = torch.zeros(1, HIDDEN)
            for obs in self.observations:
                self.step(obs, h)
        leapp.stop()


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
        pipe.trace(root)
        first = compile_once("first compile")
        for _ in range(repeats):
            pipe.kp += 1.0
            pipe.kd += 0.01
            pipe.trace(root)
            recompiles.append(compile_once("re-compile (scaler changed)"))
            pipe.obs_mean += 0.01
            pipe.trace(root)
            normaliser.append(compile_once("re-compile (normaliser changed)"))
            with tempdir() as fresh:
                pipe.kp += 1.0
                pipe.trace(fresh)
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
        info={"repeats": repeats, "steps": STEPS, "torch_threads": torch.get_num_threads()},
    )


if __name__ == "__main__":
    main()
