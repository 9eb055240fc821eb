"""Port order of a node mixing regular outputs, updated state and static outputs.

Upstream leapp 0.7.2 lists a node's outputs as: the regular outputs (in the
order given to output_tensors), then the updated states (declared state and
reassigned annotate.module buffers, in declaration order), then the static
outputs.  The YAML and the exported model (its output tuple, or the ONNX
graph's outputs) follow that order.  A state named like a regular output
replaces that output in place; a static output named like an updated state
replaces the state's value in place.  ONNX renames a name used on both sides
to <name>_in / <name>_out.

Every expectation below was recorded from upstream 0.7.2 running the same
code: input and output names in order, and the values the exported model
returns when its inputs (in YAML order) are filled with 1, 2, 3, ...
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

import leapp
from leapp import TensorSemantics, annotate


class Buffers(torch.nn.Module):
    """m is reassigned in forward (state), k only read (a constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("m", torch.zeros(1, 3))
        self.register_buffer("k", torch.ones(1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.m = self.m + x
        return x * self.k + self.m


def _ones(value: float, *shape: int) -> torch.Tensor:
    return torch.full(shape or (1, 3), float(value))


def _x(i: int, name: str = "x") -> torch.Tensor:
    return torch.randn(1, 3, generator=torch.Generator().manual_seed(100 * i + len(name)))


@dataclass
class Case:
    """One node: how it is annotated and what upstream exports for it."""

    body: Callable[[str, int, torch.nn.Module], None]
    inputs: list[str]
    outputs: list[str]
    values: list[float]            # each output is filled with this value
    states: list[str] = field(default_factory=list)  # feedback ports


def reg_state_static(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", {"y": x * 2, "z": x - 1}, static_outputs={"s": _ones(7)},
                            export_with=be)


def two_states_updated_in_reverse(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    a, b = annotate.state_tensors("n", {"a": torch.zeros(1, 3), "b": torch.ones(1, 3)})
    annotate.update_state("n", {"b": b + x})
    annotate.update_state("n", {"a": a * x})
    annotate.output_tensors("n", {"y": x * 2}, static_outputs={"s": _ones(7), "t": _ones(8, 2)},
                            export_with=be)


def input_after_state(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    w = annotate.input_tensors("n", {"w": _x(i, "w")})
    annotate.update_state("n", {"h": h + x * w})
    annotate.output_tensors("n", {"y": x * w}, static_outputs={"s": _ones(7)}, export_with=be)


def interleaved(be, i, mod):
    a = annotate.input_tensors("n", {"a": _x(i, "a")})
    p = annotate.state_tensors("n", {"p": torch.zeros(1, 3)})
    b = annotate.input_tensors("n", {"b": _x(i, "b")})
    q = annotate.state_tensors("n", {"q": torch.ones(1, 3)})
    annotate.update_state("n", {"q": q * a})
    c = annotate.input_tensors("n", {"c": _x(i, "c")})
    annotate.update_state("n", {"p": p + b + c})
    annotate.output_tensors("n", {"z": a + b, "y": c * 2},
                            static_outputs={"t": _ones(8, 2), "s": _ones(7)}, export_with=be)


def module_then_state(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    annotate.module("n", mod)
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    y = mod(x)
    annotate.update_state("n", {"h": h + y})
    annotate.output_tensors("n", {"y": y}, static_outputs={"s": _ones(7)}, export_with=be)


def state_then_module(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.module("n", mod)
    y = mod(x)
    annotate.update_state("n", {"h": h + y})
    annotate.output_tensors("n", {"y": y}, static_outputs={"s": _ones(7)}, export_with=be)


def update_then_module(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.module("n", mod)
    y = mod(x)
    annotate.output_tensors("n", {"y": y}, static_outputs={"s": _ones(7)}, export_with=be)


def module_buffers_and_static(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    annotate.module("n", mod)
    y = mod(x)
    annotate.output_tensors("n", {"y": y, "w": y * 2}, static_outputs={"s": _ones(7)},
                            export_with=be)


def output_shares_input_name(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", {"y": x + 1, "x": x * 3}, static_outputs={"s": _ones(7)},
                            export_with=be)


def static_shares_input_name(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", {"y": x * 2}, static_outputs={"x": _ones(7)}, export_with=be)


def one_state_not_updated(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h, g = annotate.state_tensors("n", {"h": torch.zeros(1, 3), "g": torch.ones(1, 3)})
    annotate.update_state("n", {"g": g + x + h})
    annotate.output_tensors("n", {"y": x + h}, static_outputs={"s": _ones(7)}, export_with=be)


def nested_outputs(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", {"grp": {"a": x + 1, "b": x - 1}},
                            static_outputs={"st": {"p": _ones(7), "q": _ones(8, 2)}},
                            export_with=be)


def output_named_like_state(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", [TensorSemantics(name="y", ref=x * 2, kind="out/y"),
                                  TensorSemantics(name="h", ref=x * 5, kind="out/h")],
                            export_with=be)


def output_named_like_buffer(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    annotate.module("n", mod)
    y = mod(x)
    annotate.output_tensors("n", {"y": y, "m": y * 2}, export_with=be)


def static_named_like_used_state(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", {"y": x * 2 + h}, static_outputs={"h": _ones(7)},
                            export_with=be)


def static_named_like_unused_state(be, i, mod):
    x = annotate.input_tensors("n", {"x": _x(i)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    annotate.output_tensors("n", {"y": x * 2}, static_outputs={"h": _ones(7)}, export_with=be)


CASES = {
    "reg_state_static": Case(reg_state_static, ["x", "h"], ["y", "z", "h", "s"],
                             [2, 0, 3, 7], ["h"]),
    "two_states_updated_in_reverse": Case(two_states_updated_in_reverse, ["x", "a", "b"],
                                          ["y", "a", "b", "s", "t"], [2, 2, 4, 7, 8],
                                          ["a", "b"]),
    "input_after_state": Case(input_after_state, ["x", "h", "w"], ["y", "h", "s"], [3, 5, 7],
                              ["h"]),
    "interleaved": Case(interleaved, ["a", "p", "b", "q", "c"], ["z", "y", "p", "q", "t", "s"],
                        [4, 10, 10, 4, 8, 7], ["p", "q"]),
    "module_then_state": Case(module_then_state, ["x", "m", "h"], ["y", "m", "h", "s"],
                              [4, 3, 7, 7], ["m", "h"]),
    "state_then_module": Case(state_then_module, ["x", "h", "m"], ["y", "h", "m", "s"],
                              [5, 7, 4, 7], ["h", "m"]),
    "update_then_module": Case(update_then_module, ["x", "h", "m"], ["y", "h", "m", "s"],
                               [5, 3, 4, 7], ["h", "m"]),
    "module_buffers_and_static": Case(module_buffers_and_static, ["x", "m"],
                                      ["y", "w", "m", "s"], [4, 8, 3, 7], ["m"]),
    "output_shares_input_name": Case(output_shares_input_name, ["x", "h"],
                                     ["y", "x", "h", "s"], [2, 3, 3, 7], ["h"]),
    "static_shares_input_name": Case(static_shares_input_name, ["x", "h"], ["y", "h", "x"],
                                     [2, 3, 7], ["h"]),
    "one_state_not_updated": Case(one_state_not_updated, ["x", "h", "g"], ["y", "g", "s"],
                                  [3, 6, 7], ["g"]),
    "nested_outputs": Case(nested_outputs, ["x", "h"], ["grp_a", "grp_b", "h", "st_p", "st_q"],
                           [2, 0, 3, 7, 8], ["h"]),
    "output_named_like_state": Case(output_named_like_state, ["x", "h"], ["y", "h"], [2, 3],
                                    ["h"]),
    "output_named_like_buffer": Case(output_named_like_buffer, ["x", "m"], ["y", "m"], [4, 3],
                                     ["m"]),
    "static_named_like_used_state": Case(static_named_like_used_state, ["x", "h"], ["y", "h"],
                                         [4, 7], ["h"]),
    "static_named_like_unused_state": Case(static_named_like_unused_state, ["x"], ["y", "h"],
                                           [2, 7], []),
}


def _onnx_names(inputs: list[str], outputs: list[str]) -> tuple[list[str], list[str]]:
    """ONNX's flat namespace: a name on both sides becomes <name>_in / <name>_out."""
    shared = set(inputs) & set(outputs)
    return ([f"{n}_in" if n in shared else n for n in inputs],
            [f"{n}_out" if n in shared else n for n in outputs])


def _run_model(path: str, inputs: list[torch.Tensor]) -> tuple[list[str] | None, list]:
    """(ONNX output names or None, outputs) of the exported file, inputs positional."""
    if path.endswith(".onnx"):
        import onnx
        import onnxruntime as ort
        graph = onnx.load(path).graph
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
        return [o.name for o in graph.output], [torch.from_numpy(o) for o in
                                                 session.run(None, feed)]
    if path.endswith(".pt2"):
        out = torch.export.load(path).module()(*inputs)
    else:
        out = torch.jit.load(path)(*inputs)
    return None, list(out) if isinstance(out, (tuple, list)) else [out]


def _export(bundle, name: str, case: Case, backend: str, passes: int = 2) -> dict:
    mod = Buffers()
    leapp.start(name, save_path=bundle.root)
    with torch.no_grad():
        for i in range(passes):
            case.body(backend, i, mod)
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}
    return bundle.yaml(name)


def _check(bundle, name: str, case: Case, backend: str) -> None:
    doc = _export(bundle, name, case, backend)
    node = doc["models"]["n"]
    inputs, outputs = case.inputs, case.outputs
    if backend.startswith("onnx"):
        inputs, outputs = _onnx_names(inputs, outputs)
    assert [p["name"] for p in node["inputs"]] == inputs
    assert [p["name"] for p in node["outputs"]] == outputs
    renamed = dict(zip(case.outputs, outputs))
    renamed_in = dict(zip(case.inputs, inputs))
    assert doc["pipeline"]["feedback_flow"] == {
        f"n/{renamed[s]}": [f"n/{renamed_in[s]}"] for s in sorted(case.states,
                                                                  key=renamed.get)}
    feed = [torch.full(tuple(p["shape"]), float(k + 1)) for k, p in enumerate(node["inputs"])]
    names, results = _run_model(os.path.join(bundle.dir(name), node["parameters"]["model_path"]),
                                feed)
    if names is not None:
        assert names == outputs
    assert len(results) == len(outputs)
    for port, result, value in zip(node["outputs"], results, case.values):
        assert list(result.shape) == port["shape"], port["name"]
        assert torch.all(result == value), (port["name"], result, value)


@pytest.mark.parametrize("backend", ["jit", "onnx-torchscript"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_port_order(bundle, case, backend):
    _check(bundle, case, CASES[case], backend)


@pytest.mark.parametrize("backend", ["onnx-dynamo", "exported-program"])
@pytest.mark.parametrize("case", ["interleaved", "output_shares_input_name"])
def test_port_order_export_backends(bundle, case, backend):
    _check(bundle, case, CASES[case], backend)


def test_state_replacing_a_regular_output_keeps_its_semantics(bundle, caplog):
    doc = _export(bundle, "g", CASES["output_named_like_state"], "jit")
    assert [p.get("kind") for p in doc["models"]["n"]["outputs"]] == ["out/y", "out/h"]
    assert "has the name of an updated state" in caplog.text


def test_regular_output_shadowed_by_a_state_may_change_shape_on_reentry(bundle):
    def body(be, i, mod):
        x = annotate.input_tensors("n", {"x": _x(i)})
        h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
        annotate.update_state("n", {"h": h + x})
        annotate.output_tensors("n", {"y": x * 2, "h": torch.zeros(2) + x.sum()},
                                export_with=be)

    case = Case(body, ["x", "h"], ["y", "h"], [2, 3], ["h"])
    _export(bundle, "g", case, "jit", passes=3)
    node = bundle.yaml("g")["models"]["n"]
    assert [p["shape"] for p in node["outputs"]] == [[1, 3], [1, 3]]


def test_static_named_like_a_state_must_match_it(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": _x(0)})
    h = annotate.state_tensors("n", {"h": torch.zeros(1, 3)})
    annotate.update_state("n", {"h": h + x})
    with pytest.raises(RuntimeError, match="static output 'h' of node 'n' has the name of an "
                                           "updated state"):
        annotate.output_tensors("n", {"y": x * 2}, static_outputs={"h": torch.ones(2)},
                                export_with="jit")
    annotate.output_tensors("n", {"y": x * 2}, static_outputs={"s": torch.ones(2)},
                            export_with="jit")  # the node is still open: the retry works
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}
    assert [p["name"] for p in bundle.yaml("g")["models"]["n"]["outputs"]] == ["y", "h", "s"]


def test_buffer_reassigned_under_a_static_name_must_match_it(bundle):
    mod = Buffers()
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": _x(0)})
    annotate.module("n", mod)
    y = mod(x)
    with pytest.raises(RuntimeError, match="static output 'm'"):
        annotate.output_tensors("n", {"y": y}, static_outputs={"m": torch.ones(3)},
                                export_with="jit")
