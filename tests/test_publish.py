"""A compile commits its bundle in one step, or leaves the old one exactly as it was.

Compiles killed (SIGKILL, in a child process) at each phase, renames that fail,
a full disk, stale files, file modes, log.txt; validation of the saved files;
the TorchScript depth guard; node names; 0-d tensors through every backend.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch
import yaml

import leapp
from leapp import annotate
from leapp.bundle import log as _logging
from leapp.compiling import publish as _publish
from leapp.compiling.incremental import MANIFEST
from support import ROOT

TESTS = os.path.dirname(os.path.abspath(__file__))
GRAPH = "g"
# MANIFEST: the content keys that let the next compile reuse unchanged nodes' files.
V1_FILES = {"g.yaml", "a.pt", "b.pt", "g_initial_values.safetensors", "g_analytics.json",
            "log.txt", MANIFEST}


def build(root: str, scale: float, backend: str = "jit", name: str = GRAPH) -> None:
    """Trace a two-node graph: a self-loop feedback node 'a' and a node 'b'.

    scale changes the initial feedback value and b's constant, so two builds
    give different files; backend is b's export_with.
    """
    leapp.start(name, save_path=root)
    memory = torch.full((2,), scale)
    for _ in range(2):
        x, m = annotate.input_tensors("a", {"x": torch.ones(2), "m": memory})
        memory = annotate.output_tensors("a", {"m_out": x + 0.5 * m}, export_with="jit")
        y = annotate.input_tensors("b", {"m_out": memory})
        annotate.output_tensors("b", {"y": y * scale}, export_with=backend)
    leapp.stop()


def _files(directory: str) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory))}


def _run(directory: str) -> dict[str, torch.Tensor]:
    manager = leapp.InferenceManager(os.path.join(directory, f"{GRAPH}.yaml"))
    return manager({"a/x": torch.ones(2)})


def _staging_left(root: str) -> list[str]:
    return [n for n in os.listdir(root) if n.startswith(".leapp-")]


@pytest.fixture
def v1(tmp_path):
    """A committed bundle of build(scale=1.0): (root, bundle dir, files, outputs)."""
    root = str(tmp_path)
    build(root, 1.0)
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True}
    bundle = os.path.join(root, GRAPH)
    assert set(os.listdir(bundle)) == V1_FILES
    _logging.close()  # this session no longer appends to the bundle's log.txt
    return root, bundle, _files(bundle), _run(bundle)


def _assert_v1(root: str, bundle: str, files: dict, outputs: dict) -> None:
    assert _files(bundle) == files
    got = _run(bundle)
    assert all(torch.equal(got[k], outputs[k]) for k in outputs)


# ---- killed compiles ----------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from leapp.compiling import compiler, publish as _publish
    from test_publish import build

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    phase = {phase!r}
    if phase == "between-renames":  # the two-rename commit, killed after the first
        _publish.exchange = lambda first, second: False
        real_commit, real_rename = _publish.commit, os.rename

        def commit(*args):
            def rename(source, target):
                real_rename(source, target)
                die()
            os.rename = rename
            real_commit(*args)
        _publish.commit = commit
    else:
        compiler._checkpoint = lambda name: die() if name == phase else None
    build({save!r}, 3.0, backend="jit-trace")
    import leapp
    leapp.compile_graph(visualize=False)
    sys.exit(3)
""")


@pytest.mark.parametrize("phase", ["exported", "ready", "between-renames", "committed"])
def test_killed_compile_leaves_a_whole_bundle(v1, phase):
    root, bundle, files, outputs = v1
    script = CHILD.format(root=ROOT, tests=TESTS, phase=phase, save=root)
    private = os.path.join(root, "tmp")  # the killed session's private log lands here
    os.mkdir(private)
    child = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, TMPDIR=private))
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    left = _staging_left(root)
    if phase == "between-renames":  # no bundle at the path now; the next compile repairs
        assert sorted(name.rsplit(".", 1)[0][-3:] for name in left) == ["new", "old"]
        assert not os.path.exists(bundle)
        _publish.clean_stale(bundle, GRAPH)
        _assert_v1(root, bundle, files, outputs)
        assert _staging_left(root) == []
    elif phase == "committed":  # the new bundle is in place, the old one not yet removed
        assert set(os.listdir(bundle)) == V1_FILES
        assert _files(bundle)["b.pt"] != files["b.pt"]
        assert not torch.equal(_run(bundle)["b/y"], outputs["b/y"])
    else:
        _assert_v1(root, bundle, files, outputs)
    if phase != "between-renames":
        assert len(left) == 1, os.listdir(root)
    # The next compile removes what the killed one left and publishes in full.
    build(root, 3.0, backend="jit-trace")
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True}
    assert _staging_left(root) == []
    assert set(os.listdir(bundle)) == V1_FILES
    assert not torch.equal(_run(bundle)["b/y"], outputs["b/y"])


