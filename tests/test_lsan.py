"""LeakSanitizer is on where `make test-asan` says it is: in its leak-checked part
(tests/c, tests/test_leaks.py and this file, run with detect_leaks=1 and
PYTHONMALLOC=malloc), a process that loses malloc'ed memory fails at exit.

Outside that run (no sanitizer, or the whole suite with detect_leaks=0) there
is nothing to check and the test is skipped.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

LEAK_CHECKED = "detect_leaks=1" in os.environ.get("ASAN_OPTIONS", "") \
    and bool(os.environ.get("LD_PRELOAD"))


@pytest.mark.skipif(not LEAK_CHECKED, reason="only under make test-asan's leak-checked part")
@pytest.mark.parametrize("leak", [False, True])
def test_lost_memory_fails_the_process(leak):
    # 64 blocks of an odd size, their addresses dropped: unreachable at exit.
    code = ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n"
            "blocks = [libc.malloc(12345) for _ in range(64)]\n"
            + ("blocks = None\n" if leak else "[libc.free(ctypes.c_void_p(b)) for b in blocks]\n"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    if leak:
        assert proc.returncode != 0, proc.stderr[-3000:]
        assert f"{64 * 12345} byte(s) in 64 object(s)" in proc.stderr, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
