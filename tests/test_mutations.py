"""In-place writes that cross what a node declares.

* An `annotate.module` buffer written in place (`buf.mul_()`, `buf.add_()`,
  `buf.mul_(0.9).add_(x)`, `buf[:] = v`, `buf.copy_(v)`, `buf[i] += v`,
  `torch.add(buf, x, out=buf)`) is an update of the node's state, as a
  reassigned buffer is: the exported bundle, replayed by InferenceManager on
  new inputs, equals the eager module step by step.
* A node declaring as input a tensor that another node declared and then wrote
  in place gets upstream's error-level message, extended with the writer, the
  tensor, the declaring file:line and the fix (strict mode: a RuntimeError).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import leapp
from leapp import InferenceManager, annotate
from state_helpers import compile_quiet, leapp_session, load_initial, load_yaml  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402

UPSTREAM = compat.find_upstream_python()

INITIAL = torch.tensor([[0.5, -1.0, 2.0]])


def _write(model: nn.Module, kind: str, x: torch.Tensor) -> None:
    """The buffer update of each variant; every one is eager-equivalent to itself."""
    if kind == "mul":
        model.acc.mul_(torch.sigmoid(x) + 0.5)
    elif kind == "add":
        model.acc.add_(x)
    elif kind == "chain":
        model.acc.mul_(0.9).add_(x)
    elif kind == "setitem":
        model.acc[:] = model.acc * 0.5 + x
    elif kind == "row":  # a [1, 3] value into the row acc[0] ([3]): torch drops the 1
        model.acc[0] = model.acc * 0.5 + x
    elif kind == "copy":
        model.acc.copy_(model.acc * 0.5 + x)
    elif kind == "index":
        model.acc[0, 1] += x[0, 1]
    elif kind == "out":
        torch.add(model.acc, x, out=model.acc)
    elif kind == "reassign":
        model.acc = model.acc * 0.9 + x
    else:
        raise AssertionError(kind)


class Accumulator(nn.Module):
    """acc updated in forward as `kind` says; `kinds` cycles per call (a buffer
    written in place on one step and reassigned on another)."""

    def __init__(self, kinds: list[str]):
        super().__init__()
        self.register_buffer("acc", INITIAL.clone())
        self.register_buffer("gain", torch.tensor([[1.0, 2.0, 3.0]]))  # read only
        self.kinds = kinds
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = self.acc * 1.0
        _write(self, self.kinds[self.calls % len(self.kinds)], x)
        self.calls += 1
        return self.acc * self.gain + before


class Nested(nn.Module):
    """The written buffer belongs to a submodule (state name 'inner_acc')."""

    def __init__(self):
        super().__init__()
        self.inner = Accumulator(["chain"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) - 1.0


def _inputs(seed: int, steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, generator=generator) for _ in range(steps)]


def _export(tmp_path, graph: str, model: nn.Module, passes: int, backend: str) -> str:
    leapp.start(graph, save_path=str(tmp_path))
    for x in _inputs(1, passes):
        x = annotate.input_tensors("p", {"x": x})
        annotate.module("p", model)
        with torch.no_grad():
            y = model(x)
        annotate.output_tensors("p", {"y": y}, export_with=backend)
    result = compile_quiet()
    assert result == {"p": True}, result  # every cached sample validated
    return os.path.join(str(tmp_path), graph)


def _flow(backend: str, name: str = "acc") -> dict:
    """The feedback edge of the state; ONNX ports of a name used twice get _in/_out."""
    if backend == "onnx":
        return {f"p/{name}_out": [f"p/{name}_in"]}
    return {f"p/{name}": [f"p/{name}"]}


def _replay(bundle: str, graph: str, fresh: nn.Module, steps: int = 5) -> None:
    """InferenceManager on new inputs vs the eager module from its initial state."""
    manager = InferenceManager(os.path.join(bundle, f"{graph}.yaml"))
    for x in _inputs(7, steps):
        with torch.no_grad():
            expected = fresh(x)
        got = manager.run_policy({"p/x": x})
        assert torch.allclose(got["p/y"], expected, atol=1e-5), (got["p/y"], expected)


VARIANTS = ["mul", "add", "chain", "setitem", "row", "copy", "index", "out"]


@pytest.mark.parametrize("backend", ["jit", "onnx", "pt2"])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("kind", VARIANTS)
def test_in_place_buffer_write_is_feedback_state(tmp_path, kind, passes, backend):
    graph = f"{kind}_{passes}_{backend}"
    model = Accumulator([kind])
    bundle = _export(tmp_path, graph, model, passes, backend)
    doc = load_yaml(bundle, graph)
    assert doc["pipeline"]["feedback_flow"] == _flow(backend)
    state_in = "acc_in" if backend == "onnx" else "acc"
    assert [p["name"] for p in doc["models"]["p"]["inputs"]] == ["x", state_in]
    # the initial value is the buffer's value when tracing began
    assert torch.equal(load_initial(bundle, graph)[f"p/{state_in}"], INITIAL)
    # eager semantics kept: a plain tensor holding every write of the session
    expected = Accumulator([kind])
    for x in _inputs(1, passes):
        expected(x)
    assert type(model.acc) is torch.Tensor and torch.allclose(model.acc, expected.acc)
    _replay(bundle, graph, Accumulator([kind]))


@pytest.mark.parametrize("backend", ["jit", "onnx", "pt2"])
@pytest.mark.parametrize("kinds", [["chain", "reassign", "chain"],
                                   ["reassign", "chain", "chain"]])
def test_buffer_written_in_place_on_one_step_reassigned_on_another(tmp_path, kinds, backend):
    """The same update written in place on some passes and reassigned on others:
    one state either way; every cached sample validates and the replay matches."""
    graph = "mixed_" + "_".join(kinds) + f"_{backend}"
    model = Accumulator(kinds)
    bundle = _export(tmp_path, graph, model, len(kinds), backend)
    doc = load_yaml(bundle, graph)
    assert doc["pipeline"]["feedback_flow"] == _flow(backend)
    expected = Accumulator(["chain"])
    for x in _inputs(1, len(kinds)):
        expected(x)
    assert type(model.acc) is torch.Tensor and torch.allclose(model.acc, expected.acc)
    _replay(bundle, graph, Accumulator(kinds))


@pytest.mark.parametrize("passes", [1, 2])
def test_in_place_write_to_a_submodule_buffer(tmp_path, passes):
    bundle = _export(tmp_path, f"nested_{passes}", Nested(), passes, "jit")
    doc = load_yaml(bundle, f"nested_{passes}")
    assert doc["pipeline"]["feedback_flow"] == {"p/inner_acc": ["p/inner_acc"]}
    _replay(bundle, f"nested_{passes}", Nested())


def test_read_only_buffer_stays_a_constant(tmp_path):
    """Only the written buffer becomes state; 'gain' is baked in."""
    bundle = _export(tmp_path, "constants", Accumulator(["add"]), 1, "jit")
    doc = load_yaml(bundle, "constants")
    assert [p["name"] for p in doc["models"]["p"]["inputs"]] == ["x", "acc"]
    assert list(load_initial(bundle, "constants")) == ["p/acc"]


def test_out_keyword_writes_its_target_in_the_export(tmp_path):
    """torch.add(a, c, out=c) inside a node: the export computes c's new value
    without writing into the tensor the caller gave as input."""
    leapp.start("out_kw", save_path=str(tmp_path))
    a, c = annotate.input_tensors("p", {"a": torch.ones(2), "c": torch.zeros(2)})
    torch.add(a, c, out=c)
    annotate.output_tensors("p", {"y": c * 3.0}, export_with="jit")
    compile_quiet()
    manager = InferenceManager(os.path.join(str(tmp_path), "out_kw", "out_kw.yaml"))
    c_in = torch.full((2,), 9.0)
    got = manager.run_policy({"p/a": torch.tensor([1.0, 2.0]), "p/c": c_in})
    assert torch.equal(got["p/y"], torch.tensor([30.0, 33.0]))
    assert torch.equal(c_in, torch.full((2,), 9.0))  # the caller's tensor is untouched


# ---- an input written in place by another node ---------------------------------------

UPSTREAM_TEXT = ("Error: input 'x' for node 'B' was derived from node 'A' but is not one of "
                 "its registered outputs.\nAdd it to that node's output_tensors() to connect "
                 "the two nodes, or ignore this if 'x' is meant to enter the graph from "
                 "outside.\nTreating 'x' as a dangling input.")


def _cross_node(tmp_path, passes: int, write: bool = True, publish: bool = False) -> int:
    """A writes its input in place; B declares the same tensor. Returns B's line."""
    leapp.start("cross", save_path=str(tmp_path))
    line = 0
    for x in _inputs(3, passes):
        a = annotate.input_tensors("A", {"x": x})
        if write:
            a.mul_(2.0)
        outputs = {"y": a + 1.0}
        if publish:
            outputs["x2"] = a
        published = annotate.output_tensors("A", outputs, export_with="jit")
        line = sys._getframe().f_lineno + 1
        b = annotate.input_tensors("B", {"x": published[1] if publish else x})
        annotate.output_tensors("B", {"z": b * 3.0}, export_with="jit")
    return line


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "leapp" and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("passes", [1, 2])
def test_input_written_in_place_by_another_node_is_reported(tmp_path, caplog, passes):
    caplog.set_level(logging.INFO, logger="leapp")
    line = _cross_node(tmp_path, passes)
    messages = [m for m in _errors(caplog) if "wrote tensor" in m]
    assert len(messages) == 1, _errors(caplog)  # the first pass only
    message = messages[0]
    assert message.startswith(UPSTREAM_TEXT)
    for part in ("Node 'A' wrote tensor 'x' in place", "by 'mul'", "input 'x'",
                 f"test_mutations.py:{line}", "annotate.output_tensors('A'", "clone()"):
        assert part in message, (part, message)
    compile_quiet()
    doc = load_yaml(os.path.join(str(tmp_path), "cross"), "cross")
    assert doc["pipeline"]["inputs"] == {"A": ["x"], "B": ["x"]}  # as upstream wires it
    assert doc["pipeline"]["data_flow"] == {}


