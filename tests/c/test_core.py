"""The C core's internals: node tables, pruning, graph algorithms, YAML, refcounts."""
from __future__ import annotations

import gc
import sys

import pytest

from support import finished_node, wire


def test_port_describe_has_yaml_key_order(core):
    port = core.Port("q", "float32", (4, 3), 0, None, {"kind": "state/joint/position"})
    assert list(port.describe()) == ["name", "dtype", "shape", "type", "kind"]
    assert port.describe()["shape"] == [4, 3]


def test_value_ids_and_constants(core):
    node = core.Node("n")
    assert [node.new_value() for _ in range(3)] == [0, 1, 2]
    const = object()
    vid = node.bind_const(const)
    assert vid == 3 and node.consts == [const]
    func, args, kwargs, out = node.ops[0]
    assert func is None and args[0].kind == 1 and out == 3
    assert node.bind_const(const, 1) == 1 and node.consts == [const]  # deduplicated
    # a given value id may already be used: its definition goes first in the log
    assert [rec[3] for rec in node.ops] == [1, 3]


def test_prune_walks_back_from_outputs(core):
    node = core.Node("n")
    a, b = node.new_value(), node.new_value()
    # The C handler records (func, args, kwargs, out) with Refs; build a log by hand
    # through the constant path so the test needs no torch.
    c = node.bind_const("c")          # op 0: c = const
    live_ops, live = node.prune([c])
    assert live_ops == [0] and live[c] == 1 and live[a] == 0 and live[b] == 0


def test_build_pipeline_forward_feedback_and_io(core):
    a = finished_node(core, "a", inputs=["x", "mem"], outputs=["y"], index=0)
    b = finished_node(core, "b", inputs=["y"], outputs=["mem_out", "z"], index=1)
    wire(b, "y", a, "y")
    wire(a, "mem", b, "mem_out")
    built = core.build_pipeline([a, b])
    assert built["data_flow"] == {"a/y": ["b/y"]}
    assert built["feedback_flow"] == {"b/mem_out": ["a/mem"]}
    assert built["inputs"] == {"a": ["x"]}
    assert built["outputs"] == {"b": ["z"]}
    assert built["statistics"] == {"computation_nodes": 2, "dangling_inputs": 1,
                                   "dangling_outputs": 1, "internal_connections": 2,
                                   "total_edges": 4}
    assert ("info", "Found connection: a/y  -> b/y") in built["messages"]


def test_renames_apply_and_a_dropped_input_takes_no_part(core):
    a = finished_node(core, "a", inputs=["x"], outputs=["y"], index=0)
    b = finished_node(core, "b", inputs=["y", "extra"], index=1)
    wire(b, "y", a, "y")
    built = core.build_pipeline([a, b], {"b/extra": None, "a/x": "obs"}, {"a/y": "act"})
    assert built["data_flow"] == {"a/act": ["b/y"]}
    assert built["inputs"] == {"a": ["obs"]}


def test_an_output_renamed_to_none_is_a_type_error(core):
    # None used to reach PyUnicode_FromFormat("%U") as the output's name
    # (undefined behaviour: garbage text or a crash).
    a = finished_node(core, "a", outputs=["y"], index=0)
    b = finished_node(core, "b", inputs=["y"], index=1)
    wire(b, "y", a, "y")
    for nodes in ([a, b], [a]):  # an edge's source, and a dangling output
        with pytest.raises(TypeError, match=r"new name of a/y must be a str \(an output "
                                            r"cannot be dropped\), got NoneType"):
            core.build_pipeline(nodes, None, {"a/y": None})


def test_self_loop_is_feedback(core):
    a = finished_node(core, "a", inputs=["h"], outputs=["h"], index=0)
    wire(a, "h", a, "h")
    built = core.build_pipeline([a])
    assert built["feedback_flow"] == {"a/h": ["a/h"]} and built["inputs"] == {}


def test_unknown_source_is_dangling_with_an_error_message(core):
    a = finished_node(core, "a", outputs=["y"], index=0)
    b = finished_node(core, "b", inputs=["y"], index=1)
    wire(b, "y", a, "nope")
    built = core.build_pipeline([a, b])
    assert built["inputs"] == {"b": ["y"]}
    assert built["messages"][0][0] == "error" and "does not produce it" in built["messages"][0][1]


