"""stop() gives the user's tensors back as they were.

A tensor of the user's that an op inside a node writes (in place, out=) becomes
a traced value of that node, and a tensor computed outside every node from a
published output carries a "derived" tag; both are TracedTensors while the
session runs.  After stop() every one of them is a plain torch.Tensor again
holding no carrier, no tag and no reference to a finished node (its op log and
constants are freed with the session), and a later session that declares them
sees fresh tensors: no "derived from" message, no mixed-node error.
"""
from __future__ import annotations

import gc
import logging

import torch

import leapp
from leapp import _core, annotate

SESSION_KEYS = {"_leapp_carrier", "_leapp_derived"}


def _first_session(tmp_path):
    """Node 'a' writes buf (copy_), acc (in place) and out (out=); d is computed
    outside every node from a's output.  Returns the tensors and the op log of 'a'."""
    buf, acc, out = torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3)
    leapp.start("first", save_path=str(tmp_path / "first"), dry_run=True)
    x = annotate.input_tensors("a", {"x": torch.full((1, 3), 2.0)})
    y = torch.tanh(x) * 3.0
    buf.copy_(y)
    acc.mul_(x)
    torch.add(x, 1.0, out=out)
    assert {type(t) for t in (buf, acc, out)} == {leapp.TracedTensor}  # while tracing
    annotate.output_tensors("a", {"y": y})
    d = y + 1.0                      # outside every node, from a's output
    e = d * 2.0                      # and from that derived value
    assert type(d) is leapp.TracedTensor and "_leapp_derived" in vars(d)
    assert vars(e)["_leapp_derived"] == ("a", "y", "add")
    ops = len(_core.nodes()["a"].ops)
    leapp.stop()
    return {"buf": buf, "acc": acc, "out": out, "d": d, "e": e}, ops


def _live_nodes(name: str) -> list:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is _core.Node and o.name == name]


def test_written_and_derived_tensors_are_plain_after_stop(tmp_path):
    tensors, _ = _first_session(tmp_path)
    for name, t in tensors.items():
        assert type(t) is torch.Tensor, name
        assert not SESSION_KEYS & set(vars(t)), (name, vars(t))
    # The values are what the eager ops computed.
    y = torch.tanh(torch.full((1, 3), 2.0)) * 3.0
    torch.testing.assert_close(tensors["buf"], y)
    torch.testing.assert_close(tensors["acc"], torch.full((1, 3), 2.0))
    torch.testing.assert_close(tensors["out"], torch.full((1, 3), 3.0))
    torch.testing.assert_close(tensors["e"], (y + 1.0) * 2.0)


def test_no_tensor_keeps_the_finished_node_alive(tmp_path):
    tensors, ops = _first_session(tmp_path)
    assert ops >= 5 and len(_live_nodes("a")) == 1   # the session's node, with its op log
    leapp.start("second", save_path=str(tmp_path / "second"), dry_run=True)  # forgets 'a'
    leapp.stop()
    assert _live_nodes("a") == []
    assert len(tensors) == 5


def test_a_second_session_sees_fresh_tensors(tmp_path, caplog):
    tensors, _ = _first_session(tmp_path)
    caplog.set_level(logging.INFO, logger="leapp")
    leapp.start("second", save_path=str(tmp_path / "second"), dry_run=True)
    # The same node name again: a tag or carrier left from the first session
    # would name it ("was derived from node 'a'", "belong to a different node").
    ins = annotate.input_tensors("a", dict(tensors))
    annotate.output_tensors("a", {"z": sum(ins.values()) if isinstance(ins, dict)
                                  else sum(ins)})
    leapp.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "derived from" in m or "computed outside" in m], messages
    for name, t in tensors.items():
        assert type(t) is torch.Tensor and not SESSION_KEYS & set(vars(t)), name


def test_attributes_of_the_users_survive_the_class_changes(tmp_path):
    # The class changes through `__class__ =`, which keeps the instance dict.
    buf = torch.zeros(1, 3)
    buf.label = "memory"
    leapp.start("attrs", save_path=str(tmp_path), dry_run=True)
    x = annotate.input_tensors("a", {"x": torch.ones(1, 3)})
    buf.add_(x)
    assert type(buf) is leapp.TracedTensor and buf.label == "memory"
    annotate.output_tensors("a", {"y": x * 2.0})
    leapp.stop()
    assert type(buf) is torch.Tensor and vars(buf) == {"label": "memory"}


class _Unnamed:
    """A callable without __name__, dispatched through __torch_function__."""

    def __call__(self, t):
        if torch.overrides.has_torch_function((t,)):
            return torch.overrides.handle_torch_function(self, (t,), t)
        return t + 1.0

    def __repr__(self):
        return "<unnamed op>"


def test_a_derived_tag_names_a_callable_without_a_name_by_its_repr(tmp_path):
    leapp.start("unnamed", save_path=str(tmp_path), dry_run=True)
    x = annotate.input_tensors("a", {"x": torch.ones(1, 3)})
    y = x * 2.0
    annotate.output_tensors("a", {"y": y})
    d = _Unnamed()(y)
    assert vars(d)["_leapp_derived"] == ("a", "y", "<unnamed op>")
    leapp.stop()
    assert type(d) is torch.Tensor