def test_stale_staging_of_a_running_process_is_kept(v1):
    root, bundle, _, _ = v1
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as other:
        try:
            alive = os.path.join(root, f".leapp-{other.pid}-abc-new.{GRAPH}")
            os.mkdir(alive)
            dead = os.path.join(root, f".leapp-{_dead_pid()}-abc-new.{GRAPH}")
            os.mkdir(dead)
            other_graph = os.path.join(root, f".leapp-{_dead_pid()}-abc-new.{GRAPH}x")
            os.mkdir(other_graph)
            build(root, 2.0)
            leapp.compile_graph(visualize=False)
            assert sorted(_staging_left(root)) == sorted(
                [os.path.basename(alive), os.path.basename(other_graph)])
        finally:
            other.kill()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---- failing renames ----------------------------------------------------------------------------

@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-renames"])
def test_a_failing_rename_never_mixes_bundles(v1, monkeypatch, swap):
    root, bundle, files, outputs = v1
    real_rename, real_replace, real_exchange = os.rename, os.replace, _publish.exchange
    for fail_at in range(1, 5):
        calls = []

        def counted(real):
            def call(source, target, *args, **kwargs):
                calls.append(source)
                if len(calls) == fail_at:
                    raise OSError(5, "injected rename failure", source)
                return real(source, target, *args, **kwargs)
            return call

        monkeypatch.setattr(os, "rename", counted(real_rename))
        monkeypatch.setattr(os, "replace", counted(real_replace))
        monkeypatch.setattr(_publish, "exchange", counted(real_exchange) if swap
                            else (lambda first, second: False))
        build(root, 3.0, backend="pt2")
        try:
            leapp.compile_graph(visualize=False)
            failed = False
        except OSError as exc:
            assert "injected rename failure" in str(exc)
            failed = True
        monkeypatch.undo()
        assert _staging_left(root) == []
        if failed:
            _assert_v1(root, bundle, files, outputs)
        else:  # the failing call was not on the commit path: the new bundle is whole
            assert set(os.listdir(bundle)) == (V1_FILES - {"b.pt"}) | {"b.pt2"}
            _run(bundle)
            return
    raise AssertionError("every rename failed the compile")


# ---- full disk ----------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mount = shutil.which("mount")
    point = str(tmp_path / "disk")
    os.mkdir(point)
    if mount is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=1m", "tmpfs", point],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield point
    finally:
        _logging.close()  # the session's log.txt may be open on the mount
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)


def test_full_disk_is_a_clean_error_and_keeps_the_old_bundle(small_disk):
    root = small_disk
    build(root, 1.0)
    leapp.compile_graph(visualize=False)
    bundle = os.path.join(root, GRAPH)
    files, outputs = _files(bundle), _run(bundle)
    free = shutil.disk_usage(root).free
    leapp.start(GRAPH, save_path=root)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    annotate.output_tensors("a", {"y": x + 1}, export_with="jit")
    big = torch.randn(400_000)  # a 1.6 MB constant: b.pt does not fit
    z = annotate.input_tensors("b", {"x": torch.ones(2)})
    annotate.output_tensors("b", {"y": (z.sum() + big).sum()}, export_with="jit")
    leapp.stop()
    with pytest.raises(_publish.BundleWriteError) as info:
        leapp.compile_graph(visualize=False)
    assert isinstance(info.value, OSError)
    assert bundle in str(info.value) and "no space left" in str(info.value)
    assert _staging_left(root) == []
    _assert_v1(root, bundle, files, outputs)
    assert shutil.disk_usage(root).free == free


# ---- what the bundle holds ----------------------------------------------------------------------

