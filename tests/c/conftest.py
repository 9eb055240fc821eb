"""C-level tests load leapp._core on its own (no torch), so they also run under
the ASan/UBSan build: `make test-asan`."""
from __future__ import annotations

import glob
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_core():
    if "leapp._core" in sys.modules:
        return sys.modules["leapp._core"]
    path = glob.glob(os.path.join(ROOT, "leapp", "_core*.so"))[0]
    spec = importlib.util.spec_from_file_location("leapp._core", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def core():
    return _load_core()
