"""`python -m leapp` verbs, their output and exit status (0 ok, 1 failed, 2 usage).

Each verb's working path, the help and the missing verb run the real entry point as a
process (`leapp_cli`); the refusals of broken bundles and arguments call the same
`leapp.cli.main` in this process (`cli_main`: its streams and exit status captured), which
spares a torch import per case.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from support import ROOT

BUILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import torch, leapp
    from leapp import annotate
    leapp.start("pipe", save_path={save!r})
    h = torch.zeros(3)
    for _ in range(2):
        o, hh = annotate.input_tensors("enc", {{"obs": torch.randn(4), "h": h}})
        z = annotate.output_tensors("enc", {{"z": torch.tanh(o[:3] + hh)}}, export_with="jit")
        a = annotate.input_tensors("act", {{"z": z}})
        h, y = annotate.output_tensors("act", {{"h": a * 2, "y": a + 1}}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph() == {{"enc": True, "act": True}}
""")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    proc = subprocess.run([sys.executable, "-c", BUILD.format(root=ROOT, save=str(root))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return os.path.join(root, "pipe")


@pytest.fixture
def bundle(pristine, tmp_path):
    """A private copy of the bundle (tests may break it); returns its YAML path."""
    target = os.path.join(tmp_path, "pipe")
    shutil.copytree(pristine, target)
    return os.path.join(target, "pipe.yaml")


def leapp_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "leapp", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)


def cli_main(*args: str) -> subprocess.CompletedProcess:
    """leapp.cli.main(args) in this process: its exit status and what it printed."""
    from leapp import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code
    return subprocess.CompletedProcess(["leapp", *args], status, out.getvalue(), err.getvalue())


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


# ---- inspect ------------------------------------------------------------------------------

def test_inspect(bundle):
    proc = leapp_cli("inspect", bundle)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "bundle pipe: 2 node(s)" in out
    assert "node enc  backend=jit  enc.pt: sha256 ok" in out
    assert "in   obs: float32[4]  <- graph input" in out
    assert "in   h: float32[3]  <- act/h (feedback)" in out
    assert "in   z: float32[3]  <- enc/z" in out
    assert "out  y: float32[3]" in out
    assert "  enc/z -> act/z" in out and "  act/h -> enc/h" in out
    assert "graph inputs: enc/obs" in out and "graph outputs: act/y" in out
    assert "initial values: pipe_initial_values.safetensors" in out
    # the analytics file: enc/z over 2 samples; act/h and act/y over 2, and the closed
    # loop's graph output act/y
    assert ("validation analytics (pipe_analytics.json, 7 check(s)):\n"
            "  enc: 2/2 passed, max abs error 0.000e+00\n"
            "  act: 5/5 passed, max abs error 0.000e+00\n") in out
    assert out.rstrip().endswith("checksums: ok")


def test_inspect_reads_analytics_from_their_file_not_the_log(bundle):
    directory = os.path.dirname(bundle)
    log = open(os.path.join(directory, "log.txt"), encoding="utf-8").read()
    assert "validation analytics" not in log and '"passed"' not in log  # no JSON in the log
    os.remove(os.path.join(directory, "log.txt"))
    path = os.path.join(directory, "pipe_analytics.json")
    text = open(path, encoding="utf-8").read()
    with open(path, "w", encoding="utf-8") as handle:  # one check made a failure
        handle.write(text.replace('"passed": true', '"passed": false, "reason": "planted"', 1))
    proc = cli_main("inspect", bundle)
    assert proc.returncode == 0, proc.stderr
    assert "  enc: 1/2 passed, max abs error 0.000e+00\n    FAIL z sample 0: planted\n" \
        in proc.stdout
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("[1, 2]")
    proc = cli_main("inspect", bundle)
    assert "validation analytics: unreadable: " in proc.stdout
    assert "is not a leapp analytics file (version 1)" in proc.stdout
    os.remove(path)
    proc = cli_main("inspect", bundle)
    assert ("validation analytics: none (no pipe_analytics.json: compiled with "
            "validate=False, or by another leapp)") in proc.stdout


def test_inspect_reports_a_checksum_mismatch(bundle):
    with open(os.path.join(os.path.dirname(bundle), "act.pt"), "ab") as handle:
        handle.write(b"tampered")
    proc = cli_main("inspect", bundle)
    assert proc.returncode == 1
    assert "act.pt: sha256 MISMATCH" in proc.stdout
    assert "leapp inspect: FAILED: checksums failed: act: act.pt: sha256 MISMATCH" in proc.stderr
    _no_traceback(proc)


def test_inspect_reports_a_missing_model(bundle):
    os.remove(os.path.join(os.path.dirname(bundle), "enc.pt"))
    proc = cli_main("inspect", bundle)
    assert proc.returncode == 1 and "enc.pt: MISSING" in proc.stdout
    _no_traceback(proc)


# ---- run ----------------------------------------------------------------------------------

def test_run(bundle):
    proc = leapp_cli("run", bundle, "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["step 1", "step 2", "step 3"]
    assert all(line.endswith(" ms") for line in lines[:3])
    assert "act/y: float32[3]" in proc.stdout


def test_run_default_is_one_step(bundle):
    proc = cli_main("run", bundle)
    assert proc.returncode == 0, proc.stderr
    assert "step 1:" in proc.stdout and "step 2:" not in proc.stdout


@pytest.mark.parametrize("steps", ["0", "-2", "many"])
def test_run_rejects_bad_steps(bundle, steps):
    proc = cli_main("run", bundle, "--steps", steps)
    assert proc.returncode == 2
    assert "expected a positive integer" in proc.stderr
    _no_traceback(proc)


# ---- draw ---------------------------------------------------------------------------------

def test_draw_default_and_output(bundle, tmp_path):
    png = os.path.join(os.path.dirname(bundle), "pipe.png")
    os.remove(png)
    proc = leapp_cli("draw", bundle)
    assert proc.returncode == 0, proc.stderr
    with open(png, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    target = os.path.join(tmp_path, "elsewhere.png")
    proc = leapp_cli("draw", bundle, "-o", target)
    assert proc.returncode == 0 and f"wrote {target}" in proc.stdout
    assert os.path.getsize(target) > 0


@pytest.mark.parametrize("target, message", [
    ("picture.jpg", "give a path ending in .png"),
    (os.path.join("no", "such", "dir", "p.png"), "does not exist"),
])
def test_draw_errors(bundle, target, message):
    proc = cli_main("draw", bundle, "-o", target)
    assert proc.returncode == 2 and message in proc.stderr
    _no_traceback(proc)


# ---- check --------------------------------------------------------------------------------

def test_check(bundle):
    proc = leapp_cli("check", bundle)
    assert proc.returncode == 0, proc.stderr
    assert "ok: 2 node(s) loaded, checksums match, one step ran" in proc.stdout


def test_check_fails_on_a_tampered_model(bundle):
    with open(os.path.join(os.path.dirname(bundle), "enc.pt"), "ab") as handle:
        handle.write(b"tampered")
    proc = leapp_cli("check", bundle)
    assert proc.returncode == 1
    assert proc.stderr.count("leapp check: FAILED:") == 1
    assert "SHA256 checksum mismatch" in proc.stderr
    assert proc.stderr.count("SHA256 checksum mismatch") == 1  # printed once
    _no_traceback(proc)


def test_check_fails_on_a_missing_model(bundle):
    os.remove(os.path.join(os.path.dirname(bundle), "act.pt"))
    proc = cli_main("check", bundle)
    assert proc.returncode == 1 and "not found" in proc.stderr
    _no_traceback(proc)


def test_a_bundle_directory_stands_for_its_yaml(bundle):
    """`leapp check --deploy DIR` (and every verb) reads DIR/<DIR's name>.yaml."""
    directory = os.path.dirname(bundle)
    proc = leapp_cli("check", "--deploy", directory)
    # this bundle has no kinds nor frequency: the check runs and fails on them
    assert proc.returncode == 1, proc.stderr
    assert f"deploy check of pipe ({bundle})" in proc.stdout
    assert "FAIL  kind" in proc.stdout and "FAIL  frequency" in proc.stdout
    assert "deploy check(s) failed" in proc.stderr
    _no_traceback(proc)
    proc = leapp_cli("check", directory + os.sep)
    assert proc.returncode == 0, proc.stderr
    assert "ok: 2 node(s) loaded" in proc.stdout
    proc = leapp_cli("inspect", directory)
    assert proc.returncode == 0 and "bundle pipe: 2 node(s)" in proc.stdout


# ---- errors common to every verb ----------------------------------------------------------

@pytest.mark.parametrize("verb", ["inspect", "run", "draw", "check"])
def test_help(verb):
    proc = cli_main(verb, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"usage: leapp {verb}") and "BUNDLE.yaml" in proc.stdout


def test_top_level_help_and_missing_verb():
    proc = leapp_cli("--help")
    assert proc.returncode == 0 and "inspect" in proc.stdout and "exit status" in proc.stdout
    proc = leapp_cli()
    assert proc.returncode == 2 and "usage: leapp" in proc.stderr
    proc = leapp_cli("explode", "x.yaml")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.parametrize("verb", ["inspect", "run", "draw", "check"])
def test_unreadable_bundles(verb, tmp_path):
    missing = os.path.join(tmp_path, "missing.yaml")
    proc = cli_main(verb, missing)
    assert proc.returncode == 2 and f"leapp {verb}: error: no such file" in proc.stderr
    _no_traceback(proc)
    text = os.path.join(tmp_path, "notes.txt")
    open(text, "w").write("hello")
    proc = cli_main(verb, text)
    assert proc.returncode == 2 and "is not a .yaml file" in proc.stderr
    broken = os.path.join(tmp_path, "broken.yaml")
    open(broken, "w").write("models: [unclosed\n")
    proc = cli_main(verb, broken)
    assert proc.returncode == 2 and f"cannot read {broken}" in proc.stderr
    _no_traceback(proc)
    other = os.path.join(tmp_path, "other.yaml")
    open(other, "w").write("name: something else\n")
    proc = cli_main(verb, other)
    assert proc.returncode == 2 and "is not a leapp bundle" in proc.stderr
    proc = cli_main(verb, str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr


def test_console_script_is_declared():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    assert project["scripts"]["leapp"] == "leapp.cli:main"


def test_a_malformed_model_entry_is_one_line(tmp_path):
    odd = os.path.join(tmp_path, "odd.yaml")
    open(odd, "w").write("models:\n  a: [1, 2]\npipeline: {}\nsystem information: {}\n")
    proc = cli_main("inspect", odd)
    assert proc.returncode == 2 and proc.stderr.startswith("leapp inspect: error:")
    _no_traceback(proc)


def test_a_model_outside_the_bundle_is_refused(bundle, tmp_path):
    outside = os.path.join(tmp_path, "elsewhere.pt")
    shutil.copy(os.path.join(os.path.dirname(bundle), "enc.pt"), outside)
    text = open(bundle).read().replace("model_path: enc.pt", "model_path: ../elsewhere.pt")
    open(bundle, "w").write(text)
    proc = cli_main("inspect", bundle)
    assert proc.returncode == 1 and "../elsewhere.pt: REFUSED" in proc.stdout
    proc = cli_main("check", bundle)
    assert proc.returncode == 1 and "outside the bundle" in proc.stderr
    _no_traceback(proc)


def test_yaml_aliases_are_refused(tmp_path):
    path = os.path.join(tmp_path, "bomb.yaml")
    open(path, "w").write("a: &x [1, 2]\nmodels: *x\npipeline: {}\nsystem information: {}\n")
    proc = cli_main("inspect", path)
    assert proc.returncode == 2 and "anchor or alias" in proc.stderr
    _no_traceback(proc)