def test_bundle_holds_the_files_of_its_latest_compile(tmp_path):
    root = str(tmp_path)
    build(root, 1.0, backend="onnx-torchscript")
    leapp.compile_graph(visualize=False)
    bundle = os.path.join(root, GRAPH)
    assert "b.onnx" in os.listdir(bundle)
    with open(os.path.join(bundle, "NOTES.txt"), "w") as handle:  # the user's own file
        handle.write("mine")
    os.mkdir(os.path.join(bundle, ".leapp-old-temporary"))  # left by an older version
    build(root, 2.0, backend="jit")
    assert leapp.compile_graph(visualize=False) == {"a": True, "b": True}
    assert set(os.listdir(bundle)) == V1_FILES | {"NOTES.txt"}
    assert open(os.path.join(bundle, "NOTES.txt")).read() == "mine"
    mask = os.umask(0o022)
    os.umask(mask)
    for name in V1_FILES:
        assert stat.S_IMODE(os.stat(os.path.join(bundle, name)).st_mode) == 0o666 & ~mask, name
    assert stat.S_IMODE(os.stat(bundle).st_mode) == 0o777 & ~mask
    log = open(os.path.join(bundle, "log.txt")).read()
    assert ".leapp-" not in log
    assert f"- b: {os.path.join(bundle, 'b.pt')}" in log
    assert f"Saving feedback initial values to {bundle}{os.sep}g_initial_values" in log


def test_start_leaves_the_committed_log_until_a_compile_commits(v1, monkeypatch):
    root, bundle, files, outputs = v1
    import leapp.compiling.backends.jit as jit_backend

    def failing(node, *args, **kwargs):
        raise RuntimeError("export interrupted")

    build(root, 2.0)
    monkeypatch.setattr(jit_backend, "export", failing)
    with pytest.raises(RuntimeError, match="export interrupted"):
        leapp.compile_graph(visualize=False)
    _assert_v1(root, bundle, files, outputs)
    monkeypatch.undo()
    leapp.compile_graph(visualize=False)
    log = open(os.path.join(bundle, "log.txt")).read()
    assert "export interrupted" in log and "Passed: 2/2" in log


# ---- validation runs the saved files ------------------------------------------------------------

@pytest.mark.parametrize("backend", ["jit", "pt2"])
def test_validation_runs_the_saved_file(tmp_path, monkeypatch, backend):
    """A file that differs from the in-memory model fails validation."""
    from leapp.compiling import backends
    real = backends.export_node

    def tampered(node, *args, **kwargs):
        result = real(node, *args, **kwargs)
        if backend == "jit":
            torch.jit.script(_Triple()).save(result.path)
        else:
            torch.export.save(torch.export.export(_Triple(), (torch.ones(3),)), result.path)
        return result

    monkeypatch.setattr(backends, "export_node", tampered)
    leapp.start(GRAPH, save_path=str(tmp_path))
    x = annotate.input_tensors("n", {"x": torch.ones(3)})
    annotate.output_tensors("n", {"y": x * 2}, export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False, strict=False) == {"n": False}


class _Triple(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


# ---- graphs TorchScript cannot run --------------------------------------------------------------

def _chain(root: str, steps: int, backend: str) -> None:
    leapp.start(GRAPH, save_path=root)
    x = annotate.input_tensors("loop", {"x": torch.ones(3)})
    for _ in range(steps):
        x = x + 1
        x = x * 0.999
    annotate.output_tensors("loop", {"y": x}, export_with=backend)
    leapp.stop()


@pytest.mark.parametrize("backend", ["jit", "jit-trace"])
@pytest.mark.parametrize("validate", [True, False])
def test_too_deep_for_torchscript_is_refused(tmp_path, monkeypatch, backend, validate):
    import leapp.compiling.backends.jit as jit_backend
    monkeypatch.setattr(jit_backend, "MAX_INTERPRETER_DEPTH", 100)
    _chain(str(tmp_path), 60, backend)
    with pytest.raises(RuntimeError) as info:
        leapp.compile_graph(visualize=False, validate=validate)
    message = str(info.value)
    assert "node 'loop'" in message and "chain of 120 dependent operations" in message
    assert "backend 'jit-" in message and "export_with='onnx' or 'pt2'" in message
    assert not os.path.exists(os.path.join(str(tmp_path), GRAPH, f"{GRAPH}.yaml"))


def test_interpreter_depth_follows_the_interpreter():
    from leapp.compiling.backends.jit import interpreter_depth

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(30))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = x + torch.relu(layer(x))  # x used twice: never one long chain
            return x

    class Chain(Residual):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x

    frozen = [torch.jit.freeze(torch.jit.script(m().eval())) for m in (Residual, Chain)]
    assert interpreter_depth(frozen[0].graph) <= 3
    assert interpreter_depth(frozen[1].graph) == 60


