"""A compile's validation analytics as data: ``<graph>_analytics.json`` in the bundle.

Validation (``leapp.compiling.validation``) and the closed-loop replay
(``leapp.running.closed_loop``) each add one entry per output and sample to an
:class:`Analytics` (did the exported model match the trace, by how much, why not);
``compile_graph`` writes it once into the staged bundle, committed with the other files.
The view (``leapp view``) and ``leapp inspect`` read it back with :func:`read`; log.txt
keeps only its human lines.

The file: ``{"analytics version": 1, "entries": [entry, ...]}``, an entry
``{"node", "output", "sample", "passed", "rtol", "atol"}`` plus ``max_abs`` / ``max_rel``
where both tensors could be compared (a non-finite value as its text, ``"inf"``) and
``reason`` where it failed before a comparison.  A closed-loop entry's output is the
port's name followed by :data:`CLOSED_LOOP`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

from .safe_load import MAX_YAML_BYTES, clip, open_regular, quote

#: The suffix of the file's name after the graph's.
SUFFIX = "_analytics.json"
#: The version of the file's layout.
VERSION = 1
#: The suffix of a closed-loop entry's output name.
CLOSED_LOOP = " [closed loop]"
#: The most bytes :func:`read` reads (a bundle's file is never trusted).
MAX_BYTES = MAX_YAML_BYTES
#: The keys every entry has, and their types.
_REQUIRED = {"node": str, "output": str, "sample": int, "passed": bool}


def file_name(graph: str) -> str:
    """The analytics file's name in the bundle of ``graph``."""
    return f"{graph}{SUFFIX}"


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def measure(exported: torch.Tensor, source: torch.Tensor) -> tuple[float, float]:
    """(max absolute error, max relative error) of exported against source.

    The relative error of an element is |exported - source| / |source|, over the elements
    where source is not zero (inf where it is zero and they differ).
    """
    if exported.numel() == 0:
        return 0.0, 0.0
    wide = torch.float64
    got = exported.detach().to(torch.complex128 if exported.is_complex() else wide)
    want = source.detach().to(torch.complex128 if source.is_complex() else wide)
    diff = (got - want).abs().to(wide)
    scale = want.abs().to(wide)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    max_abs = float(diff.max())
    with torch.no_grad():
        relative = torch.where(scale > 0, diff / scale.clamp_min(1e-300),
                               torch.where(diff > 0, torch.full_like(diff, math.inf),
                                           torch.zeros_like(diff)))
    return max_abs, float(relative.max())


class Analytics:
    """The entries of one compile's validation, in the order they were recorded."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def record(self, node: str, output: str, sample: int, passed: bool, rtol: float,
               atol: float, exported: Any = None, source: Any = None,
               reason: str | None = None) -> None:
        """One output of one validation sample (or closed-loop step)."""
        entry: dict[str, Any] = {"node": node, "output": output, "sample": sample,
                                 "passed": bool(passed), "rtol": _finite_or_text(float(rtol)),
                                 "atol": _finite_or_text(float(atol))}
        if isinstance(exported, torch.Tensor) and isinstance(source, torch.Tensor) \
                and tuple(exported.shape) == tuple(source.shape):
            try:
                max_abs, max_rel = measure(exported, source)
                entry["max_abs"] = _finite_or_text(max_abs)
                entry["max_rel"] = _finite_or_text(max_rel)
            except (RuntimeError, TypeError):  # a dtype torch cannot subtract: no numbers
                pass
        if reason:
            entry["reason"] = reason
        self.entries.append(entry)

    def document(self) -> dict[str, Any]:
        """What the file holds."""
        return {"analytics version": VERSION, "entries": list(self.entries)}

    def write(self, directory: str, graph: str) -> str:
        """Write ``<graph>_analytics.json`` into directory; its name."""
        name = file_name(graph)
        with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.document(), indent=1, sort_keys=True,
                                    allow_nan=False) + "\n")
        return name


def by_node(entries: list[dict[str, Any]], nodes: list[str]) -> dict[str, list[dict]]:
    """{node: its entries}: every name of nodes first (empty when it has none)."""
    grouped: dict[str, list[dict]] = {name: [] for name in nodes}
    for entry in entries:
        grouped.setdefault(entry["node"], []).append(entry)
    return grouped


def _checked(document: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(document, dict) or document.get("analytics version") != VERSION \
            or not isinstance(document.get("entries"), list):
        raise ValueError(f"{quote(path)} is not a leapp analytics file (version {VERSION})")
    for index, entry in enumerate(document["entries"]):
        if not isinstance(entry, dict) or any(
                not isinstance(entry.get(key), kind) for key, kind in _REQUIRED.items()):
            raise ValueError(f"{quote(path)}: entry {index} lacks one of "
                             f"{', '.join(_REQUIRED)}: {clip(repr(entry))}")
    return document["entries"]


def read(directory: str, graph: str) -> list[dict[str, Any]] | None:
    """The entries of the bundle's analytics file, or None when it has none (compiled
    without validation, or by another leapp).  Raises ValueError for a file that is not
    one (too large, not JSON, entries without their keys)."""
    path = os.path.join(directory, file_name(graph))
    if not os.path.lexists(path):
        return None
    try:
        fd = open_regular(path, "the analytics file")
    except Exception as exc:  # BundleError (not a regular file) or an OSError
        raise ValueError(str(exc)) from exc
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{quote(path)} is larger than {MAX_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{quote(path)} is not JSON: {clip(str(exc))}") from exc
    return _checked(document, path)
