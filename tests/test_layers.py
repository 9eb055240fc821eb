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
import json
import os
import pathlib
import subprocess
import sys

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


#: The one module through which serving reaches each lower part it builds on: the ONNX
#: writer of the compiling stage (the opset, saving a model) and the model loaders.
SERVING_DOORS = {"compiling": {"leapp.compiling.backends.onnx"},
                 "models": {"leapp.models.load"}}


def test_serving_reaches_the_writer_and_the_loaders_each_through_one_door():
    graph = import_graph(PACKAGE)
    reached: dict[str, set[str]] = {stage: set() for stage in SERVING_DOORS}
    for module, targets in graph.items():
        if module.startswith("leapp.serving."):
            for target in targets:
                stage = target.split(".")[1] if target.count(".") >= 1 else ""
                if stage in reached and target != f"leapp.{stage}":
                    reached[stage].add(target)
    assert reached == SERVING_DOORS


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


# ---- the runtime in a process of its own ------------------------------------------------

#: Runs the upstream bundles (a TorchScript chain, an ONNX model with state) in a fresh
#: interpreter and prints the leapp modules it imported.
RUN_ONLY = """
import json, os, sys
from leapp.running.inference_manager import InferenceManager
for name in ("chain", "stateful"):
    manager = InferenceManager(os.path.join(sys.argv[1], name, name + ".yaml"))
    manager.run_policy(manager.get_mock_input())
print(json.dumps(sorted(m for m in sys.modules if m.startswith("leapp"))))
"""


def test_the_runtime_never_imports_the_compiling_stage():
    """Model loading sits below compiling and running: a process that only runs bundles
    imports neither the compiling stage (exporters, validation) nor the drawing."""
    bundles = pathlib.Path(__file__).parent / "data" / "upstream"
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", RUN_ONLY, str(bundles)], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert {"leapp.running.inference_manager", "leapp.models.load",
            "leapp.models.onnx_runner"} <= set(loaded)  # it did load both kinds of model
    assert [m for m in loaded
            if m.split(".")[1:2] in (["compiling"], ["view"], ["visualization"])] == []


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
    leapp.tracing.session_state alone (its start / stop)."""
    found = []
    for name, path in sorted(module_names(PACKAGE).items()):
        if path is None or name == "leapp.tracing.session_state":
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
