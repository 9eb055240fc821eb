"""leapp/_core.pyi describes leapp._core exactly: every name the C module and its
types export is typed there, nothing that does not exist is, and mypy accepts
the stub.  The exported constants are the core's own numbers."""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

from leapp import _core
from leapp.tracing import ops as _ops

STUB = pathlib.Path(_core.__file__).resolve().parent / "_core.pyi"


def _public(names) -> set[str]:
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _stub() -> tuple[set[str], dict[str, set[str]]]:
    """(module-level names, {class: member names}) the stub declares.

    Plain assignments (type aliases the stub uses for itself) are not names of
    the module; annotated ones (the constants) are.
    """
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    names: set[str] = set()
    classes: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            classes[node.name] = _public(members)
    return names, classes


def test_every_module_name_is_typed_and_every_typed_name_exists():
    names, _ = _stub()
    runtime = _public(vars(_core)) - {"__builtins__"}
    assert runtime - names == set(), "exported by _core but missing from _core.pyi"
    assert names - runtime == set(), "in _core.pyi but not exported by _core"


def test_every_type_member_is_typed_and_every_typed_member_exists():
    _, classes = _stub()
    types = {name for name, value in vars(_core).items() if isinstance(value, type)}
    assert types == set(classes)
    for name in sorted(types):
        runtime = _public(vars(getattr(_core, name)))
        assert runtime == classes[name], name


def test_constants_are_the_cores_and_distinct():
    ops = [_core.OP_PLAIN, _core.OP_INPLACE, _core.OP_COPY, _core.OP_TO, _core.OP_OVERWRITE,
           _core.OP_VIEW]
    assert ops == list(range(6))  # the order of leapp.h's enum
    assert (_core.REF_VALUE, _core.REF_CONST) == (0, 1)
    assert (_ops.OP_PLAIN, _ops.OP_VIEW) == (_core.OP_PLAIN, _core.OP_VIEW)
    assert _core.value_ref(3).kind == _core.REF_VALUE


def test_mypy_accepts_the_stub():
    mypy = pytest.importorskip("mypy.api")  # a test dependency (pyproject's test extra)
    del mypy
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=skip", "--ignore-missing-imports",
         "--no-incremental", "--strict", str(STUB)],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
