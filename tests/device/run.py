"""`make test-device`: the whole path on a GPU machine, against upstream 0.7.2.

    python tests/device/run.py [--out DIR] [--tests FILE ...] [--pipelines NAME ...]
                               [--vendored-libyaml] [--allow-cpu] [--skip-upstream]

Run from the tree's root on a machine with an NVIDIA GPU, under that machine's
own Python and torch (a CUDA build; tests/device/run.sh finds them).  Nothing
is downloaded: the machine may have no network.

1. The environment: Python, torch, CUDA, the GPU, onnxruntime's providers, the
   packages present and missing.
2. The C core built in place with that Python (LEAPP_DEV_BUILD=1: warnings are
   errors; when that fails the build is tried again without, and both are
   reported).  Where the machine has no libyaml (yaml.h and the library), the
   copy carried in tests/device/vendor/libyaml/ (libyaml 0.2.5's header and its
   static library for x86-64 Linux, MIT licence in COPYRIGHT) is used.
3. The GPU tests (tests marked `cuda`, with their CPU halves) and the files given
   with --tests, through pytest.
4. The device pipelines (tests/device/pipelines/: traced on CUDA, every backend,
   declared and module-buffer state, rsl-rl-lib where installed) exported with our
   leapp and with upstream 0.7.2 (its wheel carried in tests/device/vendor/,
   unpacked into DIR, no dependency installed), compared by bench/compat.py: the
   YAML key by key, the initial values, and each bundle run by both
   InferenceManagers (on the GPU) for five steps.
5. DIR/device-report.md: a short report of all of it; the exit status is 0 only
   when every step passed.

--allow-cpu runs everything on a machine without a GPU (the cuda tests skip, the
pipelines trace on the CPU): the check of this script itself.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENDOR = os.path.join(HERE, "vendor")
PIPELINES = os.path.join(HERE, "pipelines")
UPSTREAM_WHEEL = os.path.join(VENDOR, "leapp-0.7.2-py3-none-any.whl")
DEFAULT_TESTS = ["tests/test_cuda.py"]
# What our leapp, its tests and upstream's need at run time (import names).
PACKAGES = ["torch", "numpy", "yaml", "onnx", "onnxruntime", "onnxscript", "onnx_ir",
            "safetensors", "PIL", "pytest", "rsl_rl", "tensordict", "tqdm", "setuptools"]
HEADER_DIRS = ["/usr/include", "/usr/local/include"]
LIBRARY_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
                "/usr/lib/aarch64-linux-gnu"]


def environment() -> dict:
    """What this machine runs: Python, torch, CUDA, the GPU, packages, providers."""
    found: dict = {"python": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform(), "packages": {}, "missing": []}
    from importlib import metadata
    distributions = {"yaml": "PyYAML", "PIL": "Pillow", "rsl_rl": "rsl-rl-lib",
                     "onnx_ir": "onnx-ir"}
    for name in PACKAGES:
        if importlib.util.find_spec(name) is None:
            found["missing"].append(name)
            continue
        try:
            found["packages"][name] = metadata.version(distributions.get(name, name))
        except metadata.PackageNotFoundError:
            found["packages"][name] = "?"
    try:
        import torch
        found["torch"] = torch.__version__
        found["torch cuda"] = torch.version.cuda
        found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as exc:  # noqa: BLE001  (reported, the run goes on)
        found["torch"] = f"not importable: {type(exc).__name__}: {exc}"
        found["gpu"] = None
    # what building the C core needs besides libyaml: a C compiler and Python's headers
    import sysconfig
    found["compiler"] = shutil.which("cc") or shutil.which("gcc")
    found["Python.h"] = os.path.exists(os.path.join(sysconfig.get_paths()["include"],
                                                    "Python.h"))
    try:
        import onnxruntime
        found["onnxruntime providers"] = onnxruntime.get_available_providers()
    except Exception:  # noqa: BLE001
        found["onnxruntime providers"] = []
    return found


def system_libyaml() -> bool:
    """Whether the compiler finds yaml.h and libyaml on the machine's usual paths."""
    header = any(os.path.exists(os.path.join(d, "yaml.h")) for d in HEADER_DIRS)
    library = any(os.path.exists(os.path.join(d, name)) for d in LIBRARY_DIRS
                  for name in ("libyaml.so", "libyaml.a"))
    return header and library


def libyaml_env(force_vendored: bool = False) -> tuple[dict, str]:
    """(environment for setup.py, which libyaml): the machine's, else the carried copy."""
    if not force_vendored and system_libyaml():
        return {}, "the machine's"
    include = os.path.join(VENDOR, "libyaml", "include")
    library = os.path.join(VENDOR, "libyaml", "lib")
    return ({"LEAPP_YAML_INCLUDE_DIRS": include, "LEAPP_YAML_LIBRARY_DIRS": library},
            "carried (tests/device/vendor/libyaml, static)")


