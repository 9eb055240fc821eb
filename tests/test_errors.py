"""Bad input gets a clear exception with upstream's wording, and leaves leapp usable."""
from __future__ import annotations

import logging

import pytest
import torch

import leapp
from leapp import _core, annotate


def _ok(bundle):
    """After an error, a complete session still works."""
    if _core.is_tracing():
        leapp.stop()
    leapp.start("after", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    annotate.output_tensors("n", {"y": x + 1}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}


@pytest.mark.parametrize("started", [False, True])
@pytest.mark.parametrize("api", ["input_tensors", "output_tensors"])
def test_bare_tensor_payload(bundle, started, api):
    if started:
        leapp.start("g", save_path=bundle.root)
        annotate.input_tensors("n", {"x": torch.ones(1)})
    with pytest.raises(TypeError, match="does not accept a bare tensor"):
        getattr(annotate, api)("n", torch.ones(2))


@pytest.mark.parametrize("started", [False, True])
def test_list_payload(bundle, started):
    if started:
        leapp.start("g", save_path=bundle.root)
    with pytest.raises(TypeError, match="expects either a dict of named tensors"):
        annotate.input_tensors("n", [torch.ones(2), torch.ones(3)])


def test_bare_static_output(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(TypeError, match="does not accept a bare tensor"):
        annotate.output_tensors("n", {"y": x + 1}, static_outputs=torch.ones(2))


def test_output_before_input(bundle):
    leapp.start("g", save_path=bundle.root)
    with pytest.raises(RuntimeError, match=r"input_tensors\(\) was never called for it"):
        annotate.output_tensors("ghost", {"y": torch.ones(2)})
    _ok(bundle)


def test_traced_static_output(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="Cannot create static output from traced"):
        annotate.output_tensors("n", {"y": x + 1}, static_outputs={"s": x * 2})
    _ok(bundle)


def test_untraced_output(bundle):
    leapp.start("g", save_path=bundle.root)
    annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="non-traced tensors") as info:
        annotate.output_tensors("n", {"y": torch.ones(2)})
    assert "'n'" in str(info.value) and "y: Tensor" in str(info.value)
    _ok(bundle)


def test_output_of_another_node(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("a", {"x": torch.ones(2)})
    annotate.input_tensors("b", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="belong to a different node"):
        annotate.output_tensors("b", {"y": a + 1})


@pytest.mark.parametrize("op", [
    lambda a, b: a + b,
    lambda a, b: torch.cat([a, b]),
    lambda a, b: torch.stack([a, b]),
    lambda a, b: torch.matmul(a, b),
    lambda a, b: torch.add(a, b, alpha=2),
    lambda a, b: torch.where(a > 0, a, b),
])
def test_mixing_two_active_nodes_in_one_op(bundle, op):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("a", {"x": torch.ones(2)})
    b = annotate.input_tensors("b", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="Cannot mix multiple active TracedTensors from "
                                           "different contexts") as info:
        op(a, b)
    assert "'a'" in str(info.value) and "'b'" in str(info.value)
    _ok(bundle)


def test_active_value_of_another_node_as_input(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("a", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="Mixing active contexts is not allowed"):
        annotate.input_tensors("b", {"x": a * 2})


def test_method_inside_method(bundle):
    @annotate.method(export_with="jit")
    def inner(v):
        return v * 2

    @annotate.method(export_with="jit")
    def outer(v):
        return inner(v) + 1

    leapp.start("g", save_path=bundle.root)
    with pytest.raises(RuntimeError, match="Mixing active contexts is not allowed"):
        outer(torch.ones(2))
    _ok(bundle)


@pytest.mark.parametrize("where", ["inputs", "output"])
def test_duplicate_port_name(bundle, where):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError, match="Duplicate name ") as info:
        if where == "inputs":
            annotate.input_tensors("n", {"x": torch.ones(2)})
        else:
            annotate.output_tensors("n", {"y": x + 1}, static_outputs={"y": torch.ones(2)})
    assert "Each input/output must have a unique name" in str(info.value)


def test_same_tensor_twice_into_one_node(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = x + 1
    annotate.output_tensors("a", {"y": y}, export_with="jit")
    p, q = annotate.input_tensors("b", {"p": y, "q": y})
    annotate.output_tensors("b", {"z": p + q}, export_with="jit")
    leapp.stop()
    with pytest.raises(RuntimeError) as info:
        leapp.compile_graph(visualize=False)
    assert str(info.value).startswith("Error: unsupported use of sending the same tensor "
                                      "multiple times to the same node")
    assert "a/y" in str(info.value)


def test_compile_before_stop(bundle):
    leapp.start("g", save_path=bundle.root)
    with pytest.raises(RuntimeError, match=r"Call leapp.stop\(\) before leapp.compile_graph"):
        leapp.compile_graph()


def test_node_never_finished(bundle):
    leapp.start("g", save_path=bundle.root)
    annotate.input_tensors("open_node", {"x": torch.ones(2)})
    leapp.stop()
    with pytest.raises(RuntimeError, match="created but never completed") as info:
        leapp.compile_graph()
    assert "open_node" in str(info.value) and "output_tensors()" in str(info.value)
    _ok(bundle)


def test_stop_without_start():
    with pytest.raises(RuntimeError, match="no active tracing session"):
        leapp.stop()


def test_errors_are_logged_as_fatal(bundle, caplog):
    leapp.start("g", save_path=bundle.root)
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        with pytest.raises(RuntimeError):
            annotate.output_tensors("ghost", {"y": torch.ones(1)})
    assert any(r.levelname == "FATAL" for r in caplog.records)
    leapp.stop()
    log = open(f"{bundle.dir('g')}/log.txt").read()
    assert "[FATAL]: output_tensors() called for node 'ghost'" in log


@pytest.mark.parametrize("kind", ["shape", "dtype"])
def test_edge_shape_and_dtype_checked(bundle, kind):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = x + 1
    annotate.output_tensors("a", {"y": y}, export_with="jit")
    z = annotate.input_tensors("b", {"y": y})
    annotate.output_tensors("b", {"z": z * 2}, export_with="jit")
    leapp.stop()
    port = _core.nodes()["b"].inputs[0]
    if kind == "shape":
        port.shape = (3,)
    else:
        port.dtype = "float64"
    with pytest.raises(ValueError, match=f"{kind.capitalize()} mismatch in pipeline connection"):
        leapp.compile_graph(visualize=False)


def test_unknown_backend_lists_the_accepted_ones(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(ValueError, match="Unexpected backend: tflite") as info:
        annotate.output_tensors("n", {"y": x + 1}, export_with="tflite")
    for name in ("jit", "jit-trace", "onnx", "onnx-torchscript", "pt2", "exported-program"):
        assert f"'{name}'" in str(info.value)
    _ok(bundle)


def test_unknown_backend_params_name_the_accepted_keys(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    with pytest.raises(ValueError, match="unknown backend_params") as info:
        annotate.output_tensors("n", {"y": x + 1}, export_with="onnx",
                                backend_params={"opset": 17})
    assert "opset_version" in str(info.value)


def test_reentry_with_a_changed_shape(bundle):
    def declare(payload):
        return annotate.input_tensors("n", payload)

    leapp.start("g", save_path=bundle.root)
    x = declare({"x": torch.ones(2)})
    annotate.output_tensors("n", {"y": x + 1}, export_with="jit")
    with pytest.raises(RuntimeError, match="Validation error when reentering node") as info:
        declare({"x": torch.ones(3)})
    assert "shape: [2]" in str(info.value) and "shape: [3]" in str(info.value)
    with pytest.raises(RuntimeError, match="failed to find it"):
        declare({"other": torch.ones(2)})


def _two_passes(bundle, first, second):
    leapp.start("g", save_path=bundle.root)
    for declare in (first, second):
        x = declare()
        annotate.output_tensors("n", {"y": x + 1}, export_with="jit")


def test_reentry_from_another_helper_is_refused(bundle):
    def helper_a():
        return annotate.input_tensors("n", {"x": torch.ones(2)})

    def helper_b():
        return annotate.input_tensors("n", {"x": torch.ones(2)})

    with pytest.raises(RuntimeError, match="Cannot reuse a node name from a different call "
                                           "site.") as info:
        _two_passes(bundle, helper_a, helper_b)
    assert "different annotation origin" in str(info.value)


def test_reentry_from_the_same_helper_and_in_a_loop_is_fine(bundle):
    def helper():
        return annotate.input_tensors("n", {"x": torch.ones(2)})

    _two_passes(bundle, helper, helper)  # the helper called from two places
    for _ in range(3):
        x = annotate.input_tensors("m", {"x": torch.ones(2)})
        annotate.output_tensors("m", {"y": x * 2}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True, "m": True}


def test_reentry_from_another_branch_is_refused(bundle):
    leapp.start("g", save_path=bundle.root)
    with pytest.raises(RuntimeError, match="Cannot reuse a node name"):
        for step in range(2):
            if step == 0:
                x = annotate.input_tensors("n", {"x": torch.ones(2)})
            else:
                x = annotate.input_tensors("n", {"x": torch.ones(2)})
            annotate.output_tensors("n", {"y": x + 1}, export_with="jit")


def test_methods_sharing_a_node_name_are_refused(bundle):
    @annotate.method(node_name="shared", export_with="jit")
    def first(x):
        return x + 1

    @annotate.method(node_name="shared", export_with="jit")
    def second(x):
        return x + 1

    leapp.start("g", save_path=bundle.root)
    first(torch.ones(2))
    first(torch.ones(2))  # the same method again: a re-entry
    with pytest.raises(RuntimeError, match="Cannot reuse a node name"):
        second(torch.ones(2))


def test_a_refused_output_tensors_leaves_the_node_open_for_a_retry(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    y = x + 1
    with pytest.raises(ValueError, match="Unexpected backend"):
        annotate.output_tensors("n", {"y": y}, export_with="tensorrt")
    with pytest.raises(RuntimeError, match="Duplicate name"):
        annotate.output_tensors("n", {"y": y}, static_outputs={"y": torch.ones(2)})
    annotate.output_tensors("n", {"y": y}, export_with="jit")  # the retry works
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"n": True}


# ---- upstream 0.7.2's wording is kept, our guidance follows ------------------------
# Each expected string is upstream's message for the same misuse, verbatim.


def _message(excinfo) -> str:
    return str(excinfo.value)


def test_upstream_wording_active_input_of_another_node(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("A", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.input_tensors("B", {"y": a * 2})
    assert ("Error: when creating inputs for 'B', detected data 'y' is an active TracedTensor "
            "from a different node 'A'. \nMixing active contexts is not allowed. Call "
            "output_tensors() on the source node first.") in _message(info)


def test_upstream_wording_two_tracing_nodes_in_one_op(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("A", {"x": torch.ones(2)})
    b = annotate.input_tensors("B", {"y": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        a + b
    text = _message(info)
    # upstream prints the two names as a set (in hash order); ours is sorted
    assert "Error: detected multiple TracedTensor contexts: {'A', 'B'} inside of a traced " \
           "function.\n" in text
    assert ("\nThis happens when you mix multiple active TracedTensors from different contexts "
            "inside of a traced function/block. solutions:\n\n1. call output_tensors() to "
            "finalize one of the nodes first\n2. combine both nodes into a single node by "
            "calling input_tensors() with the same node name") in text


def test_upstream_wording_outputs_of_another_node(bundle):
    leapp.start("g", save_path=bundle.root)
    a = annotate.input_tensors("A", {"x": torch.ones(2)})
    annotate.input_tensors("B", {"y": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.output_tensors("B", {"o": a * 2})
    assert ("output_tensors() for node 'B' received tensors that belong to a different node: "
            "{'A'}.\n Make sure you are passing tensors derived from "
            "annotate.input_tensors('B', ...) to annotate.output_tensors('B', ...).") \
        in _message(info)


def test_upstream_wording_duplicate_input_name(bundle):
    leapp.start("g", save_path=bundle.root)
    annotate.input_tensors("A", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.input_tensors("A", {"x": torch.ones(2)})
    assert ("Duplicate i/o name 'x' in node 'A'. \nCurrently existing names: {'x'}\nEach "
            "input/output in the same node must have a unique name.") in _message(info)


def test_upstream_wording_duplicate_output_name(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("A", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.output_tensors("A", {"y": x * 2}, static_outputs={"y": torch.ones(2)})
    assert ("Duplicate i/o name 'y' in node 'A'. \nCurrently existing names: {'y'}\nEach "
            "input/output in the same node must have a unique name.") in _message(info)


def test_upstream_wording_traced_static_output(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("A", {"x": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.output_tensors("A", {"y": x * 2}, static_outputs={"s": x * 3})
    assert ("Error: static output 's' is a traced TracedTensor. Static outputs should be "
            "constant tensors, not traced computations.") in _message(info)


def test_upstream_wording_non_tensor_static_output(bundle):
    leapp.start("g", save_path=bundle.root)
    x = annotate.input_tensors("A", {"x": torch.ones(2)})
    with pytest.raises(TypeError) as info:
        annotate.output_tensors("A", {"y": x * 2}, static_outputs={"s": 3.0})
    assert ("Error: static output 's' has type float but expected a raw tracable data type.\n"
            "**Static outputs must be raw tensors, not derived from input tensors.**\nIf this "
            "value depends on inputs, use it as a regular output tensor instead.") \
        in _message(info)


def _declare_a(payload):
    """Node A's inputs, from one call site (a node re-enters only from where it began)."""
    return annotate.input_tensors("A", payload)


def _first_pass(bundle, payload=None):
    leapp.start("g", save_path=bundle.root)
    x = _declare_a(payload or {"x": torch.ones(2)})
    annotate.output_tensors("A", {"y": x * 2})


@pytest.mark.parametrize("name", ["z", "q"])
def test_upstream_wording_reentry_with_a_new_input_name(bundle, name):
    _first_pass(bundle)
    with pytest.raises(RuntimeError) as info:
        _declare_a({name: torch.ones(2)})
    assert (f"Error: Reentering A with new i/o {name} but failed to find it in the current i/o "
            f"list.\navailable i/o names: ['x']") in _message(info)


def test_upstream_wording_reentry_with_a_new_output_name(bundle):
    _first_pass(bundle)
    x = _declare_a({"x": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.output_tensors("A", {"w": x * 2})
    assert ("Error: Reentering A with new i/o w but failed to find it in the current i/o "
            "list.\navailable i/o names: ['y']") in _message(info)


@pytest.mark.parametrize("value, old, new", [
    (torch.ones(3), "'dtype': 'float32', 'shape': [2]", "'dtype': 'float32', 'shape': [3]"),
    (torch.ones(2, dtype=torch.float64), "'dtype': 'float32', 'shape': [2]",
     "'dtype': 'float64', 'shape': [2]"),
])
def test_upstream_wording_reentry_with_a_changed_input(bundle, value, old, new):
    _first_pass(bundle)
    with pytest.raises(RuntimeError) as info:
        _declare_a({"x": value})
    assert (f"Error: Reentering A with new i/o x \nbut the description has changed from "
            f"{{'name': 'x', {old}, 'type': 'tensor'}} to {{'name': 'x', {new}, 'type': "
            f"'tensor'}}.\nThis can happen if some dynamic behavior is not captured by the "
            f"annotations") in _message(info)


def test_upstream_wording_reentry_with_a_changed_output_shape(bundle):
    _first_pass(bundle)
    x = _declare_a({"x": torch.ones(2)})
    with pytest.raises(RuntimeError) as info:
        annotate.output_tensors("A", {"y": x[:1]})
    assert ("Error: Reentering A with new i/o y \nbut the description has changed from "
            "{'name': 'y', 'dtype': 'float32', 'shape': [2], 'type': 'tensor'} to {'name': "
            "'y', 'dtype': 'float32', 'shape': [1], 'type': 'tensor'}.\nThis can happen if "
            "some dynamic behavior is not captured by the annotations") in _message(info)


def test_upstream_wording_reentry_with_semantics(bundle):
    def payload(n):
        return [leapp.TensorSemantics("x", torch.ones(n), kind=leapp.InputKindEnum.JOINT_POSITION,
                                      element_names=["a", "b"])]

    _first_pass(bundle, payload(2))
    with pytest.raises(RuntimeError) as info:
        _declare_a(payload(3))
    assert ("but the description has changed from {'name': 'x', 'dtype': 'float32', 'shape': "
            "[2], 'type': 'tensor', 'kind': 'state/joint/position', 'element_names': [['a', "
            "'b']]} to {'name': 'x', 'dtype': 'float32', 'shape': [3], 'type': 'tensor'}.") \
        in _message(info)
    assert "shape: [2] (first pass) vs shape: [3] (now)" in _message(info)
