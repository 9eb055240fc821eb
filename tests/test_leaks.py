"""No reference, object or traced value is left behind by the hot paths: the op
handler, the annotations (with and without a session), what stop() makes plain
again, Program.run (through InferenceManager.run_policy) and the core's graph
and YAML code.

Each runs thousands of times in a fresh interpreter (tests/leaks.py); every
snapshot after the warm-up must equal the first exactly.  The same steps keeping
one object per call must show, so each check is seen to trip.
"""
from __future__ import annotations

import pytest

import leaks

WITH_TORCH = ("program_run", "annotations", "op_handler", "stop_restores")


@pytest.fixture(scope="module")
def measured():
    return {**leaks.measure(*WITH_TORCH), **leaks.measure("graph_and_yaml")}


@pytest.mark.parametrize("name", [*WITH_TORCH, "graph_and_yaml"])
def test_repeating_the_step_leaves_nothing_behind(measured, name):
    clean = measured[name]["clean"]
    assert len(clean) == leaks.ROUNDS + 1
    assert leaks.differences(clean) == []


@pytest.mark.parametrize("name", [*WITH_TORCH, "graph_and_yaml"])
def test_a_step_that_keeps_an_object_is_caught(measured, name):
    last_clean = measured[name]["clean"][-1]
    found = leaks.differences([last_clean, *measured[name]["leaky"]])
    assert any("gc_objects" in line for line in found), found
    if name == "op_handler":  # each kept result is a TracedTensor with its Carrier
        assert f"round 1: live[TracedTensor] 1 -> {1 + leaks.REPEAT}" in found
        assert f"round 1: live[Carrier] 1 -> {1 + leaks.REPEAT}" in found


def test_differences_names_what_changed():
    first = {"refcounts": {"x": 2}, "live": {"Carrier": 0}, "gc_objects": 10,
             "total_refcount": None}
    later = {"refcounts": {"x": 3}, "live": {"Carrier": 1}, "gc_objects": 10,
             "total_refcount": None}
    assert leaks.differences([first, first]) == []
    assert leaks.differences([first, later]) == ["round 1: refcounts[x] 2 -> 3",
                                                 "round 1: live[Carrier] 0 -> 1"]
