"""The debug build (LEAPP_DEBUG_BUILD=1, `make debug`) compiles with -Werror, keeps
its assert()s, and its invariants hold over the core's graph and YAML code.

It is built into a temporary directory (the package's own build is left alone):
-O0 compiles in seconds.  The whole suite under it is `make test-debug` (`make debug test` would not do:
`test` builds the release core again first).
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import leaks
from support import ROOT


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without the sanitizer's preload (`make test-asan`): the compiler
    and this build are not instrumented."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    env.update(extra)
    return env


def test_debug_build_compiles_with_werror_and_keeps_its_asserts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--force",
         "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=_clean_env(LEAPP_DEV_BUILD="1", LEAPP_DEBUG_BUILD="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    built = glob.glob(str(tmp_path / "lib" / "leapp" / "_core*.so"))
    assert len(built) == 1
    with open(built[0], "rb") as handle:
        assert b"__assert_fail" in handle.read()  # assert() is compiled in, not NDEBUG'd out
    probe = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location("
             "'leapp._core', sys.argv[1]); m = importlib.util.module_from_spec(spec); "
             "spec.loader.exec_module(m); print(m.ASSERTS)")
    said = subprocess.run([sys.executable, "-c", probe, built[0]], capture_output=True,
                          text=True, timeout=60, env=_clean_env())
    assert said.stdout.strip() == "True", said.stderr[-2000:]

    # Its asserts hold (an assert failing aborts the child) and nothing leaks.
    measured = leaks.measure("graph_and_yaml", env=_clean_env(LEAPP_CORE_PATH=built[0]))
    assert leaks.differences(measured["graph_and_yaml"]["clean"]) == []
