"""Paths and helpers shared by the tests (a plain module: `conftest` names clash across
folders)."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def upstream_python() -> str | None:
    """An interpreter with upstream leapp 0.7.2, if one is set up beside us.

    $LEAPP_UPSTREAM_PYTHON, when set, is the only candidate (``none`` turns the
    comparisons off, as tests/matrix.py does where upstream's torch differs).
    """
    chosen = os.environ.get("LEAPP_UPSTREAM_PYTHON")
    path = chosen or os.path.join(ROOT, ".compat-venv", "bin", "python")
    return path if os.path.exists(path) else None


def under_sanitizer() -> bool:
    """Whether the suite runs under `make test-asan` (ASan's quarantine holds freed memory)."""
    return os.environ.get("LEAPP_SANITIZED") == "1"


def finished_node(core, name, inputs=(), outputs=(), index=0):
    """A finished core Node with float32 (1, 2) ports of the names given (no torch)."""
    node = core.Node(name)
    for port_name in inputs:
        node.add_input(core.Port(port_name, "float32", (1, 2), node.new_value()))
    node.add_outputs([core.Port(port_name, "float32", (1, 2), node.new_value())
                      for port_name in outputs])
    node.finish(index)
    return node


def wire(consumer, input_name, producer, output_name):
    """Make producer's output the source of consumer's input of that name."""
    for port in consumer.inputs:
        if port.name == input_name:
            port.src_node, port.src_port = producer, output_name


def writer_census(root) -> tuple[int, list[tuple[str, str]]]:
    """(nodes the writer wrote, [(bundle, fallback line)]) over the log.txt files under root."""
    from leapp.compiling.backends.onnx import FELL_BACK, WRITTEN
    written, fallbacks = 0, []
    for folder, _, files in os.walk(root):
        if "log.txt" not in files:
            continue
        with open(os.path.join(folder, "log.txt"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if WRITTEN in line:
                    written += 1
                elif FELL_BACK in line:
                    fallbacks.append((os.path.relpath(folder, root), line.strip()))
    return written, fallbacks
