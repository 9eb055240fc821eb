"""Shared fixtures: a fresh leapp session state and bundle directory per test."""
from __future__ import annotations

import os
import sys

import pytest

from support import ROOT, writer_census  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import leapp  # noqa: E402
from leapp import _core  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip cleanly where torch sees no GPU (CI); they run where it
    does (make test-device, tests/device/run.sh)."""
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def pytest_sessionstart(session):
    """`make test-debug` and `make test-asan` set LEAPP_EXPECT_ASSERTS=1: the core the
    suite imports must then be the build with assert() on, not a release core."""
    if os.environ.get("LEAPP_EXPECT_ASSERTS") == "1" and not _core.ASSERTS:
        pytest.exit(f"LEAPP_EXPECT_ASSERTS=1 but {_core.__file__} was built without assert(): "
                    f"rebuild it with LEAPP_DEBUG_BUILD=1 or LEAPP_SANITIZE=1", returncode=1)


# ---- the ONNX writer's census: how many onnx-dynamo nodes of the run fell back ------------

_BASETEMP: list = []


@pytest.fixture(scope="session", autouse=True)
def _basetemp(tmp_path_factory):
    _BASETEMP.append(tmp_path_factory.getbasetemp())


def pytest_terminal_summary(terminalreporter):
    """The run's onnx-dynamo nodes (bundles under pytest's temporary directories): how many
    leapp's ONNX writer wrote, and each one that fell back to torch's exporter."""
    if not _BASETEMP or not os.path.isdir(_BASETEMP[0]):
        return
    written, fallbacks = writer_census(_BASETEMP[0])
    if not written and not fallbacks:
        return
    terminalreporter.write_line(
        f"ONNX writer: {written} onnx-dynamo node(s) written by leapp's writer, "
        f"{len(fallbacks)} fell back to torch's exporter")
    for bundle, line in fallbacks:
        terminalreporter.write_line(f"  {bundle}: {line[:200]}")


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
