"""InferenceManager.run_policy's inputs and threads.

* a graph input left out of ``run_policy`` keeps upstream's values (zeros, then
  the last value given) and is warned about once per input; ``strict=True``
  refuses it; ``set_input_value`` makes leaving it out deliberate;
* a NumPy array is taken as a tensor (shared memory when possible) and checked
  like one;
* one manager shared by threads gives every caller the outputs of its own
  inputs, and a pipeline with feedback advances its state one whole step at a
  time.

Bundles are TorchScript models and a YAML in the exported layout, written here.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from leapp.running.inference_manager import InferenceManager

DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class Affine(torch.nn.Module):
    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Accumulate(torch.nn.Module):
    """(x, total) -> (out, total_next): a running sum, fed back."""

    def forward(self, x: torch.Tensor, total: torch.Tensor):
        total_next = total + x
        return total_next.clone(), total_next


def _port(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> dict:
    return {"name": name, "dtype": DTYPES[dtype], "shape": list(shape), "type": "tensor"}


def write_bundle(directory: Any, nodes: list[tuple[str, torch.nn.Module, list[str], list[str]]],
                 pipeline: dict, shape: tuple[int, ...] = (1, 4),
                 dtype: torch.dtype = torch.float32) -> str:
    """nodes: (name, module, input names, output names); every port is `shape`, `dtype`."""
    directory = str(directory)
    models = {}
    for name, module, inputs, outputs in nodes:
        path = os.path.join(directory, f"{name}.pt")
        torch.jit.script(module.eval()).save(path)
        with open(path, "rb") as handle:
            data = handle.read()
        models[name] = {
            "inputs": [_port(n, shape, dtype) for n in inputs],
            "outputs": [_port(n, shape, dtype) for n in outputs],
            "parameters": {"model_path": f"{name}.pt",
                           "md5sum": hashlib.md5(data).hexdigest(),
                           "sha256sum": hashlib.sha256(data).hexdigest(),
                           "backend": "jit", "warp_segments": 0}}
    system = {"leapp config version": "1.3", "leapp version": "test", "os": "Linux",
              "python version": "3", "torch version": "2"}
    path = os.path.join(directory, "bundle.yaml")
    with open(path, "w") as handle:
        handle.write(yaml.dump({"models": models}, sort_keys=False) + "\n")
        handle.write(yaml.dump({"pipeline": pipeline}) + "\n")
        handle.write(yaml.dump({"system information": system}) + "\n")
    return path


def two_inputs(directory: Any) -> str:
    """a/x -> a (x*2+1) -> c/x; b/x -> b (x*3) -> c/y; c = x + y; output c/z."""
    nodes = [("a", Affine(2.0, 1.0), ["x"], ["y"]), ("b", Affine(3.0, 0.0), ["x"], ["y"]),
             ("c", Add(), ["x", "y"], ["z"])]
    pipeline = {"data_flow": {"a/y": ["c/x"], "b/y": ["c/y"]}, "feedback_flow": {},
                "inputs": {"a": ["x"], "b": ["x"]}, "outputs": {"c": ["z"]}}
    return write_bundle(directory, nodes, pipeline)


def chain(directory: Any, length: int = 6) -> str:
    """n0 -> n1 -> ... : each node x * (1 + i/10) + i, graph input n0/x, output n{last}/y."""
    nodes = [(f"n{i}", Affine(1.0 + i / 10, float(i)), ["x"], ["y"]) for i in range(length)]
    pipeline = {"data_flow": {f"n{i}/y": [f"n{i + 1}/x"] for i in range(length - 1)},
                "feedback_flow": {}, "inputs": {"n0": ["x"]},
                "outputs": {f"n{length - 1}": ["y"]}}
    return write_bundle(directory, nodes, pipeline)


def accumulator(directory: Any) -> str:
    """pre (identity) -> acc (running sum, fed back) -> post (identity), float64."""
    nodes = [("pre", Affine(1.0, 0.0), ["x"], ["y"]),
             ("acc", Accumulate(), ["x", "total"], ["out", "total_next"]),
             ("post", Affine(1.0, 0.0), ["x"], ["y"])]
    pipeline = {"data_flow": {"pre/y": ["acc/x"], "acc/out": ["post/x"]},
                "feedback_flow": {"acc/total_next": ["acc/total"]},
                "inputs": {"pre": ["x"]}, "outputs": {"post": ["y"]}}
    return write_bundle(directory, nodes, pipeline, shape=(1, 1), dtype=torch.float64)


def missing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "leapp" and r.levelno == logging.WARNING and "not given" in r.getMessage()]


# ---- missing inputs ----------------------------------------------------------


def test_missing_input_warned_once_per_key_with_upstreams_values(tmp_path, caplog):
    manager = InferenceManager(two_inputs(tmp_path))
    ones = torch.ones(1, 4)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        # b/x never given: zeros (upstream's first-call value)
        out = manager.run_policy({"a/x": ones})["c/z"]
        torch.testing.assert_close(out, torch.full((1, 4), 3.0), rtol=0, atol=0)
        out = manager.run_policy({"a/x": ones, "b/x": 2 * ones})["c/z"]
        torch.testing.assert_close(out, torch.full((1, 4), 9.0), rtol=0, atol=0)
        # a/x left out: its last value (upstream's later-call value)
        out = manager.run_policy({"b/x": ones})["c/z"]
        torch.testing.assert_close(out, torch.full((1, 4), 6.0), rtol=0, atol=0)
        for _ in range(3):
            manager.run_policy({})
    warnings = missing_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert "'b/x'" in warnings[0] and "zeros" in warnings[0]
    assert "set_input_value('b', 'x', value)" in warnings[0] and "strict=True" in warnings[0]
    assert "'a/x'" in warnings[1] and "last value given" in warnings[1]


def test_all_inputs_given_is_not_warned(tmp_path, caplog):
    manager = InferenceManager(two_inputs(tmp_path))
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for _ in range(3):
            manager.run_policy(manager.get_mock_input())
            manager(manager.get_mock_input())
    assert missing_warnings(caplog) == []


def test_set_input_value_then_missing_key_is_not_warned(tmp_path, caplog):
    manager = InferenceManager(two_inputs(tmp_path))
    manager.set_input_value("b", "x", torch.full((1, 4), 2.0))
    with caplog.at_level(logging.WARNING, logger="leapp"):
        out = manager.run_policy({"a/x": torch.ones(1, 4)})["c/z"]
    torch.testing.assert_close(out, torch.full((1, 4), 9.0), rtol=0, atol=0)
    assert missing_warnings(caplog) == []


def test_strict_refuses_a_missing_input_and_runs_nothing(tmp_path):
    manager = InferenceManager(two_inputs(tmp_path), strict=True)
    before = manager.run_policy({"a/x": torch.ones(1, 4), "b/x": torch.ones(1, 4)})["c/z"]
    with pytest.raises(KeyError, match=r"'b/x' not given.*strict=True.*set_input_value\('b', 'x'"):
        manager.run_policy({"a/x": torch.full((1, 4), 5.0)})
    with pytest.raises(KeyError, match=r"graph inputs 'a/x', 'b/x' not given"):
        manager({})
    # the refused calls changed nothing: a/x still holds its last value
    manager.set_input_value("b", "x", torch.ones(1, 4))
    manager.set_input_value("a", "x", torch.ones(1, 4))
    torch.testing.assert_close(manager.run_policy({})["c/z"], before, rtol=0, atol=0)


def test_strict_allows_an_input_set_with_set_input_value(tmp_path, caplog):
    manager = InferenceManager(two_inputs(tmp_path), strict=True)
    manager.set_input_value("b", "x", torch.full((1, 4), 2.0))
    with caplog.at_level(logging.WARNING, logger="leapp"):
        out = manager.run_policy({"a/x": torch.ones(1, 4)})["c/z"]
    torch.testing.assert_close(out, torch.full((1, 4), 9.0), rtol=0, atol=0)
    with pytest.raises(KeyError, match="'a/x' not given"):
        manager.run_policy({})
    assert missing_warnings(caplog) == []


# ---- NumPy inputs ------------------------------------------------------------


def test_numpy_input_is_accepted_and_shares_memory(tmp_path):
    manager = InferenceManager(chain(tmp_path, 1))
    array = np.full((1, 4), 2.0, dtype=np.float32)
    out = manager.run_policy({"n0/x": array})["n0/y"]
    torch.testing.assert_close(out, torch.full((1, 4), 2.0), rtol=0, atol=0)
    stored = manager.value_dict["n0"]["x"]
    assert isinstance(stored, torch.Tensor)
    assert stored.data_ptr() == array.ctypes.data  # no copy
    # a read-only array is copied, never written through
    frozen = np.full((1, 4), 3.0, dtype=np.float32)
    frozen.flags.writeable = False
    out = manager.run_policy({"n0/x": frozen})["n0/y"]
    torch.testing.assert_close(out, torch.full((1, 4), 3.0), rtol=0, atol=0)
    assert manager.value_dict["n0"]["x"].data_ptr() != frozen.ctypes.data
    # negative strides and a non-native byte order are copied too
    flipped = np.arange(4, dtype=np.float32)[::-1].reshape(1, 4)
    out = manager.run_policy({"n0/x": flipped})["n0/y"]
    torch.testing.assert_close(out, torch.tensor([[3.0, 2.0, 1.0, 0.0]]), rtol=0, atol=0)
    swapped = np.full((1, 4), 4.0, dtype=np.dtype(np.float32).newbyteorder())
    out = manager.run_policy({"n0/x": swapped})["n0/y"]
    torch.testing.assert_close(out, torch.full((1, 4), 4.0), rtol=0, atol=0)


def test_numpy_input_gets_the_tensor_checks(tmp_path):
    manager = InferenceManager(chain(tmp_path, 1))
    good = manager.run_policy({"n0/x": torch.ones(1, 4)})["n0/y"]
    with pytest.raises(TypeError, match=r"Dtype mismatch for input 'n0/x': expected "
                                        r"torch.float32, got torch.float64"):
        manager.run_policy({"n0/x": np.ones((1, 4))})
    with pytest.raises(ValueError, match=r"Shape mismatch for input 'n0/x': expected "
                                         r"\(1, 4\), got \(2, 4\)"):
        manager.run_policy({"n0/x": np.ones((2, 4), dtype=np.float32)})
    with pytest.raises(TypeError, match=r"Input 'n0/x' is a NumPy array of dtype object"):
        manager.run_policy({"n0/x": np.array([[None] * 4])})
    with pytest.raises(TypeError, match=r"Input 'n0/x' must be a tensor of shape"):
        manager.run_policy({"n0/x": [[1.0] * 4]})
    # refused inputs left the state as it was
    torch.testing.assert_close(manager.run_policy({})["n0/y"], good, rtol=0, atol=0)


def test_set_input_value_takes_numpy(tmp_path):
    manager = InferenceManager(chain(tmp_path, 1))
    manager.set_input_value("n0", "x", np.full((1, 4), 5.0, dtype=np.float32))
    torch.testing.assert_close(manager.run_policy({})["n0/y"], torch.full((1, 4), 5.0),
                               rtol=0, atol=0)


# ---- threads -----------------------------------------------------------------


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads as often as the interpreter allows: interleavings are likely."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def _run_threads(count: int, work) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(index: int) -> None:
        try:
            start.wait()
            work(index)
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_threads_each_get_their_own_outputs(tmp_path, busy_switching):
    manager = InferenceManager(chain(tmp_path))
    threads, steps = 4, 1500
    inputs = [[torch.full((1, 4), float(t * steps + k)) for k in range(steps)]
              for t in range(threads)]
    # the single-threaded reference, from the same manager (no state)
    reference = [[manager.run_policy({"n0/x": x})["n5/y"] for x in per] for per in inputs]
    results: list[list[torch.Tensor]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        for x in inputs[t]:
            results[t].append(manager.run_policy({"n0/x": x})["n5/y"])

    _run_threads(threads, work)
    wrong = sum(not torch.equal(got, want)
                for t in range(threads) for got, want in zip(results[t], reference[t]))
    assert [len(r) for r in results] == [steps] * threads
    assert wrong == 0, f"{wrong} of {threads * steps} outputs belong to another call"


def test_threads_advance_feedback_state_one_whole_step_at_a_time(tmp_path, busy_switching):
    manager = InferenceManager(accumulator(tmp_path))
    threads, steps = 3, 1500
    amounts = [1.0, 1000.0, 1000000.0]  # which thread's step it was shows in the sum
    seen: list[list[tuple[float, float]]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        x = torch.full((1, 1), amounts[t], dtype=torch.float64)
        for _ in range(steps):
            seen[t].append((manager.run_policy({"pre/x": x})["post/y"].item(), amounts[t]))

    _run_threads(threads, work)
    # every step read the total the previous step wrote: sorted by the total,
    # consecutive results differ by exactly the amount the later step added
    ordered = sorted(pair for per in seen for pair in per)
    previous = 0.0
    for total, amount in ordered:
        assert total - previous == amount, "a step read a state another step was writing"
        previous = total
    assert previous == steps * sum(amounts)
