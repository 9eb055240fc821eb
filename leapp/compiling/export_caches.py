"""One-off costs of torch's ONNX exporter, paid once per process.

``torch.onnx.export(dynamo=True)`` rebuilds, on every call, two things that
only depend on the installed torch and onnxscript:

* the ONNX operator registry (``ONNXRegistry.from_torchlib``: onnxscript
  reads and parses the source of ~500 torchlib functions), about 1.3 s on a
  2-core machine, two thirds of a small node's export;
* the ONNX-friendly decomposition table derived from it, and the set of
  CompositeImplicitAutograd ops ``run_decompositions`` may preserve, about
  0.2 s more.

:func:`export_dynamo` builds them once and hands them to the exporter for
every later node and compile.  torch has no public way to pass a registry, so
this goes through the exporter's internal entry point
(``torch.onnx._internal.exporter._core.export``, which takes ``registry=``)
and swaps the two table builders for memoised ones for the duration of the
call.  It is used only on the torch versions it was checked against
(:data:`TESTED_TORCH`) and when every internal it touches is present with the
expected signature; otherwise, or with ``LEAPP_NO_EXPORT_CACHE=1`` in the
environment, the plain ``torch.onnx.export`` runs.  Both give the same model.

The memoised tables are returned only while their inputs are unchanged: each
is keyed on a fingerprint of what torch derives it from (the decomposition
table's size and the ops with a CompositeImplicitAutograd kernel; the
registry on whether torchvision, whose ops torchlib also covers, is imported), so a custom op or decomposition
registered later is seen as torch would see it.  Nothing cached belongs to
one export: the registry maps op names to onnxscript functions, the tables
map ops to decomposition functions; no fake tensor, ShapeEnv or graph is kept.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
from typing import Any, Callable, Iterator

import torch

from ..bundle.log import logger

# (major, minor) versions of torch whose exporter internals were checked.
TESTED_TORCH: frozenset[tuple[int, int]] = frozenset({(2, 13)})

_lock = threading.RLock()
_registries: dict[tuple[int, bool], Any] = {}
_memo: dict[str, tuple[Any, Any]] = {}


def torch_minor() -> tuple[int, int]:
    """(major, minor) of the running torch."""
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def _internals() -> tuple[Any, Any, Any, Any] | None:
    """The exporter modules the cached path needs, or None where one is missing."""
    try:
        from torch.export import exported_program
        from torch.onnx._internal.exporter import _constants, _core, _decomp, _registration
    except ImportError:
        return None
    needed = [
        callable(getattr(_registration.ONNXRegistry, "from_torchlib", None)),
        callable(getattr(_decomp, "create_onnx_friendly_decomposition_table", None)),
        callable(getattr(exported_program, "_collect_all_valid_cia_ops", None)),
        isinstance(getattr(_constants, "TORCHLIB_OPSET", None), int),
    ]
    try:
        params = inspect.signature(_core.export).parameters
    except (TypeError, ValueError):
        return None
    needed.append(all(name in params for name in (
        "registry", "verbose", "verify", "optimize", "report", "opset_version")))
    return (_core, _decomp, _registration, exported_program) if all(needed) else None


def cached_path_available() -> bool:
    """Whether :func:`export_dynamo` reuses the registry and tables in this process."""
    if os.environ.get("LEAPP_NO_EXPORT_CACHE", "").strip() not in ("", "0"):
        return False
    return torch_minor() in TESTED_TORCH and _internals() is not None


def _fingerprint() -> tuple:
    """What torch derives the decomposition tables from, cheaply (about 1 ms): its
    Python decompositions and the ops with a CompositeImplicitAutograd kernel."""
    cia = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    return len(torch._decomp.decomposition_table), hash(tuple(sorted(cia)))


def _memoised(key: str, build: Callable[[], Any], inputs: Any) -> Any:
    """build()'s result, rebuilt when inputs (compared by ==) changed since it was made."""
    held = _memo.get(key)
    if held is None or held[0] != inputs:
        held = (inputs, build())
        _memo[key] = held
    return held[1]


def registry(opset: int) -> Any:
    """The exporter's ONNX registry for opset, built on first use.

    torchlib covers aten, prims and torchvision ops; only the last can appear
    later in a process (torchvision registers its ops when imported), so
    whether it is imported is part of the key.
    """
    internals = _internals()
    if internals is None:
        raise RuntimeError("torch's ONNX exporter internals are not available")
    _, _, registration, _ = internals
    key = (opset, "torchvision" in sys.modules)
    with _lock:
        reg = _registries.get(key)
        if reg is None:
            logger.debug("Building torch's ONNX operator registry (opset %d) once", opset)
            reg = registration.ONNXRegistry.from_torchlib(opset_version=opset)
            _registries[key] = reg
        return reg


@contextlib.contextmanager
def _memoised_tables(decomp: Any, exported_program: Any) -> Iterator[None]:
    """Swap torch's two table builders for memoised ones while the export runs."""
    build_table = decomp.create_onnx_friendly_decomposition_table
    collect_cia = exported_program._collect_all_valid_cia_ops

    def table(onnx_registered_ops: set) -> dict:
        inputs = (frozenset(onnx_registered_ops), _fingerprint())
        # A copy: the caller may edit its table; ours stays as torch built it.
        return dict(_memoised("decomposition_table",
                              lambda: build_table(onnx_registered_ops), inputs))

    def cia_ops() -> set:
        return set(_memoised("cia_ops", collect_cia, _fingerprint()))

    decomp.create_onnx_friendly_decomposition_table = table
    exported_program._collect_all_valid_cia_ops = cia_ops
    try:
        yield
    finally:
        decomp.create_onnx_friendly_decomposition_table = build_table
        exported_program._collect_all_valid_cia_ops = collect_cia


def export_dynamo(module: torch.nn.Module, inputs: tuple, *, opset: int, verbose: bool,
                  verify: bool, optimize: bool, report: bool) -> Any:
    """torch.onnx.export(module, inputs, dynamo=True, ...) -> ONNXProgram, paying the
    registry and the decomposition tables once per process where that is safe."""
    if cached_path_available():
        from torch.onnx._internal.exporter import _constants
        # Below torchlib's opset torch builds the registry for torchlib's and
        # converts the model down (with a warning): rare, left to the plain path.
        if opset >= int(_constants.TORCHLIB_OPSET):
            core, decomp, _, exported_program = _internals()  # type: ignore[misc]
            reg = registry(opset)
            with _lock, _memoised_tables(decomp, exported_program):
                return core.export(module, inputs, None, registry=reg, verbose=verbose,
                                   opset_version=opset, verify=verify, optimize=optimize,
                                   report=report)
    return torch.onnx.export(module, inputs, None, dynamo=True, verbose=verbose,
                             opset_version=opset, verify=verify, optimize=optimize,
                             report=report)
