"""Paths shared by the tests (a plain module: `conftest` names clash across folders)."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def upstream_python() -> str | None:
    """An interpreter with upstream leapp 0.7.2, if one is set up beside us."""
    candidates = [os.environ.get("LEAPP_UPSTREAM_PYTHON"),
                  os.path.join(ROOT, ".compat-venv", "bin", "python")]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    return None


def under_sanitizer() -> bool:
    """Whether the suite runs under `make test-asan` (ASan's quarantine holds freed memory)."""
    return os.environ.get("LEAPP_SANITIZED") == "1"