def _run(cmd: list[str], env: dict | None = None, timeout: float = 1800,
         cwd: str = ROOT) -> tuple[int, str, float]:
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                              env=dict(os.environ, **(env or {})))
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        code, text = 124, f"timed out after {timeout:.0f} s\n{partial}"
    return code, text, time.perf_counter() - started


def build(force_vendored: bool = False) -> dict:
    """The C core built in place with this Python; {"ok", "werror", "libyaml", "log", ...}."""
    env, which = libyaml_env(force_vendored)
    result: dict = {"libyaml": which}
    command = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"]
    code, text, seconds = _run(command, dict(env, LEAPP_DEV_BUILD="1"))
    result.update(werror=code == 0, seconds=round(seconds, 1), log=text[-4000:])
    if code != 0:  # the rest still runs on a build without -Werror
        code, text, seconds = _run(command, dict(env, LEAPP_DEV_BUILD="0"))
        result["log"] += "\n--- without -Werror ---\n" + text[-4000:]
    check = [sys.executable, "-c", "import leapp, leapp._core as c; print(c.__file__)"]
    imported, where, _ = _run(check, {"PYTHONPATH": ROOT}) if code == 0 else (1, "", 0)
    result["ok"] = code == 0 and imported == 0
    result["core"] = where.strip().splitlines()[-1] if imported == 0 and where.strip() else None
    return result


def junit_summary(path: str) -> dict:
    """Counts and failing test ids from pytest's JUnit XML."""
    summary: dict = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": []}
    if not os.path.exists(path):
        return summary
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            summary[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                summary["failed"].append(f"{case.get('classname')}::{case.get('name')}")
    summary["passed"] = (summary["tests"] - summary["failures"] - summary["errors"]
                         - summary["skipped"])
    return summary


def run_tests(files: list[str], out: str) -> dict:
    """pytest on files; the JUnit summary and the output's tail."""
    if not files:
        return {"ran": False, "reason": "no test files given (--tests)"}
    if importlib.util.find_spec("pytest") is None:
        return {"ran": False, "files": files, "reason": "pytest is not installed on this machine"}
    xml = os.path.join(out, "tests.xml")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "-p",
               "no:cacheprovider", f"--junitxml={xml}", *files]
    code, text, seconds = _run(command, {"PYTHONPATH": ROOT})
    summary = junit_summary(xml)
    summary.update(ran=True, exit=code, seconds=round(seconds, 1), tail=text[-3000:])
    return summary


