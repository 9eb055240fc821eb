"""Shared fixtures: a fresh leapp session state and bundle directory per test."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import leapp  # noqa: E402
from leapp import _core  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_session():
    """No test sees another's session: tracing off, nodes forgotten."""
    yield
    if _core.is_tracing():
        try:
            leapp.stop()
        except Exception:
            _core.set_tracing(False)
    _core.reset_nodes()


@pytest.fixture
def bundle(tmp_path):
    """A save_path for leapp.start() and a helper to read the bundle's YAML."""
    class Bundle:
        root = str(tmp_path)

        def dir(self, graph: str) -> str:
            return os.path.join(self.root, graph)

        def yaml(self, graph: str) -> dict:
            import yaml
            with open(os.path.join(self.root, graph, f"{graph}.yaml")) as handle:
                return yaml.safe_load(handle)

    return Bundle()


def upstream_python() -> str | None:
    """An interpreter with upstream leapp 0.7.2, if one is set up beside us."""
    candidates = [os.environ.get("LEAPP_UPSTREAM_PYTHON"),
                  os.path.join(ROOT, ".compat-venv", "bin", "python"),
                  "/work/upstream-venv/bin/python"]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    return None
