"""The compatibility matrix: a subset of the suite under other torch and NumPy releases.

``make test-matrix`` runs this script.  Each environment of :data:`ENVIRONMENTS`
is a side virtual environment under ``.matrix/`` holding one torch and one NumPy
release with leapp's runtime dependencies and the few test dependencies the
subset needs; the tree itself (with the C core built in place by ``make
build``) is what runs there, so every environment tests the same code.  The
default environment (the pinned torch with NumPy 2) is the project's own
``.venv``.

Environments are made once and reused (a stamp file records what was asked
for); pip's download cache makes a remade one cheap.  Run one environment with
``python tests/matrix.py --only torch2.7-numpy1.26``; ``--list`` prints them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX_DIR = os.path.join(ROOT, ".matrix")



def _pinned(package: str) -> str | None:
    """The release constraints.txt pins package to (torch: .venv's and .compat-venv's)."""
    with open(os.path.join(ROOT, "constraints.txt")) as handle:
        for line in handle:
            if line.strip().startswith(package + "=="):
                return line.split("==", 1)[1].strip()
    return None


PINNED_TORCH = _pinned("torch")
# name -> (torch, numpy, pins of other packages that must match that torch)
# torch 2.7 is the Isaac Lab 2.x line (Isaac Sim ships NumPy 1.26 with it); only
# CUDA builds of it exist on PyPI, and they run on the CPU.  tensordict releases
# follow torch releases: 0.9 is the line built for torch 2.7.
ENVIRONMENTS: dict[str, dict] = {
    "torch2.7-numpy1.26": {"torch": "2.7.1", "numpy": "1.26.4",
                           "pins": ["tensordict==0.9.1"]},
    "torch2.13-numpy1.26": {"torch": "2.13.0", "numpy": "1.26.4", "pins": []},
    "torch2.13-numpy2": {"torch": None, "numpy": None, "pins": []},  # the project's .venv
}

# The subset: tracing (NumPy inside nodes, state and feedback), every backend,
# InferenceManager, fuse, the examples and a real client library (rsl-rl-lib).
SUBSET = [
    "tests/test_api.py",
    "tests/test_backends.py",
    "tests/test_numpy.py",
    "tests/test_state.py",
    "tests/test_feedback.py",
    "tests/test_inference_manager.py",
    "tests/test_fuse.py",
    "tests/test_examples.py",
    "tests/test_rsl_rl.py",
    # what a traced program may do: guards, TorchScript callables, in-place writes,
    # upstream's call shapes; inputs at run time; contracts in every artifact; fleets
    "tests/test_guards.py",
    "tests/test_scripted.py",
    "tests/test_mutations.py",
    "tests/test_upstream_calls.py",
    "tests/test_run_inputs.py",
    "tests/test_contract.py",
    "tests/test_fleet.py",
    # the ONNX writer's rules, each held to this environment's eager
    "tests/test_onnx_writer.py",
]

# What the subset imports beyond leapp's own dependencies.
TEST_REQUIREMENTS = ["pytest>=7", "rsl-rl-lib==5.5.1", "tensordict"]


def _python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def _runtime_requirements() -> list[str]:
    """leapp's dependencies as pyproject.toml states them, torch and numpy left out."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    return [d for d in deps if not d.split(">")[0].split("=")[0].strip() in ("torch", "numpy")]


def _constraints(spec: dict, path: str) -> None:
    """constraints.txt with torch and numpy pinned to the environment's releases."""
    with open(os.path.join(ROOT, "constraints.txt")) as handle:
        lines = [line for line in handle.read().splitlines()
                 if not line.strip().startswith(("torch==", "numpy=="))]
    lines += [f"torch=={spec['torch']}", f"numpy=={spec['numpy']}", *spec["pins"]]
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def ensure_environment(name: str) -> str:
    """The environment's interpreter, its venv made (or remade) when needed."""
    spec = ENVIRONMENTS[name]
    if spec["torch"] is None:
        return _python(os.path.join(ROOT, ".venv"))
    venv = os.path.join(MATRIX_DIR, name)
    stamp = os.path.join(venv, ".leapp-matrix.json")
    wanted = json.dumps({**spec, "runtime": _runtime_requirements(),
                         "test": TEST_REQUIREMENTS}, sort_keys=True)
    if os.path.exists(stamp):
        with open(stamp) as handle:
            if handle.read() == wanted:
                return _python(venv)
        shutil.rmtree(venv)
    print(f"[matrix] creating {os.path.relpath(venv, ROOT)} "
          f"(torch=={spec['torch']}, numpy=={spec['numpy']})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    constraints = os.path.join(venv, "constraints.txt")
    _constraints(spec, constraints)
    pip = [_python(venv), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "-c", constraints]
    # torch and numpy first, on their own, so nothing else picks their releases.
    subprocess.run(pip + [f"torch=={spec['torch']}", f"numpy=={spec['numpy']}"], check=True)
    subprocess.run(pip + _runtime_requirements() + TEST_REQUIREMENTS + spec["pins"], check=True)
    with open(stamp, "w") as handle:
        handle.write(wanted)
    return _python(venv)


def describe(python: str) -> str:
    probe = ("import sys, torch, numpy, onnx, onnxruntime; "
             "print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, "
             "numpy {numpy.__version__}, onnx {onnx.__version__}, "
             "onnxruntime {onnxruntime.__version__}')")
    return subprocess.run([python, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip()


def run_subset(name: str, python: str, extra: list[str]) -> int:
    env = dict(os.environ, PYTHONPATH=ROOT, TQDM_DISABLE="1")
    if ENVIRONMENTS[name]["torch"] not in (None, PINNED_TORCH):
        # Upstream's side environment (.compat-venv) runs the pinned torch, whose
        # exports (default opset, system information) differ from this torch's.
        env["LEAPP_UPSTREAM_PYTHON"] = "none"
    print(f"[matrix] {name}: {describe(python)}", flush=True)
    started = time.monotonic()
    status = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:warnings", *extra,
                             *SUBSET], cwd=ROOT, env=env).returncode
    print(f"[matrix] {name}: {'passed' if status == 0 else 'FAILED'} "
          f"in {time.monotonic() - started:.0f} s", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(ENVIRONMENTS),
                        help="run this environment only (repeatable)")
    parser.add_argument("--side-only", action="store_true",
                        help="leave out the project's .venv, where `make test` runs the "
                             "whole suite (CI runs that first)")
    parser.add_argument("--list", action="store_true", help="print the environments")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest")
    args = parser.parse_args(argv)
    if args.list:
        for name, spec in ENVIRONMENTS.items():
            print(name, spec["torch"] or "(the project's .venv)", spec["numpy"] or "")
        return 0
    names = args.only or list(ENVIRONMENTS)
    if args.side_only:
        names = [name for name in names if ENVIRONMENTS[name]["torch"] is not None]
    failed = []
    for name in names:
        if run_subset(name, ensure_environment(name), args.pytest_args) != 0:
            failed.append(name)
    print(f"[matrix] {len(names) - len(failed)} environment(s) passed"
          + (f", failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
