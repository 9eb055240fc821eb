"""What the view shows of a compile besides the YAML: validation analytics per node, sample
and output, and the warnings compile logged for each node.

Both come from the bundle's log.txt, so `leapp view` finds them in any bundle compiled by
this version: validation writes one DEBUG line per output and sample (:func:`record`), and
:func:`read_log` reads those lines and the session's warnings back.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import torch

from ..bundle.log import logger

#: The prefix of a validation analytics line in log.txt.
TAG = "validation analytics "

_RECORD = re.compile(r"^\[(WARNING|ERROR|DEBUG|FATAL)\]: (.*)$")
_LEVEL = re.compile(r"^\[[A-Z]+\]: ")


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


def record(node: str, output: str, sample: int, passed: bool, rtol: float, atol: float,
           exported: Any = None, source: Any = None, reason: str | None = None) -> None:
    """Log one output of one validation sample as a DEBUG line of log.txt."""
    entry: dict[str, Any] = {"node": node, "output": output, "sample": sample,
                             "passed": bool(passed), "rtol": rtol, "atol": atol}
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
    logger.debug("%s%s", TAG, json.dumps(entry, sort_keys=True))


def _records(text: str) -> list[tuple[str, str]]:
    """(level, message) of every WARNING, ERROR, FATAL and DEBUG record of a log, multi-line
    messages joined."""
    found: list[tuple[str, str]] = []
    current: list | None = None
    for line in text.splitlines():
        match = _RECORD.match(line)
        if match:
            current = [match.group(1), match.group(2)]
            found.append(current)  # type: ignore[arg-type]
        elif _LEVEL.match(line):
            current = None
        elif current is not None:
            current[1] += "\n" + line
    return [(level, message) for level, message in found]


def _mentions(message: str, node: str) -> bool:
    return re.search(r"(?<![\w.])" + re.escape(node) + r"(?![\w])", message) is not None


def read_log(text: str, nodes: list[str]) -> dict[str, Any]:
    """{"validation": {node: [entry, ...]}, "warnings": {node: [message, ...]},
    "general": [message, ...]} from log.txt's text.

    Only the last validation run of the log counts (a session may compile several times);
    a warning is a node's when it names the node, else general.
    """
    records = _records(text)
    validation: dict[str, list] = {name: [] for name in nodes}
    runs: list[list[dict]] = []
    last_sample: dict[tuple, int] = {}
    for level, message in records:
        if level != "DEBUG" or not message.startswith(TAG):
            continue
        try:
            entry = json.loads(message[len(TAG):])
        except ValueError:
            continue
        key = (entry.get("node"), entry.get("output"))
        if not runs or last_sample.get(key, -1) >= entry.get("sample", 0):
            runs.append([])
            last_sample.clear()
        last_sample[key] = entry.get("sample", 0)
        runs[-1].append(entry)
    for entry in (runs[-1] if runs else []):
        validation.setdefault(str(entry.get("node")), []).append(entry)
    warnings: dict[str, list[str]] = {name: [] for name in nodes}
    general: list[str] = []
    for level, message in records:
        if level == "DEBUG":
            continue
        text_ = f"[{level}] {message}"
        owners = [name for name in nodes if _mentions(message, name)]
        target = [warnings[name] for name in owners] or [general]
        for bucket in target:
            if text_ not in bucket:
                bucket.append(text_)
    return {"validation": validation, "warnings": warnings, "general": general}
