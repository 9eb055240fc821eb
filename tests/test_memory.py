"""Repeated start / trace / stop / compile_graph cycles keep memory flat.

The growth per cycle is the robust (Theil-Sen: median of pairwise slopes)
slope of GC-tracked objects, and of RSS, over the cycles after a warm-up, so
one noisy cycle cannot fail the test and a steady leak cannot hide.  A leak
of the session (nodes, op logs, graph modules, traced tensors) costs hundreds
of objects per cycle; torch.jit keeps a few per compile in its C++
compilation unit (new GraphModule classes), which the bound allows.
"""
from __future__ import annotations

import gc
import itertools
import logging
import os
import statistics

import pytest
import support
import torch

import leapp
from leapp import _core, annotate

WARM_UP = 10
CYCLES = 50
OBJECTS_PER_CYCLE = 40      # jit-script: about 17 measured (torch.jit's own caches)
RSS_KIB_PER_CYCLE = 256


def _rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _slope(values: list[float]) -> float:
    """Theil-Sen slope of values against their index."""
    pairs = itertools.combinations(range(len(values)), 2)
    return statistics.median((values[j] - values[i]) / (j - i) for i, j in pairs)


def _cycle(root: str, backend: str) -> None:
    leapp.start("mem", save_path=root)
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 4)})
    y = torch.tanh(x * 2.0 + 1.0).sum(dim=-1, keepdim=True)
    annotate.output_tensors("policy", {"act": y}, export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_fifty_jit_compiles_keep_memory_flat(bundle):
    logger = logging.getLogger("leapp")
    level = logger.level
    logger.setLevel(logging.ERROR)
    objects: list[float] = []
    rss: list[float] = []
    try:
        for index in range(WARM_UP + CYCLES):
            _cycle(bundle.root, "jit")
            if index >= WARM_UP:
                gc.collect()
                objects.append(len(gc.get_objects()))
                rss.append(_rss_kib())
    finally:
        logger.setLevel(level)
    per_cycle = _slope(objects)
    assert per_cycle < OBJECTS_PER_CYCLE, f"{per_cycle:.1f} GC objects retained per compile"
    if not support.under_sanitizer():  # ASan's quarantine holds freed memory
        kib = _slope(rss)
        assert kib < RSS_KIB_PER_CYCLE, f"RSS grows {kib:.0f} KiB per compile"
    assert _core.nodes()["policy"].node_index == 0  # the last session's node only


def test_slope_is_robust_and_catches_a_steady_leak():
    flat = [1000.0 + (37.0 if i == 20 else 0.0) + (i % 3) for i in range(CYCLES)]
    assert abs(_slope(flat)) < 1.0
    leaking = [1000.0 + 60.0 * i + (i % 7) for i in range(CYCLES)]
    assert _slope(leaking) > OBJECTS_PER_CYCLE
