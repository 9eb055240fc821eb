"""The CPU side of `make test-device` (tests/device/run.py): what it carries and decides.

The GPU run itself needs a GPU machine; these check, here, the pieces it relies on:
the carried libyaml compiles and links, the carried upstream wheel imports as 0.7.2
through the wrapper interpreter, the pytest summary, the pipelines' list, the
report's verdict, and the `cuda` marker skipping without a GPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from support import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "device"))
import run as device  # noqa: E402  (tests/device/run.py)


def test_the_carried_libyaml_compiles_and_links(tmp_path):
    env, which = device.libyaml_env(force_vendored=True)
    assert which.startswith("carried")
    include, library = env["LEAPP_YAML_INCLUDE_DIRS"], env["LEAPP_YAML_LIBRARY_DIRS"]
    assert os.path.isfile(os.path.join(include, "yaml.h"))
    assert os.path.isfile(os.path.join(library, "libyaml.a"))
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    source = tmp_path / "probe.c"
    source.write_text('#include <stdio.h>\n#include <yaml.h>\n'
                      'int main(void) { puts(yaml_get_version_string()); return 0; }\n')
    binary = tmp_path / "probe"
    subprocess.run([compiler, str(source), "-I", include, os.path.join(library, "libyaml.a"),
                    "-o", str(binary)], check=True, capture_output=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "0.2.5"


def test_the_carried_upstream_wheel_runs_through_the_wrapper(tmp_path):
    wrapper = device.unpack_upstream(str(tmp_path))
    version, where = device.describe_upstream(wrapper).split(" ", 1)
    assert version == "0.7.2"
    assert where == os.path.join(str(tmp_path), "upstream-site", "leapp")


def test_the_pytest_summary(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pass\n"
        "def test_bad():\n    assert False\n"
        "@pytest.mark.skip(reason='x')\ndef test_skipped():\n    pass\n")
    xml = tmp_path / "out.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", str(tmp_path / "test_sample.py")],
                   capture_output=True, cwd=str(tmp_path))
    summary = device.junit_summary(str(xml))
    assert (summary["passed"], summary["failures"], summary["skipped"]) == (1, 1, 1)
    assert summary["failed"] == ["test_sample::test_bad"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the tests run")
def test_cuda_tests_skip_cleanly_without_a_gpu(tmp_path):
    xml = tmp_path / "cuda.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "-m",
                           "cuda", f"--junitxml={xml}", "-rs", "tests/test_cuda.py"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    summary = device.junit_summary(str(xml))
    assert summary["tests"] >= 10 and summary["skipped"] == summary["tests"], proc.stdout
    assert "no CUDA GPU: torch.cuda.is_available() is False" in proc.stdout


def test_the_pipelines_and_the_verdict():
    names = device.pipelines()
    assert {"device_chain", "device_state", "device_module_buffers"} <= set(names)
    with pytest.raises(SystemExit, match="unknown pipelines"):
        device.pipelines(["nope"])
    built = {"ok": True, "werror": True, "libyaml": "x", "seconds": 1, "core": "c", "log": ""}
    ran = {"ran": True, "passed": 3, "failures": 0, "errors": 0, "skipped": 1, "exit": 0,
           "failed": [], "seconds": 1, "tail": ""}
    assert device.verdict_ok(built, ran, [{"ok": True}])
    assert not device.verdict_ok(dict(built, ok=False), ran, [])
    assert not device.verdict_ok(built, dict(ran, failures=1, exit=1), [])
    assert not device.verdict_ok(built, ran, [{"ok": True}, {"ok": False}])
    assert not device.verdict_ok(built, {"ran": False, "files": ["t.py"], "reason": "x"}, [])
    env = {"python": "3.12.3", "executable": "py", "platform": "p", "packages": {},
           "missing": ["rsl_rl"], "onnxruntime providers": ["CUDAExecutionProvider"],
           "gpu": "NVIDIA H100", "torch": "2.11.0+cu128", "torch cuda": "12.8"}
    text = device.report_text(env, built, ran, [{"ok": True, "text": "[p] identical"}], "0.7.2")
    assert "## Build (the first build of the C core on Python 3.12.3)" in text
    assert "- 3 passed, 0 failed, 1 skipped" in text and text.rstrip().endswith("**PASSED**")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_without_a_gpu_the_run_stops_unless_allowed(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "device", "run.py"),
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "torch sees no GPU (--allow-cpu runs anyway)" in proc.stderr
    assert (tmp_path / "device-report.md").read_text().rstrip().endswith("**FAILED**")
