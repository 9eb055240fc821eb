"""The catalogue of docs/backends.md: model families users export x every backend.

Each family (tests/export_catalogue.py) is traced once and every backend is tried
on it with leapp.check_backends() (a real export, reloaded as InferenceManager
loads it and run on the traced inputs); the outcome must be the table's.  Every
refused cell is then compiled with its backend: compile_graph raises one
ExportError naming the node, the backend and the op, and nothing of torch's
reaches the console.
"""
from __future__ import annotations

import os
import re

import pytest

import leapp
from export_catalogue import BACKENDS, FAMILIES, trace
from leapp.compiling.backend_survey import SHORT
from support import ROOT

DOC = os.path.join(ROOT, "docs", "backends.md")

# What torch's exporters print when they reach the console: IR lines, tracebacks,
# the dynamo exporter's progress, the TorchScript exporter's dump header.
CONSOLE_DUMP = re.compile(r"^\s*%\S+ : |graph\(|Traceback \(most recent call last\)|"
                          r"\[torch\.onnx\]|Torch IR graph|SymbolicValueError\.__init__",
                          re.MULTILINE)


def documented() -> dict[str, dict[str, str]]:
    """{family: {backend: 'exports' | op refused}} from the table of docs/backends.md."""
    with open(DOC, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    header = next(i for i, line in enumerate(lines)
                  if line.startswith("| family | ") and "onnx-torchscript" in line)
    names = [c.strip() for c in lines[header].strip("|").split("|")][1:]
    table: dict[str, dict[str, str]] = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        family = cells[0].strip("`")
        row = {}
        for name, cell in zip(names, cells[1:]):
            if cell == "exports":
                row[name] = "exports"
            else:
                match = re.fullmatch(r"refused: `(\w+)`", cell)
                assert match, f"docs/backends.md: cell {family}/{name} reads {cell!r}"
                row[name] = match.group(1)
        table[family] = row
    return table


TABLE = documented()
REFUSED = [(family, backend, op) for family, row in TABLE.items()
           for backend, op in row.items() if op != "exports"]


def test_the_table_covers_every_family_and_backend():
    assert list(TABLE) == list(FAMILIES)
    assert all(sorted(row) == sorted(BACKENDS) for row in TABLE.values())
    assert REFUSED, "the catalogue shows no refusal: the error path goes untested"


def assert_quiet(capfd) -> None:
    out, err = capfd.readouterr()
    dump = CONSOLE_DUMP.search(out + err)
    assert dump is None, f"torch's output reached the console: {dump.group(0)!r}\n{out}{err}"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_backend_does_what_the_table_says(family, tmp_path, capfd):
    trace(family, "jit", str(tmp_path))
    attempts = leapp.check_backends(budget=600)[family]
    assert sorted(attempts) == sorted(BACKENDS)
    found = {}
    for name, attempt in attempts.items():
        assert attempt.export_with == name
        if attempt.ok:
            found[name] = "exports"
            continue
        assert attempt.ok is False, attempt  # tried, not skipped for time
        assert "\n" not in attempt.reason and attempt.reason, attempt
        assert not attempt.reason.startswith("TypeError"), attempt  # torch's own error path
        found[name] = attempt.op or attempt.reason
    assert found == TABLE[family]
    assert_quiet(capfd)


@pytest.mark.parametrize("family,backend,op", REFUSED)
def test_a_refused_cell_raises_one_clear_error(family, backend, op, tmp_path, capfd,
                                               monkeypatch):
    monkeypatch.setenv("LEAPP_SURVEY_SECONDS", "0")  # the survey: test_export_errors.py
    graph = trace(family, backend, str(tmp_path))
    with pytest.raises(leapp.ExportError) as caught:
        leapp.compile_graph(visualize=False)
    error = caught.value
    canonical = {v: k for k, v in SHORT.items()}[backend]
    assert (error.node, error.backend, error.op) == (family, canonical, op)
    message = str(error)
    assert message.startswith(f"node '{family}' cannot be exported with backend "
                              f"'{canonical}': op `{op}`")
    assert "torch says: " in message and "Fix: " in message
    assert len(message.splitlines()) <= 4
    assert error.__suppress_context__ and error.__cause__ is None  # torch's chain: log.txt
    assert_quiet(capfd)
    with open(os.path.join(tmp_path, graph, "log.txt"), encoding="utf-8") as handle:
        log = handle.read()
    assert f"torch's error exporting with {canonical}" in log
    assert "Traceback (most recent call last)" in log
