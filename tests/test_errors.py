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
