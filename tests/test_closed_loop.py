"""Closed-loop validation: compile_graph replays the staged bundle as
InferenceManager runs it and compares every step with the trace.  Each test
breaks the staged bundle in one way (after it is written, before it is
validated) and checks that the replay names the step, the node and the port;
the node checks alone pass on every one of these bundles."""
from __future__ import annotations

import json
import os

import pytest
import torch

import leapp
from leapp import annotate, _core
from leapp.compiling import compiler
from safetensors.torch import load_file, save_file


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.cell = torch.nn.GRUCell(3, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, obs, h, c):
        h2 = self.cell(obs, h)
        c2 = torch.tanh(c + h2)
        return self.head(h2 + c2), h2, c2


@pytest.fixture(autouse=True)
def no_session_left(monkeypatch):
    yield
    if _core.is_tracing():
        leapp.stop()


def trace(tmp_path, passes: int = 3, reset_at: int | None = None) -> None:
    policy = Recurrent().eval()
    leapp.start("loop", save_path=str(tmp_path))
    h = torch.full((1, 4), 0.25)
    c = torch.zeros(1, 4)
    generator = torch.Generator().manual_seed(2)
    for step in range(passes):
        if step == reset_at:  # a new episode: the state starts again
            h, c = torch.full((1, 4), 0.25), torch.zeros(1, 4)
        obs = annotate.input_tensors("actor", {"obs": torch.randn(1, 3, generator=generator)})
        h_in, c_in = annotate.state_tensors("actor", {"h": h, "c": c})
        with torch.no_grad():
            action, h, c = policy(obs, h_in, c_in)
        annotate.update_state("actor", {"h": h, "c": c})
        annotate.output_tensors("actor", {"action": action}, export_with="jit")
    leapp.stop()


def break_staged(monkeypatch, edit) -> None:
    """Run edit(staging directory) once the staged bundle is written."""
    def checkpoint(phase: str) -> None:
        if phase == "written":
            (staging,) = compiler.SESSION.live_staging
            edit(staging)
    monkeypatch.setattr(compiler, "_checkpoint", checkpoint)


def edit_yaml(directory: str, old: str, new: str) -> None:
    path = os.path.join(directory, "loop.yaml")
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def compile_refused(capsys) -> str:
    with pytest.raises(Exception, match="Closed-loop validation failed") as raised:
        leapp.compile_graph(visualize=False)
    return str(raised.value)


def test_intact_bundle_passes_closed_loop(tmp_path):
    trace(tmp_path)
    result = leapp.compile_graph(visualize=False)
    assert result == {"actor": True}
    assert result.closed_loop == {"steps": 3, "passed": True, "difference": None,
                                  "breaks": [], "skipped": None}
    assert "closed loop: 3 step(s) reproduced" in result._repr_html_()
    with open(os.path.join(str(tmp_path), "loop", "log.txt")) as f:
        log = f.read()
    assert "[PASS] the bundle reproduced the trace for 3 steps closed-loop" in log


def test_reset_in_the_trace_is_taken_not_reported(tmp_path):
    trace(tmp_path, passes=4, reset_at=2)
    assert leapp.compile_graph(visualize=False) == {"actor": True}
    with open(os.path.join(str(tmp_path), "loop", "log.txt")) as f:
        log = f.read()
    assert "step 2: actor/h: the trace fed a value other than its feedback source" in log
    assert "reproduced the trace for 4 steps" in log


def test_swapped_feedback_edge_is_caught(tmp_path, monkeypatch, capsys):
    trace(tmp_path)
    break_staged(monkeypatch, lambda d: edit_yaml(
        d, "actor/c: [actor/c]\n    actor/h: [actor/h]",
        "actor/c: [actor/h]\n    actor/h: [actor/c]"))
    message = compile_refused(capsys)
    assert "step 0: actor/c (feedback value into actor/h)" in message
    assert "the trace has [" in message


def test_wrong_initial_value_is_caught(tmp_path, monkeypatch, capsys):
    trace(tmp_path)

    def wrong_initial(directory: str) -> None:
        path = os.path.join(directory, "loop_initial_values.safetensors")
        values = load_file(path)
        values["actor/h"] = torch.zeros_like(values["actor/h"])
        save_file(values, path)
    break_staged(monkeypatch, wrong_initial)
    message = compile_refused(capsys)
    assert "step 0: actor/h (initial value)" in message
    assert "[0, 0, 0, 0] (shape [1, 4], float32) where the trace has [0.25, 0.25" in message


def test_dropped_state_is_caught(tmp_path, monkeypatch, capsys):
    trace(tmp_path)

    def drop(directory: str) -> None:
        edit_yaml(directory, "    actor/h: [actor/h]\n", "")
        edit_yaml(directory, "actor: [obs]", "actor: [obs, h]")
        edit_yaml(directory, "actor: [action]", "actor: [action, h]")
    break_staged(monkeypatch, drop)
    message = compile_refused(capsys)
    assert "step 0: actor/h (a graph input of the bundle, fed by actor/h in the trace)" \
        in message


def test_bundle_that_does_not_load_is_a_closed_loop_failure(tmp_path, monkeypatch, capsys):
    trace(tmp_path)
    break_staged(monkeypatch, lambda d: edit_yaml(d, "    actor/h: [actor/h]\n", ""))
    message = compile_refused(capsys)
    assert "does not load in InferenceManager" in message and "unroutable outputs" in message


def test_closed_loop_failure_marks_the_node(tmp_path, monkeypatch):
    trace(tmp_path)
    break_staged(monkeypatch, lambda d: edit_yaml(
        d, "actor/c: [actor/c]\n    actor/h: [actor/h]",
        "actor/c: [actor/h]\n    actor/h: [actor/c]"))
    result = leapp.compile_graph(visualize=False, strict=False)
    assert result == {"actor": False}
    assert result.closed_loop["difference"].startswith("closed loop, step 0: actor/c")
    with open(os.path.join(str(tmp_path), "loop", "loop_analytics.json"), encoding="utf-8") as f:
        entries = json.load(f)["entries"]
    closed = [e for e in entries if e["output"].endswith(" [closed loop]")]
    assert [(e["node"], e["output"], e["sample"], e["passed"]) for e in closed] == [
        ("actor", "c [closed loop]", 0, False)]
    assert "feedback value into actor/h" in result._repr_html_()
