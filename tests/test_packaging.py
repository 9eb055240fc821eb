"""What pip, users and the YAML see of this build: its version, its implementation
marker, and the source build's checks (setup.py) before any compiler runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

import leapp
from support import ROOT


def test_version_is_distinct_yet_satisfies_upstream_pins():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    version = Version(leapp.__version__)
    assert version.public == "0.7.2" and version.local  # distinct from upstream's 0.7.2
    for spec in ("==0.7.2", "~=0.7.2", ">=0.7.2,<0.8", "==0.7.*"):
        assert version in SpecifierSet(spec), spec
    assert version not in SpecifierSet("==0.7.2+upstream")
    assert leapp.__implementation__ == "c"
    assert "__implementation__" in leapp.__all__


def test_one_source_of_truth_for_the_version():
    from leapp import _version
    from leapp.compiling import compiler

    assert leapp.__version__ is _version.__version__ is compiler.__version__
    with open(os.path.join(ROOT, "pyproject.toml")) as handle:
        text = handle.read()
    assert 'dynamic = ["version"]' in text
    assert 'version = {attr = "leapp._version.__version__"}' in text
    assert "0.7.2" not in text


def test_yaml_records_this_build_version(tmp_path):
    import torch

    leapp.start("versioned", save_path=str(tmp_path))
    x = annotate_input(torch.ones(1, 2))
    leapp.annotate.output_tensors("node", {"y": x * 2}, export_with="jit")
    leapp.stop()
    leapp.compile_graph()
    with open(tmp_path / "versioned" / "versioned.yaml") as handle:
        system = yaml.safe_load(handle)["system information"]
    assert system["leapp version"] == leapp.__version__
    assert system["leapp config version"] == leapp.__config_version__


def annotate_input(x):
    return leapp.annotate.input_tensors("node", {"x": x})


def _setup_py(*args, env=None, cwd=ROOT):
    return subprocess.run([sys.executable, "setup.py", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def test_source_build_without_libyaml_names_the_package(tmp_path):
    """No yaml.h on the include path: set-up stops before compiling, naming the package."""
    env = dict(os.environ, LEAPP_YAML_INCLUDE_DIRS=str(tmp_path))  # searched instead of /usr/...
    result = _setup_py("-q", "build_ext", "--build-temp", str(tmp_path / "tmp"),
                       "--build-lib", str(tmp_path / "lib"), env=env)
    assert result.returncode != 0
    message = result.stderr + result.stdout
    assert "libyaml" in message
    for hint in ("libyaml-dev", "libyaml-devel", "brew install libyaml"):
        assert hint in message, hint
    assert "yaml.h: No such file" not in message
    assert not (tmp_path / "tmp").exists()  # nothing was compiled


def test_source_build_without_libyaml_on_the_compiler_path(tmp_path):
    """The default probe: a compiler that cannot find yaml.h (a wrapper that fails
    as gcc does without libyaml-dev) stops the build with the same message."""
    fake_cc = tmp_path / "cc-without-libyaml"
    fake_cc.write_text("#!/bin/sh\n"
                       "for a in \"$@\"; do case \"$a\" in *.c) if grep -q yaml.h \"$a\"; then\n"
                       "  echo \"$a: fatal error: yaml.h: No such file or directory\" >&2; exit 1; fi;;"
                       " esac; done\nexec gcc \"$@\"\n")
    fake_cc.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LEAPP_YAML_INCLUDE_DIRS"}
    env.update(CC=str(fake_cc), LDSHARED=f"{fake_cc} -shared")
    result = _setup_py("-q", "build_ext", "--build-temp", str(tmp_path / "tmp"),
                       "--build-lib", str(tmp_path / "lib"), env=env)
    assert result.returncode != 0
    assert "sudo apt-get install libyaml-dev" in result.stderr
    assert "brew install libyaml" in result.stderr
    assert not list(tmp_path.glob("tmp/**/*.o"))  # stopped before the first source


def test_werror_only_in_development_builds():
    probe = ("import sys, runpy; sys.argv = ['setup.py', '--name'];"
             "import setuptools; calls = [];"
             "setuptools.setup = lambda **kw: calls.append(kw);"
             "runpy.run_path('setup.py');"
             "print(calls[0]['ext_modules'][0].extra_compile_args)")

    def flags(**extra):
        env = {k: v for k, v in os.environ.items() if k != "LEAPP_DEV_BUILD"}
        env.update(extra)
        result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                                text=True, timeout=60, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "-Werror" not in flags()
    assert "-Werror" in flags(LEAPP_DEV_BUILD="1")


def test_license_and_sdist_manifest():
    assert os.path.exists(os.path.join(ROOT, "LICENSE"))
    with open(os.path.join(ROOT, "LICENSE")) as handle:
        assert "Apache License" in handle.read(2000)
    with open(os.path.join(ROOT, "MANIFEST.in")) as handle:
        manifest = handle.read()
    for needed in ("LICENSE", "tests", "csrc", "examples", "constraints.txt"):
        assert needed in manifest, needed


#: The stage packages (docs/architecture.md): each must reach the sdist and the wheel.
STAGES = ("bundle", "tracing", "models", "compiling", "compiling/backends",
          "compiling/onnx_writer", "compiling/onnx_writer/rules", "running", "serving",
          "drawing", "drawing/png", "drawing/html", "utils")


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")), reason="not a git checkout")
def test_sdist_holds_the_tests_and_their_support_files(tmp_path):
    result = _setup_py("-q", "sdist", "--dist-dir", str(tmp_path), "--formats", "gztar")
    assert result.returncode == 0, result.stderr
    assert "SetuptoolsDeprecationWarning" not in result.stderr
    import tarfile

    (archive,) = list(tmp_path.glob("*.tar.gz"))
    assert archive.name.startswith("leapp-0.7.2+c1") or archive.name.startswith("leapp-0.7.2")
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for needed in ("LICENSE", "setup.py", "pyproject.toml", "constraints.txt", "csrc/leapp.h",
                   "tests/conftest.py", "tests/support.py", "tests/test_examples.py",
                   "examples/getting_started.py", "leapp/_version.py", "leapp/utils/__init__.py",
                   "leapp/py.typed", "leapp/annotate.pyi", "csrc/program_build.c",
                   "csrc/trace_inactive.c", "leapp/serving/triton_model.py",
                   *(f"leapp/{stage}/__init__.py" for stage in STAGES)):
        assert needed in names, needed
    tracked = subprocess.run(["git", "ls-files", "tests"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    missing = [name for name in tracked if name not in names]
    assert not missing, missing[:10]
