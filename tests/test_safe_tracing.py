"""Tracing stays safe under threads, deep payloads and copies of traced values.

* A session traces the thread that called leapp.start(): annotations,
  @annotate.method calls and ops on values of a tracing node from any other
  thread raise a RuntimeError naming both threads; the owner's nodes export.
* Payload walks keep their own stack: deep nesting is accepted, not a
  RecursionError, and flattened names are upstream's.
* After leapp.stop() every tensor the user holds is a plain torch.Tensor
  (deepcopy, pickle, torch.save/load); during the session deepcopy of a
  traced value is a recorded clone.
"""
from __future__ import annotations

import copy
import io
import pickle
import threading

import pytest
import torch

import leapp
from leapp import _core, annotate
from leapp.tracing import payload as _payload


def _run_in_thread(fn) -> list:
    """Run fn in a new thread; returns the exceptions it raised."""
    errors: list = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    thread = threading.Thread(target=body, name="worker-thread")
    thread.start()
    thread.join()
    return errors


def _trace_policy(name: str, scale: float = 2.0) -> torch.Tensor:
    x = annotate.input_tensors(name, {"obs": torch.ones(1, 3)})
    y = torch.tanh(x * scale + 1.0)
    annotate.output_tensors(name, {"act": y}, export_with="jit")
    return y


# ---- threads ------------------------------------------------------------------


def test_second_thread_annotation_is_refused_naming_both_threads(bundle):
    leapp.start("thr", save_path=bundle.root)
    errors = _run_in_thread(lambda: annotate.input_tensors("other", {"x": torch.ones(2)}))
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    text = str(errors[0])
    assert "annotate.input_tensors()" in text and "'worker-thread'" in text
    assert "'MainThread'" in text and "leapp.start()" in text
    assert "other" not in _core.nodes()  # the refused call left no node behind
    _trace_policy("policy")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}
    assert set(bundle.yaml("thr")["models"]) == {"policy"}


def test_two_threads_tracing_two_nodes_give_one_clear_error_each(bundle):
    leapp.start("thr2", save_path=bundle.root)
    barrier = threading.Barrier(2)
    errors: dict = {}

    def trace(name: str) -> None:
        barrier.wait()
        try:
            _trace_policy(name)
        except RuntimeError as exc:
            errors[name] = exc

    threads = [threading.Thread(target=trace, args=(n,), name=f"t-{n}") for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(errors) == {"a", "b"}
    for name, exc in errors.items():
        assert f"'t-{name}'" in str(exc) and "annotate.input_tensors()" in str(exc)
    assert dict(_core.nodes()) == {}
    leapp.stop()


def test_second_thread_on_one_node_is_refused_and_the_node_exports(bundle):
    leapp.start("thr1", save_path=bundle.root)
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    h = x * 2.0

    def write_same_node() -> None:
        annotate.output_tensors("policy", {"act": h})

    def op_on_tracing_value() -> None:
        torch.relu(h)

    def method_call() -> None:
        annotate.method(lambda v: v)(torch.ones(1))

    for fn, what in ((write_same_node, "annotate.output_tensors()"),
                     (op_on_tracing_value, "the torch op 'relu' on a traced value of node "
                                           "'policy'"),
                     (method_call, "annotate.method()")):
        errors = _run_in_thread(fn)
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError), fn
        assert what in str(errors[0])
    y = torch.tanh(h)
    annotate.output_tensors("policy", {"act": y}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}
    model = bundle.yaml("thr1")["models"]["policy"]
    assert [p["name"] for p in model["inputs"]] == ["obs"]
    assert [p["name"] for p in model["outputs"]] == ["act"]


def test_second_thread_may_read_finished_values_but_not_write_them(bundle):
    leapp.start("thr3", save_path=bundle.root)
    y = _trace_policy("policy")
    seen: list = []
    assert _run_in_thread(lambda: seen.append(type(y * 1.0))) == []
    assert seen == [torch.Tensor]  # eager, plain, not recorded anywhere
    errors = _run_in_thread(lambda: y.add_(1.0))
    assert len(errors) == 1 and "in-place write" in str(errors[0])
    assert _core.carrier_of(y).port == "act"  # the refused write left the port
    leapp.stop()