# ---- names and 0-d tensors ----------------------------------------------------------------------

NAMES = ["ü", "日本", "node-é", "class", "None"]


@pytest.mark.parametrize("backend", ["jit", "jit-trace", "onnx", "pt2"])
def test_any_node_name_loads(tmp_path, backend):
    root = str(tmp_path)
    names = NAMES if backend != "onnx" else NAMES[1:4]  # dynamo exports are slow
    leapp.start(GRAPH, save_path=root)
    for index, name in enumerate(names):
        x = annotate.input_tensors(name, {"x": torch.full((2,), float(index))})
        annotate.output_tensors(name, {"y": x * 2 + 1}, export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {name: True for name in names}
    manager = leapp.InferenceManager(os.path.join(root, GRAPH, f"{GRAPH}.yaml"))
    got = manager({f"{name}/x": torch.ones(2) for name in names})
    assert all(torch.equal(got[f"{name}/y"], torch.full((2,), 3.0)) for name in names)


ZERO_D_BACKENDS = ["jit", "jit-trace", "onnx", "onnx-torchscript", "pt2"]


def test_zero_dim_tensors_through_every_backend(tmp_path):
    root = str(tmp_path)
    leapp.start(GRAPH, save_path=root)
    for backend in ZERO_D_BACKENDS:
        x, s = annotate.input_tensors(backend, {"x": torch.ones(3), "s": torch.tensor(2.0)})
        annotate.output_tensors(backend, {"t": s * 2 + 1, "u": x.sum() + s, "v": x * s},
                                export_with=backend)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {b: True for b in ZERO_D_BACKENDS}
    with open(os.path.join(root, GRAPH, f"{GRAPH}.yaml")) as handle:
        models = yaml.safe_load(handle)["models"]
    manager = leapp.InferenceManager(os.path.join(root, GRAPH, f"{GRAPH}.yaml"))
    inputs = {}
    for backend in ZERO_D_BACKENDS:
        assert [p["shape"] for p in models[backend]["inputs"]] == [[3], []]
        inputs.update({f"{backend}/x": torch.ones(3), f"{backend}/s": torch.tensor(3.0)})
    got = manager(inputs)
    for backend in ZERO_D_BACKENDS:
        assert got[f"{backend}/t"].shape == () and float(got[f"{backend}/t"]) == 7.0
        assert got[f"{backend}/u"].shape == () and float(got[f"{backend}/u"]) == 6.0
        assert torch.equal(got[f"{backend}/v"], torch.full((3,), 3.0))


def test_staging_names_parse_back():
    with tempfile.TemporaryDirectory() as root:
        bundle = os.path.join(root, "graph-with-dashes.and.dots")
        staging = _publish.make_staging(bundle, os.path.basename(bundle))
        found = _publish._staged_for(root, os.path.basename(bundle))
        assert found == [(staging, os.getpid(), "new")]
        assert _publish._staged_for(root, "graph-with-dashes") == []


def test_a_bundle_directory_that_is_a_mount_point_is_refused(small_disk):
    root, graph = os.path.split(small_disk)
    leapp.start(graph, save_path=root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    annotate.output_tensors("n", {"y": x * 2}, export_with="jit")
    leapp.stop()
    with pytest.raises(OSError, match="is a mount point") as info:
        leapp.compile_graph(visualize=False)
    assert info.value.errno == errno.EXDEV
    assert _staging_left(root) == [] and os.listdir(small_disk) == ["log.txt"]


def test_trace_check_never_runs_a_graph_too_deep(tmp_path, monkeypatch):
    """torch.jit.trace's check runs the graph: the guard comes first."""
    import leapp.compiling.backends.jit as jit_backend
    monkeypatch.setattr(jit_backend, "MAX_INTERPRETER_DEPTH", 100)
    real, checks = torch.jit.trace, []

    def trace(*args, **kwargs):
        checks.append(kwargs.get("check_trace", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.jit, "trace", trace)
    _chain(str(tmp_path), 60, "jit-trace")
    with pytest.raises(RuntimeError, match="chain of 120 dependent operations"):
        leapp.compile_graph(visualize=False)
    assert checks == [False]
