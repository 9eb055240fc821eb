"""leapp's modules import one another without a cycle.

Every import statement counts, the ones inside functions too: a lazy import
only hides a cycle until someone moves it, and two modules that need each
other are one concern split in two.  The graph is read from the sources
with ast (nothing is imported); a package's own submodules importing the
package they live in (``from . import _core``) is not an edge, since Python
runs a package's ``__init__`` before any of its submodules anyway.

Loads through ``importlib.import_module`` (or ``__import__``) count too: a
module that calls it imports every package module its source names in a
string (``"leapp.compiling.backends.jit"``, or ``".jit"`` relative to its package), and
a load whose name is computed from ``__name__`` / ``__package__`` is refused,
since no reader can tell where it goes.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "leapp"


def module_names(root: pathlib.Path) -> dict[str, pathlib.Path | None]:
    """Dotted name -> source file of every module of the package (None: no Python source)."""
    found: dict[str, pathlib.Path | None] = {}
    for path in root.rglob("*"):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        stem = path.name.split(".")[0]
        if not (path.suffix in (".py", ".pyi", ".so", ".pyd") and stem.isidentifier()):
            continue
        parts = [root.name, *path.relative_to(root).parent.parts]
        if stem != "__init__":
            parts.append(stem)
        name = ".".join(parts)
        if path.suffix == ".py" or name not in found:
            found[name] = path if path.suffix == ".py" else found.get(name)
    return found


def imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             modules: dict) -> set[str]:
    """The package's modules that one import statement of `module` loads."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    targets = set()
    for alias in node.names:
        sub = f"{prefix}.{alias.name}"
        targets.add(sub if sub in modules else prefix)
    return {t for t in targets if t in modules}


_DYNAMIC = ("import_module", "__import__")


def _is_dynamic_load(node: ast.AST) -> bool:
    """Whether node calls importlib.import_module / import_module / __import__."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in _DYNAMIC


def _names_own_package(node: ast.AST) -> bool:
    """Whether an expression is computed from __name__ / __package__."""
    return any(isinstance(n, ast.Name) and n.id in ("__name__", "__package__")
               for n in ast.walk(node))


def dynamic_imports(module: str, is_package: bool, tree: ast.AST,
                    modules: dict) -> set[str]:
    """The package's modules that module's importlib loads may reach: every package
    module its source names in a string, once it calls import_module at all."""
    calls = [n for n in ast.walk(tree) if _is_dynamic_load(n)]
    if not calls:
        return set()
    for call in calls:
        if call.args and not isinstance(call.args[0], ast.Constant) \
                and _names_own_package(call.args[0]):
            raise AssertionError(f"{module}: importlib load of a computed name "
                                 f"({ast.unparse(call.args[0])}); spell the module names out "
                                 f"as strings so the import graph sees them")
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        text = node.value
        if text.startswith(".") and text[1:].replace(".", "").isidentifier():
            level = len(text) - len(text.lstrip("."))
            base = package[:len(package) - (level - 1)]
            text = ".".join(base + [text.lstrip(".")])
        if text in modules:
            found.add(text)
    return found


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports, anywhere in its source."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        if path is not None:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    edges |= imported(name, path.name == "__init__.py", node, modules)
            edges |= dynamic_imports(name, path.name == "__init__.py", tree, modules)
        # A package's __init__ runs before its submodules: importing it is no edge.
        graph[name] = {t for t in edges if t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_leapp_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "leapp._core" in graph and "leapp.compiling.backends" in graph  # the walk saw the package
    assert "leapp.tracing.ops" in graph["leapp.tracing.alias"]                  # and its imports
    assert "leapp.compiling.backends.byom" in graph["leapp.compiling.backends"]       # and its importlib loads
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(describe(c, graph) for c in found)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_cycle_is_reported(tmp_path, lazy):
    """The checker itself: a cycle through a function-level import is found."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    back = "def f():\n    from .. import a\n" if lazy else "from ..a import name\n"
    (package / "sub" / "b.py").write_text(back)
    graph = import_graph(package)
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    (package / "sub" / "b.py").write_text("from . import __name__ as own\n")
    assert cycles(import_graph(package)) == []


@pytest.mark.parametrize("spelling", ['"pkg.a"', '".a"'])
def test_a_cycle_through_importlib_is_reported(tmp_path, spelling):
    """A load through importlib.import_module is an edge like an import statement."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text(
        f"import importlib\ndef f():\n    return importlib.import_module({spelling}, "
        f"'pkg')\n")
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.b"]]


def test_a_computed_importlib_load_is_refused(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import importlib\ndef f(x):\n    return importlib.import_module(f'{__name__}.{x}')\n")
    with pytest.raises(AssertionError, match="computed name"):
        import_graph(package)
