"""The C core owns the session's node registry and each Node's port lists:
Python reads them (tuples, a read-only mapping) and changes them only through
methods that check their argument once and keep the invariants."""
from __future__ import annotations

import pytest

from support import finished_node, wire


@pytest.fixture
def session(core):
    core.reset_nodes()
    yield core
    core.reset_nodes()


def _port(core, name, vid=0):
    return core.Port(name, "float32", (1, 2), vid)


# ---- the lists and the registry are read-only ---------------------------------

def test_port_lists_are_tuples_python_cannot_write(core):
    node = core.Node("n")
    node.add_input(_port(core, "x"))
    node.add_outputs([_port(core, "y")])
    for ports in (node.inputs, node.outputs, node.trimmed_inputs):
        assert type(ports) is tuple
    with pytest.raises(AttributeError):
        node.inputs.append(_port(core, "z"))
    with pytest.raises(AttributeError):
        node.outputs.extend([_port(core, "z")])
    with pytest.raises(AttributeError):
        node.trimmed_inputs.append(_port(core, "z"))
    with pytest.raises(TypeError):
        node.inputs[0] = _port(core, "z")  # type: ignore[index]
    with pytest.raises(AttributeError):
        node.inputs = ()  # type: ignore[misc]
    assert [p.name for p in node.inputs] == ["x"] and [p.name for p in node.outputs] == ["y"]


def test_registry_is_a_read_only_view(session):
    node = session.Node("n")
    session.register_node(node)
    view = session.nodes()
    assert dict(view) == {"n": node} and view["n"] is node and "n" in view
    with pytest.raises(TypeError):
        view["m"] = session.Node("m")  # type: ignore[index]
    with pytest.raises(TypeError):
        del view["n"]  # type: ignore[attr-defined]
    assert session.find_node("n") is node and session.find_node("m") is None
    session.reset_nodes()
    assert dict(session.nodes()) == {} and session.find_node("n") is None
    assert not node.is_tracing  # reset closes the nodes it forgets


def test_registering_a_duplicate_name_fails(session):
    first = session.Node("n")
    session.register_node(first)
    with pytest.raises(ValueError, match="already has a node named 'n'"):
        session.register_node(session.Node("n"))
    with pytest.raises(ValueError, match="already has a node named 'n'"):
        session.register_node(first)
    with pytest.raises(TypeError, match="Node"):
        session.register_node("n")
    assert session.nodes()["n"] is first and len(session.nodes()) == 1


def test_discard_node_forgets_a_tracing_node_and_its_promoted_tensors(session):
    import torch
    node, other = session.Node("n"), session.Node("m")
    session.register_node(node)
    session.register_node(other)
    mine, theirs = torch.ones(2), torch.ones(2)
    session.set_carrier(mine, node, node.new_value(), None, True)
    session.set_carrier(theirs, other, other.new_value(), None, True)
    assert session.discard_node(node) == 1
    assert type(mine) is torch.Tensor and session.carrier_of(mine) is None
    assert session.carrier_of(theirs).node is other  # another node's tensors stay
    assert session.find_node("n") is None and not node.is_tracing
    assert dict(session.nodes()) == {"m": other}
    session.register_node(session.Node("n"))  # the name is free again
    with pytest.raises(ValueError, match="still tracing"):
        session.discard_node(node)  # no longer the session's node
    other.finish()
    with pytest.raises(ValueError, match="still tracing"):
        session.discard_node(other)  # finished
    with pytest.raises(TypeError, match="Node"):
        session.discard_node("m")


# ---- the methods check their argument once ---------------------------------------

def test_add_input_checks_its_port(core):
    node = core.Node("n")
    x = _port(core, "x")
    node.add_input(x)
    with pytest.raises(TypeError, match="Port"):
        node.add_input("x")
    with pytest.raises(ValueError, match="already a port of node 'n'"):
        node.add_input(x)
    with pytest.raises(ValueError, match="node 'n' already has an input named 'x'"):
        node.add_input(_port(core, "x"))
    node.trim_inputs(["x"])
    with pytest.raises(ValueError, match="already has an input named 'x'"):
        node.add_input(_port(core, "x"))  # a trimmed input keeps its name
    node.finish(0)
    with pytest.raises(RuntimeError, match="node 'n' has finished tracing"):
        node.add_input(_port(core, "late"))
    assert node.inputs == () and [p.name for p in node.trimmed_inputs] == ["x"]