def test_input_written_in_place_by_another_node_is_refused_in_strict_mode(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("LEAPP_STRICT", "1")
    with pytest.raises(RuntimeError) as caught:
        _cross_node(tmp_path, 1)
    text = str(caught.value)
    assert text.startswith(UPSTREAM_TEXT) and "strict mode" in text
    assert "test_mutations.py:" in text and "Node 'A' wrote tensor 'x'" in text


@pytest.mark.parametrize("write, publish", [(False, False), (True, True)])
def test_unwritten_or_published_input_is_not_reported(tmp_path, caplog, write, publish):
    caplog.set_level(logging.INFO, logger="leapp")
    _cross_node(tmp_path, 1, write=write, publish=publish)
    assert not [m for m in _errors(caplog) if "derived from node" in m]
    compile_quiet()
    doc = load_yaml(os.path.join(str(tmp_path), "cross"), "cross")
    if publish:
        assert doc["pipeline"]["data_flow"] == {"A/x2": ["B/x"]}


_UPSTREAM_SCRIPT = textwrap.dedent("""
    import logging, sys, torch, leapp
    from leapp import annotate
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)
    logging.getLogger().addHandler(Keep())  # leapp.start() resets the leapp logger's own
    leapp.start("cross", save_path=sys.argv[1])
    x = torch.ones(1, 3)
    a = annotate.input_tensors("A", {"x": x})
    a.mul_(2.0)
    annotate.output_tensors("A", {"y": a + 1.0}, export_with="jit")
    b = annotate.input_tensors("B", {"x": x})
    annotate.output_tensors("B", {"z": b * 3.0}, export_with="jit")
    leapp.stop()
    for record in records:
        if "derived from node" in record.getMessage():
            print(record.levelno)
            print(record.getMessage().replace("\\x1b[91m", "").replace("\\x1b[0m", ""))
""")


@pytest.mark.skipif(UPSTREAM is None, reason="no upstream leapp interpreter: run `make compat` "
                    "(creates .compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_message_starts_with_upstreams(tmp_path, caplog):
    script = tmp_path / "upstream_cross.py"
    script.write_text(_UPSTREAM_SCRIPT)
    # upstream's interpreter imports its own leapp: no PYTHONPATH pointing at this tree
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([UPSTREAM, str(script), str(tmp_path / "up")], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300, check=True, env=env)
    level, _, text = done.stdout.partition("\n")
    assert int(level) == logging.ERROR
    assert text.strip() == UPSTREAM_TEXT
    caplog.set_level(logging.INFO, logger="leapp")
    _cross_node(tmp_path / "ours", 1)
    ours = [r for r in caplog.records if "wrote tensor" in r.getMessage()]
    assert [r.levelname for r in ours] == ["ERROR"]
    assert ours[0].getMessage().startswith(text.strip())
