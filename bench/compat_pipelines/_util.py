"""Shared by the compat pipelines: argument handling and determinism.

Each pipeline script is run as ``python SCRIPT OUTDIR`` and must leave its
bundle at ``OUTDIR/<name>/<name>.yaml`` where ``<name>`` is the script's stem.
Only the public leapp API is used, so the same script runs under our package
and under upstream leapp 0.7.2.
"""

import os
import sys

import torch


def setup(script_file):
    """Returns (graph name, save_path); seeds torch; one CPU thread."""
    if len(sys.argv) != 2:
        raise SystemExit("usage: %s OUTPUT_DIR" % os.path.basename(script_file))
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    name = os.path.splitext(os.path.basename(script_file))[0]
    return name, out


def seeded(*shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)