def test_add_outputs_is_all_or_nothing(core):
    node = core.Node("n")
    y = _port(core, "y")
    node.add_outputs([y])
    for bad, error, text in (
            ([_port(core, "a"), 3], TypeError, "item 1 is a int, not a Port"),
            ([_port(core, "a"), _port(core, "a")], ValueError, "already has an output named 'a'"),
            ([_port(core, "b"), _port(core, "y")], ValueError, "already has an output named 'y'"),
            ([y], ValueError, "already a port of node 'n'")):
        with pytest.raises(error, match=text):
            node.add_outputs(bad)
        assert node.outputs == (y,)
    with pytest.raises(TypeError):
        node.add_outputs(5)
    node.add_outputs(p for p in [_port(core, "z")])  # any iterable
    assert [p.name for p in node.outputs] == ["y", "z"]
    node.finish(0)
    with pytest.raises(RuntimeError, match="has finished tracing"):
        node.add_outputs([])


def test_remove_input(core):
    node = core.Node("n")
    x, h = _port(core, "x"), _port(core, "h")
    node.add_input(x)
    node.add_input(h)
    held = node.inputs
    node.remove_input(x)
    assert node.inputs == (h,) and held == (x, h)  # a reader's tuple never changes
    with pytest.raises(ValueError, match="is not an input of node 'n'"):
        node.remove_input(x)
    with pytest.raises(TypeError, match="Port"):
        node.remove_input("h")
    node.finish(0)
    with pytest.raises(RuntimeError, match="has finished tracing"):
        node.remove_input(h)


def test_trim_inputs_keeps_the_order_and_works_after_finish(core):
    node = core.Node("n")
    for name in "abcd":
        node.add_input(_port(core, name))
    node.trim_inputs(["c", "a"])
    assert [p.name for p in node.inputs] == ["b", "d"]
    assert [p.name for p in node.trimmed_inputs] == ["a", "c"]
    node.finish(0)
    node.trim_inputs(n for n in ["d"])  # an exporter dropping an input after the trace
    assert [p.name for p in node.inputs] == ["b"]
    assert [p.name for p in node.trimmed_inputs] == ["a", "c", "d"]
    with pytest.raises(ValueError, match="node 'n' has no input named 'a'"):
        node.trim_inputs(["b", "a"])
    with pytest.raises(TypeError, match="names must be str"):
        node.trim_inputs([1])
    assert [p.name for p in node.inputs] == ["b"]


def test_rename_input(core):
    node = finished_node(core, "n", inputs=["x", "y"])
    node.rename_input("x", "x_in")
    node.rename_input("y", "y")  # same name: nothing to do
    assert [p.name for p in node.inputs] == ["x_in", "y"]
    with pytest.raises(ValueError, match="node 'n' has no input named 'x'"):
        node.rename_input("x", "z")
    with pytest.raises(ValueError, match="node 'n' already has an input named 'y'"):
        node.rename_input("x_in", "y")
    with pytest.raises(TypeError):
        node.rename_input("y", 3)


def test_rename_output_follows_every_consumer(session):
    a = finished_node(session, "a", inputs=["h"], outputs=["y", "h"], index=0)
    b = finished_node(session, "b", inputs=["y", "v"], outputs=["z"], index=1)
    for node in (a, b):
        session.register_node(node)
    wire(b, "y", a, "y")
    wire(a, "h", a, "h")
    wire(b, "v", b, "z")  # another producer's port of the same name is left alone
    b.trim_inputs(["v"])
    a.rename_output("y", "y_out")
    a.rename_output("h", "h_out")
    assert [p.name for p in a.outputs] == ["y_out", "h_out"]
    assert (b.inputs[0].src_node, b.inputs[0].src_port) == (a, "y_out")
    assert (a.inputs[0].src_node, a.inputs[0].src_port) == (a, "h_out")
    assert b.trimmed_inputs[0].src_port == "z"
    with pytest.raises(ValueError, match="node 'a' has no output named 'y'"):
        a.rename_output("y", "w")
    with pytest.raises(ValueError, match="node 'a' already has an output named 'h_out'"):
        a.rename_output("y_out", "h_out")
    built = session.build_pipeline([a, b])
    assert built["data_flow"] == {"a/y_out": ["b/y"]}
    assert built["feedback_flow"] == {"a/h_out": ["a/h"]}


def test_finish_hands_out_the_session_order_once(session):
    first, second = session.Node("a"), session.Node("b")
    second.finish()
    first.finish()
    assert (second.node_index, first.node_index) == (0, 1)
    with pytest.raises(RuntimeError, match="node 'a' has already finished"):
        first.finish()
    assert first.node_index == 1
    session.reset_nodes()  # the completion order starts again with the session
    third = session.Node("c")
    third.finish()
    assert third.node_index == 0
