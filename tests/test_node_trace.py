"""leapp.tracing.node_trace: a callable traced as one node outside every session
(what the fused ONNX model's TorchScript and pt2 nodes go through), and
write_callable, its door to the ONNX writer (leapp.compiling.onnx_callable)."""
from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

import leapp
from leapp import annotate
from leapp.compiling.onnx_callable import NotWritten, write_callable
from leapp.tracing.node_trace import NotTraceable, trace_callable
from leapp.tracing.session_state import SESSION


class _Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.arange(5.0))

    def forward(self, x, h):
        y = (x - self.mean)[:, 1:4]
        h2 = h.clone()
        h2[:, :2].mul_(0.5)  # an in-place write through a view
        return torch.cat([y, h2], dim=-1), h2


class _Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


@pytest.fixture(autouse=True)
def _writer_on(monkeypatch):
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)


@pytest.mark.parametrize("how", ["script", "trace"])
def test_written_model_matches_the_module(how):
    module = _Norm().eval()
    examples = [torch.zeros(2, 5), torch.zeros(2, 3)]
    if how == "script":
        module = torch.jit.script(module)
    else:
        module = torch.jit.trace(module, (torch.randn(2, 5), torch.randn(2, 3)))
    nodes, config = dict(leapp._core.nodes()), SESSION.config
    model = write_callable("norm", module, examples, ["x", "h"], ["y", "h"], 18)
    assert dict(leapp._core.nodes()) == nodes and SESSION.config is config
    assert not leapp._core.is_tracing()
    # a name on both sides is split as for an exported node
    assert [i.name for i in model.graph.input] == ["x", "h_in"]
    assert [o.name for o in model.graph.output] == ["y", "h_out"]
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, h = torch.randn(2, 5, generator=gen), torch.randn(2, 3, generator=gen)
        got = session.run(None, {"x": x.numpy(), "h_in": h.numpy()})
        for actual, expected in zip(got, module(x, h)):
            torch.testing.assert_close(torch.from_numpy(actual), expected)


def test_graph_has_the_modules_ops():
    graph = trace_callable("norm", torch.jit.script(_Norm()), [torch.zeros(2, 5),
                                                                 torch.zeros(2, 3)],
                           ["x", "h"], ["y", "h"]).graph
    targets = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert {"aten.sub", "aten.slice", "aten.cat"} <= targets, targets
    assert [n.name for n in graph.nodes if n.op == "placeholder"] == ["x", "h"]


def test_random_op_is_refused():
    with pytest.raises(NotTraceable, match=r"draws random numbers \(torch.ops.aten.rand_like"):
        trace_callable("noisy", torch.jit.script(_Noisy()), [torch.zeros(3)], ["x"], ["y"])
    with pytest.raises(NotWritten, match=r"cannot record it exactly: it draws random"):
        write_callable("noisy", torch.jit.script(_Noisy()), [torch.zeros(3)], ["x"], ["y"], 18)


def test_wrong_output_count_is_refused():
    with pytest.raises(NotTraceable, match=r"returned 2 outputs where the node declares 1"):
        trace_callable("norm", torch.jit.script(_Norm()), [torch.zeros(2, 5),
                                                            torch.zeros(2, 3)],
                       ["x", "h"], ["y"])


def _shifted(x: torch.Tensor) -> torch.Tensor:
    return x[1:] * 2.0


def test_a_callable_whose_ops_the_tracer_never_sees_is_refused():
    """A scripted function runs its graph in C++: its output would be a frozen constant."""
    with pytest.raises(NotTraceable, match="computed without any op reaching leapp's tracer"):
        trace_callable("shift", torch.jit.script(_shifted), [torch.zeros(4)], ["x"], ["y"])


def test_refused_while_a_session_runs(tmp_path):
    leapp.start("user", save_path=str(tmp_path))
    try:
        x = annotate.input_tensors("mine", {"x": torch.randn(2)})
        with pytest.raises(NotTraceable, match="a leapp tracing session is running"):
            trace_callable("norm", torch.jit.script(_Noisy()), [torch.zeros(3)], ["x"], ["y"])
        annotate.output_tensors("mine", {"y": x + 1}, export_with="jit")
        assert list(leapp._core.nodes()) == ["mine"]
    finally:
        leapp.stop()
