"""State changed outside the node between steps: named, not excused.

A loop that clips a node's state update outside every node before declaring it
again (``h = new.clamp(-0.1, 0.1)``, as an environment clips the last action it
stores) traces one thing and exports another: the bundle feeds back the
unclipped update.  The later pass's declaration carries the tag of the op that
made it from the node's output, and leapp names the state, the op and the line.
"""
from __future__ import annotations

import logging

import pytest
import torch

import leapp
from leapp import annotate


def _trace(tmp_path, backend: str, passes: int, strict: bool = False,
           clip: bool = True) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    leapp.start("loop", save_path=str(tmp_path), strict=strict)
    h = torch.zeros(1, 4)
    gen = torch.Generator().manual_seed(1)
    for _ in range(passes):
        obs = annotate.input_tensors("node", {"obs": torch.randn(1, 4, generator=gen)})
        hs = annotate.state_tensors("node", {"h": h})
        new = torch.tanh(lin(obs) + hs) * 2
        annotate.update_state("node", {"h": new})
        annotate.output_tensors("node", {"y": new * 3}, export_with=backend)
        h = new.clamp(-0.1, 0.1) if clip else new  # outside every node
    leapp.stop()


@pytest.mark.parametrize("backend", ["jit", "onnx"])
def test_clipped_state_is_warned_naming_state_op_and_line(tmp_path, caplog, backend):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _trace(tmp_path, backend, passes=3)
    warned = [r.getMessage() for r in caplog.records if "computed outside every node by "
              "'clamp'" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "State 'h' of node 'node' is declared at " in warned[0]
    assert "test_changed_feedback.py:" in warned[0]
    assert "from output 'h' of node 'node'" in warned[0]
    assert "Fix: do the 'clamp' inside the node" in warned[0]


@pytest.mark.parametrize("backend", ["jit", "onnx"])
def test_clipped_state_is_refused_under_strict(tmp_path, backend):
    with pytest.raises(RuntimeError, match=r"State 'h' of node 'node' .* by 'clamp' .*strict"):
        _trace(tmp_path, backend, passes=2, strict=True)
    leapp.stop()


def test_state_fed_back_as_is_stays_quiet(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _trace(tmp_path, "jit", passes=3, clip=False)
    assert not [r for r in caplog.records if "computed outside every node" in r.getMessage()]


@pytest.mark.parametrize("backend", ["jit", "onnx"])
def test_the_closed_loop_counts_it_as_a_difference(tmp_path, backend):
    """compile_graph's closed loop no longer takes the clipped value for a reset."""
    _trace(tmp_path, backend, passes=3)
    with pytest.raises(Exception, match=r"closed loop, step 1: node/h.*feedback changed "
                                         r"outside every node.*'clamp'"):
        leapp.compile_graph(visualize=False)


def test_a_closed_loop_that_checks_no_feedback_warns(tmp_path, caplog):
    """Every step resets the state (a fresh zeros tensor): each is a break, none is
    checked, and the closed loop says so instead of passing quietly."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    leapp.start("resets", save_path=str(tmp_path))
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        obs = annotate.input_tensors("node", {"obs": torch.randn(1, 4, generator=gen)})
        hs = annotate.state_tensors("node", {"h": torch.zeros(1, 4)})
        new = torch.tanh(lin(obs) + hs)
        annotate.update_state("node", {"h": new})
        annotate.output_tensors("node", {"y": new * 3}, export_with="jit")
    leapp.stop()
    with caplog.at_level(logging.WARNING, logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"node": True}
    assert any("Closed-loop validation checked no fed-back value" in r.getMessage()
               and "node/h" in r.getMessage() for r in caplog.records)
    assert not any("[PASS] the bundle reproduced the trace" in r.getMessage()
                   for r in caplog.records)


def test_a_random_op_whose_draws_reach_no_output_keeps_the_closed_loop(tmp_path, caplog):
    """An action sampled and discarded (rl_games' player) draws random numbers that never
    reach the node's outputs: the closed loop runs."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    leapp.start("sampled", save_path=str(tmp_path))
    h = torch.zeros(1, 4)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        obs = annotate.input_tensors("node", {"obs": torch.randn(1, 4, generator=gen)})
        hs = annotate.state_tensors("node", {"h": h})
        new = torch.tanh(lin(obs) + hs)
        _ = torch.normal(new, 1.0)  # sampled, then discarded
        annotate.update_state("node", {"h": new})
        annotate.output_tensors("node", {"y": new * 3}, export_with="jit")
        h = new
    leapp.stop()
    with caplog.at_level(logging.INFO, logger="leapp"):
        assert leapp.compile_graph(visualize=False) == {"node": True}
    said = [r.getMessage() for r in caplog.records]
    assert not any("Closed-loop validation not run" in m for m in said)
    assert any("[PASS] the bundle reproduced the trace for 3 steps closed-loop" in m
               for m in said)