def test_stop_from_another_thread_is_refused(bundle):
    leapp.start("thr4", save_path=bundle.root)
    errors = _run_in_thread(leapp.stop)
    assert len(errors) == 1 and "leapp.stop()" in str(errors[0])
    assert _core.is_tracing()
    leapp.stop()


def test_threads_work_without_a_session():
    out: list = []
    errors = _run_in_thread(lambda: out.append(annotate.input_tensors("n", {"x": 1})))
    assert errors == [] and out == [1]


def test_session_started_in_a_worker_thread_belongs_to_it(bundle):
    def session() -> None:
        leapp.start("thr5", save_path=bundle.root)
        _trace_policy("policy")
        leapp.stop()

    assert _run_in_thread(session) == []
    assert leapp.compile_graph(visualize=False) == {"policy": True}


# ---- deep payloads ------------------------------------------------------------


def _nested(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [500, 10_000])
def test_deep_payload_is_accepted(bundle, depth):
    leapp.start("deep", save_path=bundle.root)
    x = torch.ones(2)
    returned = annotate.input_tensors("n", {"o": _nested(depth, x)})
    leaf = returned
    for _ in range(depth):
        leaf = leaf["a"]
    assert leaf is x
    annotate.output_tensors("n", {"y": leaf * 2.0})
    port = _core.nodes()["n"].inputs[0]
    assert port.name == "o" + "_a" * depth
    leapp.stop()


def test_deep_payload_without_a_session_and_through_mirror_tags(bundle):
    deep = _nested(5_000, torch.ones(1))
    assert annotate.input_tensors("n", {"o": deep, "p": 1})[0] is deep
    leapp.start("deep2", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(1)})
    source = _nested(3_000, x)
    target = _nested(3_000, torch.ones(1))
    assert annotate.mirror_leapp_tags(source, target) is target
    leapp.stop()


def test_payload_that_contains_itself_is_refused(bundle):
    cyclic: dict = {"x": torch.ones(1)}
    cyclic["self"] = cyclic
    leapp.start("cyc", save_path=bundle.root)
    with pytest.raises(ValueError, match="reference cycle"):
        annotate.input_tensors("n", {"o": cyclic})
    leapp.stop()


def test_flattened_names_match_upstream():
    payload = {"o": {"pos": 1, "vel": [2, (3, {"k": 4})]}, "h": [5]}
    leaves = list(_payload.flatten(payload, {}))
    # upstream 0.7.2 names these inputs o_pos, o_vel_0, o_vel_1_0, o_vel_1_1_k, h_0
    assert [leaf.name for leaf in leaves] == ["o_pos", "o_vel_0", "o_vel_1_0", "o_vel_1_1_k",
                                              "h_0"]
    assert [leaf.path for leaf in leaves] == [("o", "pos"), ("o", "vel", 0), ("o", "vel", 1, 0),
                                              ("o", "vel", 1, 1, "k"), ("h", 0)]
    rebuilt = _payload.rebuild(payload, {("o", "vel", 1, 1, "k"): 40, ("h", 0): 50})
    assert rebuilt == ({"pos": 1, "vel": [2, (3, {"k": 40})]}, [50])
    assert type(rebuilt[0]["vel"][1]) is tuple and type(rebuilt[1]) is list


# ---- copies of traced values ----------------------------------------------------


def _roundtrips(t: torch.Tensor) -> list:
    saved = io.BytesIO()
    torch.save(t, saved)
    saved.seek(0)
    return [copy.deepcopy(t), pickle.loads(pickle.dumps(t)), torch.load(saved)]


