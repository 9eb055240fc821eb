"""Values that escape a node: kept by user code for the next call, read back as constants.

Each trap below keeps a value of the node for its next call in a way the
trace cannot see (a counter attribute, the previous output in an attribute,
a history in a Python list, a copy_ into a plain tensor of a module that is
not under annotate.module).  The exported node would replay the first
pass's value forever.  With one traced pass leapp names it at WARNING, once,
with the line marked `# escape`, and the fix; with two passes it is named the
same way and validation refuses the bundle; under leapp.start(strict=True) it
is refused.  Code that keeps values only for logging, builds a tensor of its
own in place, or declares its state, stays quiet.
"""
from __future__ import annotations

import inspect
import logging
import os

import pytest
import torch

import leapp
from leapp import annotate
from leapp.running.inference_manager import InferenceManager

STEPS = [torch.tensor([1.0, 2.0]), torch.tensor([-1.0, 0.5]), torch.tensor([3.0, -2.0])]


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.count = torch.zeros(1)

    def forward(self, x):
        self.count += 1  # escape
        return x * self.count


class PreviousOutput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.prev = torch.zeros(2)

    def forward(self, x):
        out = torch.tanh(x) + self.prev
        self.prev = out  # escape
        return out


class History(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hist = [torch.zeros(2), torch.zeros(2)]

    def forward(self, x):
        self.hist.append(x)  # escape
        self.hist.pop(0)
        return torch.cat(self.hist)


class CopyIntoBuffer(torch.nn.Module):
    """A low-pass filter whose memory is a registered buffer, not under annotate.module."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("smooth", torch.zeros(2))

    def forward(self, x):
        out = 0.9 * self.smooth + 0.1 * x
        self.smooth.copy_(out)  # escape
        return out


TRAPS = {"counter": (Counter, "count"), "previous_output": (PreviousOutput, "prev"),
         "list_history": (History, "hist"), "copy_into_module_tensor": (CopyIntoBuffer,
                                                                       "smooth")}


def _site(cls) -> str:
    lines, first = inspect.getsourcelines(cls)
    (offset,) = [i for i, text in enumerate(lines) if text.rstrip().endswith("# escape")]
    return f"{os.path.abspath(__file__)}:{first + offset}"


def _run(module, passes: int, graph: str = "g") -> None:
    for x in STEPS[:passes]:
        x = annotate.input_tensors("n", {"x": x.clone()})
        annotate.output_tensors("n", {"y": module(x)}, export_with="jit")


def _named(caplog, site: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "leapp" and site in r.getMessage()]


@pytest.mark.parametrize("case", sorted(TRAPS))
def test_one_pass_names_the_escape_at_warning(bundle, case, caplog):
    cls, name = TRAPS[case]
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(cls(), 1)
    (record,) = _named(caplog, _site(cls))
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith("Node 'n': ")
    assert f"{cls.__name__}.{name}" in message
    assert f"annotate.state_tensors('n', {{'{name}': {name}}})" in message
    assert "annotate.update_state('n'" in message and "annotate.module('n', module)" in message
    assert "constant in the exported model" in message
    leapp.stop()
    # One pass: validation cannot see it (sample 0 agrees); the warning is what tells.
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}


@pytest.mark.parametrize("case", sorted(TRAPS))
def test_two_passes_name_it_once_and_validation_refuses(bundle, case, caplog):
    cls, _ = TRAPS[case]
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(cls(), 2)
    assert len(_named(caplog, _site(cls))) == 1
    leapp.stop()
    with pytest.raises(Exception, match="validation failed"):
        leapp.compile_graph(visualize=False, verbose=False)


@pytest.mark.parametrize("case", sorted(TRAPS))
def test_strict_refuses_the_escape(bundle, case):
    cls, _ = TRAPS[case]
    leapp.start("g", save_path=bundle.root, strict=True)
    with pytest.raises(RuntimeError, match="strict mode") as err:
        _run(cls(), 1)
    assert _site(cls) in str(err.value)


def test_each_site_is_named_once_per_session(bundle, caplog):
    """Two nodes running the same module code: one warning for its one line."""
    module = PreviousOutput()
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for node in ("a", "b"):
            x = annotate.input_tensors(node, {"x": STEPS[0].clone()})
            annotate.output_tensors(node, {"y": module(x)}, export_with="jit")
    assert len(_named(caplog, _site(PreviousOutput))) == 1
    leapp.stop()
    leapp.start("g2", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(PreviousOutput(), 1)
    assert len(_named(caplog, _site(PreviousOutput))) == 2  # a new session names it again


# ---------------------------------------------------------------------------
# quiet: what exports correctly today


class KeepsForLogging(torch.nn.Module):
    """Keeps values it never reads back inside the node; builds one tensor in place."""

    def __init__(self) -> None:
        super().__init__()
        self.last_action = torch.zeros(2)
        self.actions: list = []
        self.calls = torch.zeros(())

    def forward(self, x):
        action = torch.tanh(x) * 2.0
        self.last_action = action.detach()
        self.actions.append(action.detach())
        self.calls += 1
        out = torch.zeros(2)
        out.copy_(action)
        out[0] = action[1]
        return out + 1.0


class MovesItsConstants(torch.nn.Module):
    """Sets its constants again in forward (device and dtype moves, a recomputed cache)
    with the same values: nothing changes from call to call."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = torch.tensor([0.5, -0.5], dtype=torch.float64)
        self.register_buffer("std", torch.tensor([2.0, 4.0]))
        self.scale = torch.full((2,), 3.0)

    def forward(self, x):
        self.mean = self.mean.to(x.device)
        self.mean = self.mean.float()
        self.std = self.std.to(x.device)
        self.scale = torch.ones(2) * 3.0
        return (x - self.mean) / self.std * self.scale


class DeclaredPrevious(torch.nn.Module):
    """PreviousOutput with the fix: the kept value is a registered buffer under
    annotate.module."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("prev", torch.zeros(2))

    def forward(self, x):
        out = torch.tanh(x) + self.prev
        self.prev = out
        return out


def _no_escape(caplog) -> None:
    named = [r.getMessage() for r in caplog.records
             if r.name == "leapp" and "annotate.state_tensors(" in r.getMessage()]
    assert not named, named


@pytest.mark.parametrize("passes", [1, 3])
def test_values_kept_for_logging_are_not_named(bundle, caplog, passes):
    module = KeepsForLogging()
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(module, passes)
    leapp.stop()
    _no_escape(caplog)
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    x = torch.tensor([0.3, -0.7])
    torch.testing.assert_close(manager.run_policy({"n/x": x})["n/y"], KeepsForLogging()(x))


@pytest.mark.parametrize("passes", [1, 3])
def test_constants_set_again_unchanged_are_not_named(bundle, caplog, passes):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        _run(MovesItsConstants(), passes)
    leapp.stop()
    _no_escape(caplog)
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}


def test_state_under_annotate_module_is_not_named_and_replays(bundle, caplog):
    module = DeclaredPrevious()
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for x in STEPS:
            x = annotate.input_tensors("n", {"x": x.clone()})
            annotate.module("n", module)
            annotate.output_tensors("n", {"y": module(x)}, export_with="jit")
    leapp.stop()
    _no_escape(caplog)
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    eager = DeclaredPrevious()
    for x in STEPS + STEPS:
        torch.testing.assert_close(manager.run_policy({"n/x": x})["n/y"], eager(x))


def test_declared_state_is_not_named_and_replays(bundle, caplog):
    """PreviousOutput with state_tensors / update_state: quiet, and exact over 6 steps."""
    leapp.start("g", save_path=bundle.root)
    prev = torch.zeros(2)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        for x in STEPS:
            x = annotate.input_tensors("n", {"x": x.clone()})
            state = annotate.state_tensors("n", {"prev": prev})
            out = torch.tanh(x) + state
            annotate.update_state("n", {"prev": out})
            annotate.output_tensors("n", {"y": out}, export_with="jit")
            prev = out
    leapp.stop()
    _no_escape(caplog)
    assert leapp.compile_graph(visualize=False, verbose=False) == {"n": True}
    manager = InferenceManager(os.path.join(bundle.dir("g"), "g.yaml"))
    eager = PreviousOutput()
    for x in STEPS + STEPS:
        torch.testing.assert_close(manager.run_policy({"n/x": x})["n/y"], eager(x))


def test_probes_are_gone_outside_first_passes(bundle):
    """The forward pre-hook is there only while a node is in its first pass; the
    __setattr__ probe notes nothing outside one; both are torch's own after stop()."""
    original = torch.nn.Module.__dict__["__setattr__"]
    module = PreviousOutput()
    leapp.start("g", save_path=bundle.root)
    assert not torch.nn.modules.module._global_forward_pre_hooks
    x = annotate.input_tensors("n", {"x": STEPS[0].clone()})
    assert torch.nn.modules.module._global_forward_pre_hooks  # probing
    annotate.output_tensors("n", {"y": module(x)}, export_with="jit")
    assert not torch.nn.modules.module._global_forward_pre_hooks
    from leapp.tracing import escapes
    assert not escapes._PROBES.open
    module.prev = torch.ones(2)  # outside a first pass: nothing noted
    x = annotate.input_tensors("m", {"x": STEPS[0].clone()})
    leapp.stop()  # m never finished
    assert torch.nn.Module.__dict__["__setattr__"] is original
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not escapes._PROBES.open


@pytest.mark.parametrize("case", sorted(TRAPS))
def test_named_under_inference_mode_too(bundle, case, caplog):
    """Export scripts run policies under torch.inference_mode (Isaac Lab does): the probes
    work there (inference tensors keep no version counter)."""
    cls, _ = TRAPS[case]
    with torch.inference_mode():
        module = cls()
        leapp.start("g", save_path=bundle.root)
        with caplog.at_level(logging.WARNING, logger="leapp"):
            _run(module, 1)
    assert len(_named(caplog, _site(cls))) == (0 if case == "counter" else 1)
