"""Helpers shared by the bench workloads.

Every workload is a plain script that imports only the public LEAPP API
(``import leapp``, ``from leapp import annotate``, ``leapp.InferenceManager``),
so the same file runs under our package and under upstream leapp 0.7.2.  It
prints exactly one JSON line on stdout, last, of the form::

    {"workload": "W1", "title": "...",
     "figures": {"trace_pass_s": 0.0012, ...},
     "budgets": {"trace_pass_s": {"max_ratio": 0.2}, ...},
     "info": {...}}

Figure names end in their unit: ``_s`` (seconds), ``_us`` (microseconds),
``_bytes``.  Figures are medians over repeats unless the name says otherwise.
A budget is a dict with any of ``max`` (absolute, in the figure's unit) and
``max_ratio`` (ours / upstream, checked by bench/run.py when an upstream
interpreter is given).  bench/run.py finds the JSON line by scanning stdout
from the end, so library chatter before it is harmless.
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

now = time.perf_counter


def parse_args(description, repeats, **extra):
    """Common command line: --repeats N, --quick, plus workload options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=repeats,
                        help="number of timed repeats (default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats/iterations, for smoke runs")
    for name, (default, helptext) in extra.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default),
                            default=default, help=helptext)
    return parser.parse_args()


def median(values):
    return statistics.median(values)


def emit(workload, title, figures, budgets=None, info=None):
    """Print the one JSON result line (flushes library output first)."""
    sys.stderr.flush()
    record = {
        "workload": workload,
        "title": title,
        "figures": figures,
        "budgets": budgets or {},
        "info": dict(info or {}),
    }
    record["info"].setdefault("python", sys.version.split()[0])
    record["info"].setdefault("torch", torch.__version__)
    record["info"].setdefault("leapp", leapp_version())
    record["info"].setdefault("leapp_path", leapp_path())
    print(json.dumps(record), flush=True)


def leapp_version():
    try:
        from importlib import metadata
        return metadata.version("leapp")
    except Exception:  # noqa: BLE001 - editable/in-tree installs may lack metadata
        import leapp
        return getattr(leapp, "__version__", "unknown")


def leapp_path():
    import leapp
    return os.path.dirname(os.path.abspath(getattr(leapp, "__file__", "") or "."))


@contextlib.contextmanager
def tempdir(prefix="leapp-bench-"):
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def quiet_stdout():
    """Send fd-level stdout to stderr while the library runs (keeps the JSON
    line the only thing a reader must parse, and avoids terminal cost)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# --------------------------------------------------------------------------
# The W1 policy pipeline: normalise -> MLP 3x256 -> clamp/scale, batch 1.
# Shared by w1_pipeline.py and w6_memory.py (and usable by w5).

OBS_DIM = 48
HIDDEN = 256
ACT_DIM = 12


class W1Pipeline:
    """Builds the model once; ``step(obs)`` runs one annotated pass."""

    def __init__(self, export_with="jit", seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.export_with = export_with
        self.obs_mean = torch.randn(1, OBS_DIM, generator=gen) * 0.1
        self.obs_std = torch.rand(1, OBS_DIM, generator=gen) + 0.5
        torch.manual_seed(seed)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(OBS_DIM, HIDDEN), torch.nn.ELU(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ELU(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ELU(),
            torch.nn.Linear(HIDDEN, ACT_DIM),
        ).eval()
        for p in self.mlp.parameters():
            p.requires_grad_(False)
        self.action_scale = 0.25

    def make_obs(self, i=0):
        gen = torch.Generator().manual_seed(1000 + i)
        return torch.randn(1, OBS_DIM, generator=gen)

    def step(self, obs):
        from leapp import annotate
        ew = self.export_with
        x = annotate.input_tensors("normalise", {"obs": obs})
        x = (x - self.obs_mean) / self.obs_std
        x = annotate.output_tensors("normalise", {"obs_norm": x},
                                    export_with=ew)
        h = annotate.input_tensors("policy", {"obs_norm": x})
        a = self.mlp(h)
        a = annotate.output_tensors("policy", {"action": a}, export_with=ew)
        c = annotate.input_tensors("postprocess", {"action": a})
        t = torch.clamp(c, -1.0, 1.0) * self.action_scale
        return annotate.output_tensors("postprocess", {"joint_targets": t},
                                       export_with=ew)

    def step_eager(self, obs):
        x = (obs - self.obs_mean) / self.obs_std
        a = self.mlp(x)
        return torch.clamp(a, -1.0, 1.0) * self.action_scale


def run_passes(pipe, first, count):
    """Run ``count`` passes from one call site; returns per-pass seconds."""
    times = []
    obs = [pipe.make_obs(first + k) for k in range(count)]
    for o in obs:
        t0 = now()
        pipe.step(o)
        times.append(now() - t0)
    return times
