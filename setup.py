"""Build the C core (leapp._core) from csrc/*.c against the CPython C API and libyaml.

Environment:
  LEAPP_DEV_BUILD=1           warnings are errors (-Werror): the Makefile and CI set it;
                              users' builds (pip install) warn and go on.
  LEAPP_SANITIZE=1            ASan + UBSan build with assert() on and signed overflow
                              checked (make test-asan): CI checks the invariants csrc/
                              states under the sanitizers.
  LEAPP_DEBUG_BUILD=1         -O0 -g3 with assert() on: the invariants csrc/ states are
                              checked at run time (make debug); release builds drop them.
  LEAPP_YAML_INCLUDE_DIRS     where yaml.h lies when it is not on the compiler's path
  LEAPP_YAML_LIBRARY_DIRS     (os.pathsep-separated), e.g. a libyaml built from source.
"""
import glob
import os
import shutil
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

LIBYAML_MISSING = """
leapp's C core needs libyaml's development files (yaml.h and libyaml), and yaml.h
was not found{where}.  Install them, then build again:

    Debian / Ubuntu:        sudo apt-get install libyaml-dev
    Fedora / RHEL / CentOS: sudo dnf install libyaml-devel
    Alpine:                 apk add yaml-dev
    macOS (Homebrew):       brew install libyaml
    conda:                  conda install -c conda-forge yaml

or point LEAPP_YAML_INCLUDE_DIRS / LEAPP_YAML_LIBRARY_DIRS at a libyaml installed
elsewhere.  The published wheels bundle libyaml and need none of this.
"""


def _dirs(name):
    return [d for d in os.environ.get(name, "").split(os.pathsep) if d]


class build_ext(_build_ext):
    """Checks for yaml.h before compiling anything, so that a missing libyaml is a
    message naming the package to install, not `yaml.h: No such file or directory`."""

    def build_extensions(self):
        self._check_libyaml()
        super().build_extensions()

    def _check_libyaml(self):
        given = _dirs("LEAPP_YAML_INCLUDE_DIRS")
        if given:  # only there: the compiler's default path is not consulted
            if not any(os.path.exists(os.path.join(d, "yaml.h")) for d in given):
                sys.exit("error: " + LIBYAML_MISSING.format(
                    where=" in LEAPP_YAML_INCLUDE_DIRS=" + os.pathsep.join(given)))
            return
        scratch = tempfile.mkdtemp(prefix="leapp-yaml-probe-")
        try:
            source = os.path.join(scratch, "probe.c")
            with open(source, "w") as handle:
                handle.write("#include <yaml.h>\nint main(void) { return 0; }\n")
            try:
                self.compiler.compile([source], output_dir=scratch,
                                      include_dirs=self.include_dirs or [])
            except Exception:
                sys.exit("error: " + LIBYAML_MISSING.format(where=" on the compiler's path"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


extra_compile = ["-Wall", "-Wextra", "-std=c11"]
if os.environ.get("LEAPP_DEBUG_BUILD") == "1":
    extra_compile += ["-O0", "-g3", "-UNDEBUG"]  # Python's own flags bring -DNDEBUG
else:
    extra_compile.append("-O2")
if os.environ.get("LEAPP_DEV_BUILD") == "1":
    extra_compile.append("-Werror")
extra_link = []
if os.environ.get("LEAPP_SANITIZE") == "1":
    # -fno-wrapv: CPython's flags bring -fwrapv, under which UBSan does not check
    # signed overflow; the core must not rely on wrapping.
    extra_compile += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                      "-fno-sanitize-recover=undefined", "-UNDEBUG", "-fno-wrapv"]
    extra_link += ["-fsanitize=address,undefined"]

setup(
    cmdclass={"build_ext": build_ext},
    ext_modules=[
        Extension(
            "leapp._core",
            sources=sorted(glob.glob("csrc/*.c")),
            depends=sorted(glob.glob("csrc/*.h")),
            include_dirs=_dirs("LEAPP_YAML_INCLUDE_DIRS"),
            library_dirs=_dirs("LEAPP_YAML_LIBRARY_DIRS"),
            libraries=["yaml"],
            extra_compile_args=extra_compile,
            extra_link_args=extra_link,
        )
    ],
)