def test_duplicate_source_is_fatal(core):
    a = finished_node(core, "a", outputs=["y"], index=0)
    b = finished_node(core, "b", inputs=["p", "q"], index=1)
    wire(b, "p", a, "y")
    wire(b, "q", a, "y")
    with pytest.raises(RuntimeError, match="same tensor multiple times"):
        core.build_pipeline([a, b])


def test_shape_mismatch(core):
    a = finished_node(core, "a", outputs=["y"], index=0)
    b = finished_node(core, "b", inputs=["y"], index=1)
    b.inputs[0].shape = (3,)
    wire(b, "y", a, "y")
    with pytest.raises(ValueError, match="Shape mismatch in pipeline connection"):
        core.build_pipeline([a, b])


def test_pipeline_keys_are_sorted(core):
    nodes = [finished_node(core, f"n{i}", inputs=["x"], outputs=["y"], index=i) for i in range(12)]
    for i in range(1, 12):
        wire(nodes[i], "x", nodes[i - 1], "y")
    built = core.build_pipeline(list(reversed(nodes)))
    assert list(built["data_flow"]) == sorted(built["data_flow"])


def test_node_cycles_are_collected(core):
    for _ in range(100):
        a = finished_node(core, "a", inputs=["h"], outputs=["h"], index=0)
        wire(a, "h", a, "h")  # node -> port -> node cycle
        a.info["self"] = a
    del a
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is core.Node]


# ---- robustness against bad input from Python (regressions from review) --------

def test_port_fields_are_type_checked(core):
    port = core.Port("q", "float32", (2,), 0)
    for field, bad in (("name", 5), ("dtype", None), ("shape", [2]), ("src_node", 5),
                       ("src_port", 3), ("semantics", [])):
        with pytest.raises(TypeError):
            setattr(port, field, bad)
    with pytest.raises(TypeError):
        del port.name
    with pytest.raises(TypeError):
        core.Port("q", "float32", (2,), 0, None, ["not", "a", "dict"])
    assert repr(port) == "Port('q', float32, (2,))"


def test_foreign_items_in_node_lists_raise(core):
    node = core.Node("n")
    node.ops.append(1)
    with pytest.raises(TypeError, match="not a"):
        node.prune([0])
    # The port lists are tuples only the Node's methods replace: nothing foreign
    # can get into them (tests/c/test_session_owner.py), so build_pipeline
    # need not check their items.
    other = finished_node(core, "m", index=0)
    with pytest.raises(AttributeError):
        other.inputs.append(1)
    with pytest.raises(TypeError, match="not a Port"):
        core.Node("o").add_outputs([1])
    assert core.build_pipeline([other])["statistics"]["computation_nodes"] == 1


def test_self_referencing_containers_do_not_crash(core):
    node = core.Node("n")
    loop = []
    loop.append(loop)
    node.ops.append((len, (loop,), None, node.new_value()))
    with pytest.raises(RecursionError):
        node.prune([0])

# Reference counts of these entry points (and of the heap types they create)
# are checked exactly by tests/test_leaks.py (scenario graph_and_yaml).


def test_ref_hash_of_the_largest_index_does_not_overflow(core):
    # index * 2 overflowed a signed integer (undefined behaviour; the sanitizer
    # build, `make test-asan`, aborts on it).
    big = core.value_ref(sys.maxsize)
    assert hash(big) == hash(core.value_ref(sys.maxsize)) and big == core.value_ref(sys.maxsize)
    assert hash(big) != -1
    assert {core.value_ref(i) for i in (0, 1, sys.maxsize // 2, sys.maxsize)} == \
        {core.value_ref(i) for i in (sys.maxsize, sys.maxsize // 2, 1, 0)}


class _Dtype:
    """A dtype-like object of another library: its str has no "torch." prefix."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class _HasDtype:
    def __init__(self, dtype):
        self.dtype = dtype


def test_dtype_name_strips_only_a_torch_prefix(core):
    assert core.dtype_name(_HasDtype(_Dtype("torch.float32"))) == "float32"
    assert core.dtype_name(_HasDtype(_Dtype("float32"))) == "float32"  # gave "2"
    assert core.dtype_name(_HasDtype(_Dtype("int8"))) == "int8"
    assert core.dtype_name(_HasDtype(_Dtype("torchy.bool_"))) == "torchy.bool_"
