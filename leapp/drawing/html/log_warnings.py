"""The warnings a compile logged for each node, read back from the bundle's log.txt for the
view.  (The validation analytics are data, not log lines: ``<graph>_analytics.json``,
leapp.bundle.analytics.)
"""
from __future__ import annotations

import re

_RECORD = re.compile(r"^\[(WARNING|ERROR|FATAL)\]: (.*)$")
_LEVEL = re.compile(r"^\[[A-Z]+\]: ")


def _records(text: str) -> list[tuple[str, str]]:
    """(level, message) of every WARNING, ERROR and FATAL record of a log, multi-line
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


def read_warnings(text: str, nodes: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """({node: [message, ...]}, [general message, ...]) from log.txt's text: a warning
    is a node's when it names the node, else general."""
    warnings: dict[str, list[str]] = {name: [] for name in nodes}
    general: list[str] = []
    for level, message in _records(text):
        text_ = f"[{level}] {message}"
        owners = [name for name in nodes if _mentions(message, name)]
        target = [warnings[name] for name in owners] or [general]
        for bucket in target:
            if text_ not in bucket:
                bucket.append(text_)
    return warnings, general
