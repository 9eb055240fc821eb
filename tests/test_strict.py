"""An input computed outside every node from a published output: a warning, or
an error in strict mode (leapp.start(strict=True) / LEAPP_STRICT=1)."""
from __future__ import annotations

import logging

import pytest
import torch

import leapp
from leapp import annotate


def _publish(bundle, **start):
    leapp.start("g", save_path=bundle.root, **start)
    x = annotate.input_tensors("a", {"x": torch.ones(3)})
    return annotate.output_tensors("a", {"z": x * 2})


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "computed outside every node" in r.getMessage()]


def test_op_on_an_output_warns_naming_node_input_and_op(bundle, caplog):
    z = _publish(bundle)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        w = annotate.input_tensors("d", {"w": torch.tanh(z)})
        annotate.output_tensors("d", {"y": w + 1})
    (message,) = _warnings(caplog)
    assert message.startswith("Input 'w' of node 'd' was computed outside every node by "
                              "'tanh' from output 'z' of node 'a'")
    assert "strict=True" in message
    leapp.stop()
    leapp.compile_graph(visualize=False)  # still compiles: the warning is all it does
    assert bundle.yaml("g")["pipeline"]["inputs"]["d"] == ["w"]  # the silent new graph input


@pytest.mark.parametrize("derive, op", [
    (lambda z: torch.tanh(z) * 3.0 + 1.0, "tanh"),        # a chain keeps the first op
    (lambda z: z[1:], "__getitem__"),
    (lambda z: z.split(1)[0], "split"),
    (lambda z: z.double(), "double"),
    (lambda z: 2.0 * z, "mul"),
    (lambda z: torch.cat([torch.zeros(1), z]), "cat"),
])
def test_derived_values_are_followed(bundle, caplog, derive, op):
    z = _publish(bundle)
    value = derive(z)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        annotate.input_tensors("d", {"w": value})
    (message,) = _warnings(caplog)
    assert f"by '{op}' from output 'z' of node 'a'" in message


def test_write_into_a_plain_tensor_is_followed(bundle, caplog):
    z = _publish(bundle)
    target = torch.zeros(3)
    target[0] = z[2]
    with caplog.at_level(logging.WARNING, logger="leapp"):
        annotate.input_tensors("d", {"w": target})
    assert len(_warnings(caplog)) == 1


def test_wired_and_plain_inputs_do_not_warn(bundle, caplog):
    z = _publish(bundle)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        d, e = annotate.input_tensors("d", {"z": z, "e": torch.ones(3) * 2})
        annotate.output_tensors("d", {"y": d + e})
        c = annotate.input_tensors("c", {"c": z.clone()})
        annotate.output_tensors("c", {"y": c + 1})
    assert _warnings(caplog) == []
    leapp.stop()
    leapp.compile_graph(visualize=False)
    assert sorted(bundle.yaml("g")["pipeline"]["data_flow"]["a/z"]) == ["c/c", "d/z"]


def test_strict_mode_refuses(bundle):
    z = _publish(bundle, strict=True)
    with pytest.raises(RuntimeError, match=r"Input 'w' of node 'd' was computed outside every "
                                           r"node by 'tanh' .*strict mode"):
        annotate.input_tensors("d", {"w": torch.tanh(z)})


def test_strict_mode_from_the_environment(bundle, monkeypatch):
    monkeypatch.setenv("LEAPP_STRICT", "1")
    z = _publish(bundle)
    with pytest.raises(RuntimeError, match="computed outside every node"):
        annotate.input_tensors("d", {"w": z + 1})
    leapp.stop()
    monkeypatch.setenv("LEAPP_STRICT", "1")
    z = _publish(bundle, strict=False)  # the argument wins
    annotate.input_tensors("d", {"w": z + 1})


def test_values_tagged_in_an_earlier_session_do_not_warn(bundle, caplog):
    z = _publish(bundle)
    stale = torch.tanh(z)
    leapp.stop()
    leapp.start("other", save_path=bundle.root)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        annotate.input_tensors("d", {"w": stale})
    assert _warnings(caplog) == []


def test_derived_values_compute_as_plain_tensors(bundle):
    z = _publish(bundle)
    w = torch.tanh(z) * 3.0
    expected = torch.tanh(torch.full((3,), 2.0)) * 3.0
    assert torch.equal(w.as_subclass(torch.Tensor), expected)
    assert w.numpy().tolist() == expected.tolist()
    assert (w + 1).sum().item() == pytest.approx(float((expected + 1).sum()))
