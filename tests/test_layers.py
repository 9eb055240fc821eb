"""leapp's stages import downward only, and no module reaches into another's privates.

The package is layered as the data flows (docs/architecture.md, "Stages and doors"):

    bundle < tracing < drawing < models < compiling < running < serving

A module may import its own stage and the stages below it, plus the root modules
everything stands on (``leapp._core``, ``leapp._version``).  The rest of the package root
is the public face (``leapp``, ``leapp.annotate``, ``leapp.semantics``, ``leapp.cli``, the
thin public paths such as ``leapp.fusion``, upstream's ``leapp.leapp`` /
``leapp.export_manager`` / ``leapp.utils``): it may import any stage, and no stage imports
it.  A stage that has to reach a later one goes through that stage's one door
(:data:`DOORS`): compiling replays the staged bundle through running's closed loop and
fuses it through serving's fusion.

The imports are read with the import-cycle test's reader (lazy imports and
``importlib`` loads included), so nothing is imported here.
"""
from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from test_import_cycles import PACKAGE, import_graph, module_names

STAGES = ("bundle", "tracing", "drawing", "models", "compiling", "running", "serving")
BASE = {"leapp._core", "leapp._version"}
FACE = -1  # rank of the public face: above every stage, never imported by one

#: The one module of a stage that the stages below it may import (what compile_graph needs
#: of running and serving); a stage without an entry has no door.
DOORS = {"running": "leapp.running.closed_loop", "serving": "leapp.serving.fusion"}


def rank(module: str) -> int:
    """A stage module's rank, 0 for the core and version, FACE for the public face."""
    if module in BASE:
        return 0
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return 1 + STAGES.index(parts[1])
    return FACE


def is_door(target: str) -> bool:
    parts = target.split(".")
    return len(parts) > 1 and DOORS.get(parts[1]) == target


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a stage module that runs up: into the public face, or into a later
    stage anywhere but its door."""
    found = []
    for module, targets in sorted(graph.items()):
        here = rank(module)
        if here == FACE:
            continue
        for target in sorted(targets):
            there = rank(target)
            if there == FACE or (there > here and not is_door(target)):
                found.append(f"{module} -> {target}")
    return found


def test_stages_are_packages():
    root = [p for p in PACKAGE.iterdir()
            if p.suffix in (".py", ".so", ".pyd") and p.name.split(".")[0].isidentifier()]
    names = {p.name.split(".")[0] for p in root} | {"_core"}
    assert len(names) <= 15, sorted(names)
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage
    for door in DOORS.values():
        assert door in module_names(PACKAGE), door


def test_no_import_runs_back_up_a_stage():
    graph = import_graph(PACKAGE)
    assert "leapp.bundle.pipeline" in graph["leapp.serving.fused_plan"]  # the walk saw imports
    assert upward(graph) == []


def test_no_stage_imports_the_public_face():
    graph = import_graph(PACKAGE)
    faces = sorted(f"{m} -> {t}" for m, targets in graph.items() if rank(m) != FACE
                   for t in targets if rank(t) == FACE)
    assert faces == []


def test_the_doors_are_the_ways_up_that_compiling_takes():
    """Each door is used (a door nobody needs is no door), and from below only."""
    graph = import_graph(PACKAGE)
    used = {t: sorted(m for m, targets in graph.items()
                      if t in targets and rank(m) != FACE and rank(m) < rank(t))
            for t in DOORS.values()}
    assert used == {"leapp.running.closed_loop": ["leapp.compiling.compiler"],
                    "leapp.serving.fusion": ["leapp.compiling.compiler"]}


#: The one module through which serving reaches each lower part it builds on: the ONNX
#: writing of the compiling stage (a callable written, the opset, saving a model) and the
#: model loaders.
SERVING_DOORS = {"compiling": {"leapp.compiling.onnx_callable"},
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


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    package = tmp_path / "leapp"
    for stage in ("bundle", "running", "serving"):
        (package / stage).mkdir(parents=True)
        (package / stage / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    return package


def test_an_upward_import_is_reported(tmp_path):
    package = _package(tmp_path, {
        "serving/b.py": "from ..bundle import a\n",
        "bundle/a.py": "import importlib\ndef f():\n"
                       "    return importlib.import_module('leapp.serving.b')\n"})
    assert upward(import_graph(package)) == ["leapp.bundle.a -> leapp.serving.b"]


def test_a_door_is_the_only_way_up_and_the_face_none(tmp_path):
    package = _package(tmp_path, {
        "running/closed_loop.py": "", "running/other.py": "", "fusion.py": "",
        "bundle/a.py": "from ..running import closed_loop\n",      # the door: allowed
        "bundle/b.py": "def f():\n    from ..running import other\n",  # beside it: refused
        "bundle/c.py": "from .. import fusion\n"})                  # the face: refused
    assert upward(import_graph(package)) == ["leapp.bundle.b -> leapp.running.other",
                                             "leapp.bundle.c -> leapp.fusion"]


@pytest.mark.parametrize("module, planted, expected", [
    ("compiling/validation.py", "from ..serving import fleet\n",
     "leapp.compiling.validation -> leapp.serving.fleet"),
    ("bundle/digest.py", "def _late():\n    from ..running import inference_manager\n",
     "leapp.bundle.digest -> leapp.running.inference_manager"),
    ("tracing/payload.py", "from .. import semantics\n", "leapp.tracing.payload -> leapp.semantics"),
    ("compiling/publish.py", "import leapp.inference_manager\n",
     "leapp.compiling.publish -> leapp.inference_manager"),
])
def test_an_upward_import_planted_in_a_copy_of_leapp_is_reported(tmp_path, module, planted,
                                                                 expected):
    """The real package copied, one upward import planted: the check names exactly it."""
    copy = tmp_path / "leapp"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    assert upward(import_graph(copy)) == []
    with open(copy / module, "a", encoding="utf-8") as handle:
        handle.write(planted)
    assert upward(import_graph(copy)) == [expected]


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
            if m.split(".")[1:2] in (["compiling"], ["drawing"])] == []


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
