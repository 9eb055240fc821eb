"""leapp's stages import downward only, and no module reaches into another's privates.

The package is layered as the data flows (docs/architecture.md, "Stages"):

    bundle < tracing < visualization < view < models < compiling < running < serving

A module may import its own stage and the stages below it, plus the three
root modules everything stands on (``leapp._core``, ``leapp._version``,
``leapp.semantics``).  The rest of the package root is the public face
(``leapp``, ``leapp.annotate``, ``leapp.cli``, the thin public paths such as
``leapp.fusion``, upstream's ``leapp.leapp`` / ``leapp.export_manager`` /
``leapp.utils``): it may import any stage, and a stage that has to reach a
later one goes through it (``compile_graph(fuse=True)`` calls ``leapp.fusion``).

The imports are read with the import-cycle test's reader (lazy imports and
``importlib`` loads included), so nothing is imported here.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

from test_import_cycles import PACKAGE, import_graph, module_names

STAGES = ("bundle", "tracing", "visualization", "view", "models", "compiling", "running",
          "serving")
BASE = {"leapp._core", "leapp._version", "leapp.semantics"}
FACE = -1  # rank of the public face: above every stage, reached from below only by name


def rank(module: str) -> int | None:
    """A stage module's rank, 0 for the core and version, FACE for the public face."""
    if module == "leapp.semantics":
        return 1  # the bundle's vocabulary (TensorSemantics, the kinds): the bundle's rank
    if module in BASE:
        return 0
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return 1 + STAGES.index(parts[1])
    return FACE


def upward(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = rank(module)
        if here == FACE:
            continue
        for target in sorted(targets):
            there = rank(target)
            if there != FACE and there > here:
                found.append(f"{module} -> {target}")
    return found


def test_stages_are_packages():
    root = [p for p in PACKAGE.iterdir()
            if p.suffix in (".py", ".so", ".pyd") and p.name.split(".")[0].isidentifier()]
    names = {p.name.split(".")[0] for p in root} | {"_core"}
    assert len(names) <= 15, sorted(names)
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_no_import_runs_back_up_a_stage():
    graph = import_graph(PACKAGE)
    assert "leapp.bundle.pipeline" in graph["leapp.serving.fused_plan"]  # the walk saw imports
    assert upward(graph) == []


def test_a_stage_reaches_a_later_one_only_through_the_public_face():
    graph = import_graph(PACKAGE)
    faces = {t for m, targets in graph.items() if rank(m) != FACE
             for t in targets if rank(t) == FACE}
    # the public face a stage may call into: thin public paths, never the CLI or upstream's
    assert faces <= {"leapp.fusion", "leapp.triton", "leapp.fleet", "leapp.pipeline",
                     "leapp.inference_manager", "leapp.triton_server"}, sorted(faces)


def test_an_upward_import_is_reported(tmp_path):
    package = tmp_path / "leapp"
    for stage in ("bundle", "serving"):
        (package / stage).mkdir(parents=True)
        (package / stage / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "serving" / "b.py").write_text("from ..bundle import a\n")
    (package / "bundle" / "a.py").write_text(
        "import importlib\ndef f():\n    return importlib.import_module('leapp.serving.b')\n")
    assert upward(import_graph(package)) == ["leapp.bundle.a -> leapp.serving.b"]


# ---- private names -------------------------------------------------------------------

#: Private state named in issue 23: InferenceManager's program and slot table.
PRIVATE_STATE = {"_program", "_slot_of"}


def private_reaches(root: pathlib.Path) -> list[str]:
    """`from .x import _y` of another module's private name, and reads of PRIVATE_STATE
    on anything but self / cls."""
    modules = module_names(root)
    found = []
    for name, path in sorted(modules.items()):
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                if prefix.split(".")[0] != root.name:
                    continue
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and f"{prefix}.{alias.name}" not in modules:
                        found.append(f"{name}: from {prefix} import {alias.name}")
            elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_STATE:
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    found.append(f"{name}: reads {ast.unparse(node)}")
    return found


def test_no_module_imports_another_modules_private_names():
    assert private_reaches(PACKAGE) == []


def test_only_the_session_owner_writes_the_session_state():
    """SESSION's fields (config, patches, the NumPy switch, ...) are assigned in
    leapp.tracing.state alone (its start / stop)."""
    found = []
    for name, path in sorted(module_names(PACKAGE).items()):
        if path is None or name == "leapp.tracing.state":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                            and sub.value.id == "SESSION":
                        found.append(f"{name}: assigns {ast.unparse(sub)}")
    assert found == []


@pytest.mark.parametrize("source, expected", [
    ("from ..bundle.a import _hidden\n", ["leapp.serving.b: from leapp.bundle.a import _hidden"]),
    ("def f(m):\n    return m._program\n", ["leapp.serving.b: reads m._program"]),
    ("from ..bundle import a\nclass C:\n    def f(self):\n        return self._program\n", []),
])
def test_a_private_reach_is_reported(tmp_path, source, expected):
    package = tmp_path / "leapp"
    for stage in ("bundle", "serving"):
        (package / stage).mkdir(parents=True)
        (package / stage / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "bundle" / "a.py").write_text("_hidden = 1\n")
    (package / "serving" / "b.py").write_text(source)
    assert private_reaches(package) == expected
