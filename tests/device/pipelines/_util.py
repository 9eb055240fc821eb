"""Shared by the device pipelines (tests/device/run.py): arguments, device, seeds.

Each pipeline is run as ``python SCRIPT OUTDIR`` under our leapp and under
upstream 0.7.2 (bench/compat.py's drivers compare the two bundles) and must
leave its bundle at ``OUTDIR/<name>/<name>.yaml``.  Everything is traced on
``cuda`` when torch sees a GPU (``LEAPP_DEVICE_PIPELINE_DEVICE`` overrides:
``cpu`` runs the same scripts on a machine without one).  Public API only.
"""

import os
import sys

import torch


def setup(script_file):
    """(graph name, save_path, device); seeds torch."""
    if len(sys.argv) != 2:
        raise SystemExit("usage: %s OUTPUT_DIR" % os.path.basename(script_file))
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    device = os.environ.get("LEAPP_DEVICE_PIPELINE_DEVICE") or (
        "cuda" if torch.cuda.is_available() else "cpu")
    name = os.path.splitext(os.path.basename(script_file))[0]
    return name, out, device


def seeded(*shape, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device)