def unpack_upstream(out: str) -> str:
    """Upstream 0.7.2 from its carried wheel into out/upstream-site, and a wrapper
    interpreter that imports it (this Python, that site first); the wrapper's path."""
    site = os.path.join(out, "upstream-site")
    shutil.rmtree(site, ignore_errors=True)
    with zipfile.ZipFile(UPSTREAM_WHEEL) as wheel:
        wheel.extractall(site)
    wrapper = os.path.join(out, "upstream-python")
    with open(wrapper, "w", encoding="utf-8") as handle:
        handle.write(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    os.chmod(wrapper, 0o755)
    return wrapper


def pipelines(wanted: list[str] | None = None) -> list[str]:
    """The device pipelines to compare (rsl-rl-lib's only where it is installed)."""
    names = sorted(f[:-3] for f in os.listdir(PIPELINES)
                   if f.endswith(".py") and not f.startswith("_"))
    if wanted:
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise SystemExit(f"test-device: unknown pipelines {unknown} (known: {names})")
        names = [n for n in names if n in wanted]
    have_rsl = all(importlib.util.find_spec(m) is not None for m in ("rsl_rl", "tensordict"))
    return [n for n in names if have_rsl or "rsl_rl" not in n]


def compare(names: list[str], upstream: str, out: str) -> list[dict]:
    """Each pipeline exported by ours and upstream's, compared by bench/compat.py."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compat

    compat.PIPELINE_DIR = PIPELINES
    work = os.path.join(out, "pipelines")
    os.makedirs(work, exist_ok=True)
    found = []
    for name in names:
        report = compat.check_pipeline(name, sys.executable, upstream, work)
        found.append({"name": name, "ok": report.ok, "text": report.text()})
    return found


def describe_upstream(upstream: str) -> str:
    code, text, _ = _run([upstream, "-c", "import leapp, os; print(getattr(leapp, "
                          "'__version__', '?'), os.path.dirname(leapp.__file__))"],
                         cwd=os.path.dirname(upstream))
    return text.strip().splitlines()[-1] if code == 0 and text.strip() else \
        f"not importable: {text.strip()[-500:]}"


def report_text(env: dict, built: dict | None, tests: dict | None, compared: list | None,
                upstream: str | None, stopped: str | None = None) -> str:
    """The Markdown report (stopped: why the run stopped before building, if it did)."""
    lines = ["# leapp device run", ""]
    gpu = env.get("gpu") or "no GPU"
    lines.append(f"- machine: {gpu}; Python {env['python']} ({env['executable']}); torch "
                 f"{env.get('torch')} (CUDA {env.get('torch cuda')}); {env['platform']}")
    lines.append(f"- onnxruntime providers: {', '.join(env['onnxruntime providers']) or 'none'}")
    lines.append("- packages: " + ", ".join(f"{k} {v}" for k, v in env["packages"].items()))
    lines.append(f"- missing: {', '.join(env['missing']) or 'none'}")
    lines.append(f"- C compiler: {env.get('compiler') or 'none'}; Python.h: "
                 f"{'present' if env.get('Python.h') else 'missing (install python3-dev)'}")
    if built is not None:
        first = "" if env["python"].startswith("3.11") else \
            f" (the first build of the C core on Python {env['python']})"
        state = "ok" if built["ok"] else "FAILED"
        werror = "with -Werror" if built["werror"] else "only without -Werror (warnings!)"
        lines += ["", f"## Build{first}", "",
                  f"- {state}, {werror}, libyaml: {built['libyaml']}, {built['seconds']} s",
                  f"- core: {built.get('core')}"]
        if not built["ok"] or not built["werror"]:
            lines += ["", "```", built["log"][-2500:], "```"]
    if tests is not None:
        lines += ["", "## Tests", ""]
        if not tests.get("ran"):
            lines.append(f"- not run: {tests.get('reason')}")
        else:
            lines.append(f"- {tests['passed']} passed, {tests['failures'] + tests['errors']} "
                         f"failed, {tests['skipped']} skipped ({tests['seconds']} s)")
            lines += [f"- FAILED {name}" for name in tests["failed"]]
            if tests["failed"] or tests["exit"] not in (0, 5):
                lines += ["", "```", tests["tail"][-2500:], "```"]
    if compared is not None:
        lines += ["", "## Against upstream 0.7.2", "", f"- upstream: {upstream}", ""]
        for item in compared:
            lines += ["```", item["text"], "```"]
    if stopped:
        lines.append(f"- stopped: {stopped}")
    verdict = stopped is None and verdict_ok(built, tests, compared)
    lines += ["", f"**{'PASSED' if verdict else 'FAILED'}**", ""]
    return "\n".join(lines)


def verdict_ok(built: dict | None, tests: dict | None, compared: list | None) -> bool:
    if built is not None and not built["ok"]:
        return False
    if tests is not None and tests.get("ran") and (tests["failures"] or tests["errors"]
                                                   or tests["exit"] not in (0, 5)):
        return False
    if tests is not None and not tests.get("ran") and tests.get("files"):
        return False  # tests asked for could not run (no pytest)
    return not compared or all(item["ok"] for item in compared)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build",
                                                                               "device"))
    parser.add_argument("--tests", nargs="*", default=None,
                        help=f"test files (default: {' '.join(DEFAULT_TESTS)})")
    parser.add_argument("--pipelines", nargs="*", default=None,
                        help="device pipelines to compare (default: all)")
    parser.add_argument("--vendored-libyaml", action="store_true",
                        help="build against the carried libyaml even where the machine has one")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU (checks this script)")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-upstream", action="store_true")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = environment()
    print(json.dumps(env, indent=1), flush=True)
    if not env.get("gpu") and not args.allow_cpu:
        print("test-device: torch sees no GPU (--allow-cpu runs anyway)", file=sys.stderr)
        with open(os.path.join(out, "device-report.md"), "w", encoding="utf-8") as handle:
            handle.write(report_text(env, None, None, None, None,
                                     stopped="torch sees no GPU (--allow-cpu runs anyway)"))
        return 2
    built = None if args.skip_build else build(args.vendored_libyaml)
    tests = compared = upstream_text = None
    if built is None or built["ok"]:
        tests = run_tests(DEFAULT_TESTS if args.tests is None else args.tests, out)
        if not args.skip_upstream:
            upstream = unpack_upstream(out)
            upstream_text = describe_upstream(upstream)
            compared = compare(pipelines(args.pipelines), upstream, out)
    text = report_text(env, built, tests, compared, upstream_text)
    path = os.path.join(out, "device-report.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text, flush=True)
    print(f"report: {path}")
    return 0 if verdict_ok(built, tests, compared) else 1


if __name__ == "__main__":
    sys.exit(main())
