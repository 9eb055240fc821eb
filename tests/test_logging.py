"""Logging as libraries do it: one output per record, the application's levels,
log.txt at DEBUG, errors printed once (run in subprocesses: real stderr)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import leapp
from leapp import annotate
from leapp.bundle import log as _logging
from support import ROOT

SCRIPT = textwrap.dedent("""
    import logging, sys
    sys.path.insert(0, {root!r})
    {configure}
    import torch, leapp
    from leapp import annotate
    leapp.start("g", save_path={save!r}{start_args})
    x, unused = annotate.input_tensors("a", {{"x": torch.ones(2), "unused": torch.ones(3)}})
    annotate.output_tensors("a", {{"y": x * 2}}, export_with="jit")
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    print("RESULT", dict(result))
    {tail}
""")

WARNING_TEXT = "detected the following inputs are not used"
SUMMARY_TEXT = "LEAPP export artifacts saved"
DEBUG_TEXT = "Compiled graph module for a"
PROGRESS_TEXT = "1/1 a (jit-script): exported in"


def _run(tmp_path, configure: str = "", start_args: str = "", tail: str = ""):
    script = SCRIPT.format(root=ROOT, save=str(tmp_path), configure=configure,
                           start_args=start_args, tail=tail)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert "RESULT {'a': True}" in proc.stdout, proc.stderr[-3000:]
    return proc


def test_basic_config_info_each_warning_once_no_debug_summary_visible(tmp_path):
    proc = _run(tmp_path, "logging.basicConfig(level=logging.INFO)")
    assert proc.stderr.count(WARNING_TEXT) == 1
    assert DEBUG_TEXT not in proc.stderr + proc.stdout
    assert "DEBUG" not in proc.stderr
    assert proc.stderr.count(SUMMARY_TEXT) == 1
    assert proc.stderr.count(PROGRESS_TEXT) == 1  # PROGRESS is above INFO
    assert "[WARNING]" not in proc.stderr  # only the application's format


def test_basic_config_warning_keeps_the_artifacts_record_hides_progress(tmp_path):
    """SYSTEM is upstream's 31: above WARNING, as upstream's artifacts record."""
    proc = _run(tmp_path, "logging.basicConfig(level=logging.WARNING)")
    assert proc.stderr.count(WARNING_TEXT) == 1
    assert proc.stderr.count("SYSTEM:leapp:" + SUMMARY_TEXT) == 1
    assert PROGRESS_TEXT not in proc.stderr + proc.stdout


def test_basic_config_error_hides_the_artifacts_record(tmp_path):
    proc = _run(tmp_path, "logging.basicConfig(level=logging.ERROR)")
    assert SUMMARY_TEXT not in proc.stderr + proc.stdout
    assert WARNING_TEXT not in proc.stderr
    assert "Node context initialized" not in proc.stderr


def test_basic_config_debug_shows_graph_dumps(tmp_path):
    proc = _run(tmp_path, "logging.basicConfig(level=logging.DEBUG)")
    assert DEBUG_TEXT in proc.stderr
    assert proc.stderr.count(WARNING_TEXT) == 1


def test_unconfigured_prints_to_stderr_and_leaves_stdout_to_the_script(tmp_path):
    """As a library (and upstream): a script whose stdout is piped gets only its own
    output there; the progress lines and the artifacts record are on stderr."""
    proc = _run(tmp_path)
    assert proc.stderr.count(WARNING_TEXT) == 1
    assert proc.stderr.count(SUMMARY_TEXT) == 1
    assert proc.stderr.count(PROGRESS_TEXT) == 1
    assert proc.stdout.startswith("RESULT ") and proc.stdout.count("\n") == 1, proc.stdout
    assert DEBUG_TEXT not in proc.stderr + proc.stdout
    assert "Node context initialized" not in proc.stderr + proc.stdout  # INFO is quiet


def test_unconfigured_logger_level_hides_the_summary(tmp_path):
    proc = _run(tmp_path, "logging.getLogger('leapp').setLevel(logging.WARNING)")
    assert proc.stderr.count(SUMMARY_TEXT) == 1 and SUMMARY_TEXT not in proc.stdout
    assert PROGRESS_TEXT not in proc.stdout + proc.stderr  # the standard way to silence it
    assert proc.stderr.count(WARNING_TEXT) == 1
    proc = _run(tmp_path, "logging.getLogger('leapp').setLevel(logging.ERROR)")
    assert SUMMARY_TEXT not in proc.stdout + proc.stderr


def test_verbose_shows_debug_once(tmp_path):
    proc = _run(tmp_path, "logging.basicConfig(level=logging.WARNING)",
                start_args=", verbose=True")
    assert proc.stderr.count(DEBUG_TEXT) == 1
    proc = _run(tmp_path, start_args=", verbose=True")
    assert (proc.stdout + proc.stderr).count(DEBUG_TEXT) == 1


def test_log_txt_gets_debug_whatever_the_console(tmp_path):
    _run(tmp_path, "logging.basicConfig(level=logging.ERROR)")
    log = open(os.path.join(tmp_path, "g", "log.txt")).read()
    assert DEBUG_TEXT in log and WARNING_TEXT in log and SUMMARY_TEXT in log
    assert f"[PROGRESS]: {PROGRESS_TEXT}" in log


@pytest.mark.parametrize("configure", ["", "logging.basicConfig(level=logging.DEBUG)"])
def test_errors_are_printed_once(tmp_path, configure):
    tail = (f"leapp.start('g2', save_path={str(tmp_path)!r}); "
            "annotate.output_tensors('ghost', {'y': torch.ones(1)})")
    script = SCRIPT.format(root=ROOT, save=str(tmp_path), configure=configure, start_args="",
                           tail=tail)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    message = "output_tensors() called for node 'ghost'"
    assert proc.stderr.count(message) == 1, proc.stderr
    assert "FATAL" not in proc.stderr
    log = open(os.path.join(tmp_path, "g2", "log.txt")).read()
    assert f"[FATAL]: {message}" in log


def test_no_handler_is_added_to_the_logger(tmp_path):
    before = [h for h in logging.getLogger("leapp").handlers
              if h is not _logging._State.file_handler]  # an earlier session's log.txt
    leapp.start("g", save_path=str(tmp_path))
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    annotate.output_tensors("a", {"y": x + 1})
    leapp.stop()
    # log.txt's handler is the only one leapp attaches; no console handler
    assert [h for h in logging.getLogger("leapp").handlers
            if h is not _logging._State.file_handler] == before
    assert logging.getLogger("leapp").propagate


MESSAGES = [("info", "Found connection: a/y  -> b/x"), ("info", "Found connection: b/y  -> c/x"),
            ("warning", "a warning between them"), ("info", "Found connection: c/y  -> d/x")]


def _logged_one_by_one(path: str) -> str:
    _logging.configure(path, verbose=False)
    for level, text in MESSAGES:
        getattr(_logging.logger, level)(text)
    _logging.close()
    return open(os.path.join(path, "log.txt")).read()


def test_log_messages_writes_log_txt_as_one_record_per_line_would(tmp_path, capsys,
                                                                   monkeypatch):
    """compile's connection lines go to log.txt in one write when only log.txt takes INFO:
    the file holds the same bytes, in order with the warning between them."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # pytest's capture handlers
    (tmp_path / "one").mkdir()
    (tmp_path / "bulk").mkdir()
    expected = _logged_one_by_one(str(tmp_path / "one"))
    _logging.configure(str(tmp_path / "bulk"), verbose=False)
    assert _logging._only_the_file_takes(logging.INFO) is not None  # the one-write path
    _logging.log_messages(MESSAGES)
    _logging.close()
    assert open(tmp_path / "bulk" / "log.txt").read() == expected
    assert expected.splitlines() == [
        "[INFO]: Found connection: a/y  -> b/x", "[INFO]: Found connection: b/y  -> c/x",
        "[WARNING]: a warning between them", "[INFO]: Found connection: c/y  -> d/x"]
    assert capsys.readouterr().err.count("a warning between them") == 2  # both runs


def test_log_messages_reach_the_applications_handler_one_record_each(tmp_path):
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.DEBUG)
    leapp_logger = logging.getLogger("leapp")
    level = leapp_logger.level
    leapp_logger.addHandler(keep)
    leapp_logger.setLevel(logging.INFO)  # the application shows leapp's INFO lines
    try:
        _logging.configure(str(tmp_path), verbose=False)
        assert _logging._only_the_file_takes(logging.INFO) is None
        _logging.log_messages(MESSAGES)
        _logging.close()
    finally:
        leapp_logger.removeHandler(keep)
        leapp_logger.setLevel(level)
    assert [(r.levelname, r.getMessage()) for r in records] == [
        (level.upper(), text) for level, text in MESSAGES]
    assert len(open(tmp_path / "log.txt").read().splitlines()) == 4