def test_everything_the_user_holds_is_plain_after_stop(bundle):
    leapp.start("plain", save_path=bundle.root)
    obs = torch.ones(1, 3)
    x = annotate.input_tensors("policy", {"obs": obs})
    assert x is obs and type(obs) is not torch.Tensor  # promoted in place while tracing
    hidden = torch.tanh(x * 2.0)
    act = annotate.output_tensors("policy", {"act": hidden + 1.0})
    policy = {"obs": obs, "act": act, "hidden": hidden}
    leapp.stop()
    for name, t in policy.items():
        if name != "hidden":  # declared and published values are plain again
            assert type(t) is torch.Tensor, name
            assert _core.carrier_of(t) is None
        # an intermediate may stay a TracedTensor (op results are not tracked one by
        # one on the hot path), but copies like a plain tensor
        for copied in _roundtrips(t):
            assert type(copied) is torch.Tensor and torch.equal(copied, t), name
    assert type(copy.deepcopy(policy)["act"]) is torch.Tensor
    assert leapp.compile_graph(visualize=False) == {"policy": True}


def test_deepcopy_inside_a_node_is_a_recorded_clone(bundle):
    leapp.start("dc", save_path=bundle.root)
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    y = x * 2.0
    twin = copy.deepcopy(y)
    assert twin is not y and torch.equal(twin, y)
    assert _core.carrier_of(twin).node is _core.carrier_of(y).node
    assert _core.carrier_of(twin).vid != _core.carrier_of(y).vid
    out = {"a": twin, "b": twin}
    copied = copy.deepcopy(out)
    assert copied["a"] is copied["b"]  # the memo is honoured
    annotate.output_tensors("policy", {"act": twin + 1.0}, export_with="jit")
    leapp.stop()
    assert leapp.compile_graph(visualize=False) == {"policy": True}


def test_deepcopy_keeps_requires_grad_and_user_attributes(bundle):
    leapp.start("dc2", save_path=bundle.root)
    w = torch.ones(3, requires_grad=True)
    x = annotate.input_tensors("policy", {"w": w})
    x.note = "mine"
    twin = copy.deepcopy(x)
    assert twin.requires_grad and twin.note == "mine"
    assert _core.carrier_of(twin) is not None
    annotate.output_tensors("policy", {"out": twin * 1.0})
    leapp.stop()
    after = copy.deepcopy(w)
    assert type(after) is torch.Tensor and after.requires_grad and after.note == "mine"


def test_traced_tensor_without_a_session_copies_as_plain():
    from leapp.tracing.traced import alias
    t = alias(torch.arange(3.0))
    for copied in _roundtrips(t):
        assert type(copied) is torch.Tensor and torch.equal(copied, torch.arange(3.0))


def test_tensors_of_a_session_never_stopped_are_released_by_the_next_start(bundle):
    leapp.start("a", save_path=bundle.root)
    x = annotate.input_tensors("n", {"x": torch.ones(1)})
    _core.set_tracing(False)  # as ExportManager.set_interpret_graph(False) does
    assert type(x) is not torch.Tensor
    leapp.start("b", save_path=bundle.root)
    assert type(x) is torch.Tensor and _core.carrier_of(x) is None
    leapp.stop()


def test_a_session_whose_thread_ended_can_be_stopped_elsewhere(bundle, caplog):
    def start_only() -> None:
        leapp.start("orphan", save_path=bundle.root)
        annotate.input_tensors("n", {"x": torch.ones(1)})

    assert _run_in_thread(start_only) == []
    leapp.stop()
    assert not _core.is_tracing()
    assert "has ended" in caplog.text


def test_deepcopy_of_a_tracing_value_from_another_thread_is_refused(bundle):
    leapp.start("dc3", save_path=bundle.root)
    x = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    errors = _run_in_thread(lambda: copy.deepcopy(x))
    assert len(errors) == 1 and "of node 'policy'" in str(errors[0])
    y = _trace_policy("other")
    copies: list = []
    assert _run_in_thread(lambda: copies.append(copy.deepcopy(y))) == []
    assert type(copies[0]) is torch.Tensor and torch.equal(copies[0], y)
    leapp.stop()
