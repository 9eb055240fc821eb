"""Build the C core (leapp._core) from csrc/*.c against the CPython C API and libyaml."""
import glob
import os

from setuptools import Extension, setup

sanitize = os.environ.get("LEAPP_SANITIZE") == "1"
extra_compile = ["-Wall", "-Wextra", "-Werror", "-std=c11", "-O2"]
extra_link = ["-lyaml"]
if sanitize:
    extra_compile += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                      "-fno-sanitize-recover=undefined"]
    extra_link += ["-fsanitize=address,undefined"]

setup(
    ext_modules=[
        Extension(
            "leapp._core",
            sources=sorted(glob.glob("csrc/*.c")),
            depends=["csrc/leapp.h"],
            libraries=["yaml"],
            extra_compile_args=extra_compile,
            extra_link_args=extra_link,
        )
    ]
)
