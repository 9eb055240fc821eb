"""torch's intra-op thread count while compile_graph() works on small tensors.

Exporting a node copies its weights (the graph module's buffers,
torch.jit.freeze's clone of the module, serialisation, loading), and
validating a small node runs a handful of tiny ops per sample.  A tensor
operation above torch's grain size (32,768 elements: one 256x256 weight) opens
a parallel region, and on a machine whose cores are busy the hand-off to the
worker threads, and their spinning afterwards, costs milliseconds per op: a
256x256 clone took 5-12 ms on two threads against 0.01 ms on one, and the
spinning workers slowed TorchScript's (single-threaded) compiler twofold.
compile_graph() therefore runs its export and writing phase on one intra-op
thread, and its validation too when the saved models are small
(SMALL_WEIGHTS_BYTES: their files hold the weights), since validation runs
every model on every sample and a large model's samples do profit from
threads.  The count is put back
afterwards, also after an error.  Nothing written depends on it: no export
step computes with the weights, and the outputs validation compares are
checked against a tolerance.

torch's count is the process's: other threads running torch ops while
compile_graph() works (and threads started meanwhile) get one intra-op
thread too.  LEAPP_NO_SINGLE_THREAD=1 keeps the process's count throughout.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator

import torch

from ..bundle.log import logger

# Total bytes of the bundle's files up to which validation runs on one thread
# too (W1's three .pt files: 0.6 MB; RL policies rarely exceed a few MB).
SMALL_WEIGHTS_BYTES = 16 << 20


@contextlib.contextmanager
def intra_op_threads(count: int | None) -> Iterator[None]:
    """torch.set_num_threads(count) for the block, then the previous count; None: unchanged."""
    previous = torch.get_num_threads()
    if count is None or count == previous or disabled():
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def disabled() -> bool:
    """True when LEAPP_NO_SINGLE_THREAD asks to keep the process's thread count."""
    return os.environ.get("LEAPP_NO_SINGLE_THREAD", "").strip() not in ("", "0")


def files_bytes(staging: str, extra: Iterable[str] = ()) -> int:
    """Bytes of the files written into staging plus those of the extra paths.

    The saved models hold the nodes' weights (ONNX external data included), so
    their size stands for what validation will compute with.
    """
    total = 0
    with os.scandir(staging) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    for path in extra:
        with contextlib.suppress(OSError):
            total += os.path.getsize(path)
    return total


def validation_threads(staging: str, extra: Iterable[str] = ()) -> int | None:
    """1 when the staged models (and the extra, out-of-bundle ones) are small, else None."""
    size = files_bytes(staging, extra)
    small = size <= SMALL_WEIGHTS_BYTES
    logger.debug("Validation threads: %s (models %d bytes)", 1 if small else "unchanged", size)
    return 1 if small else None
