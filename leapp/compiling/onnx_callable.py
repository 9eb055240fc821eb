"""A callable (a fused model's TorchScript or pt2 node) written as one ONNX model by
leapp's ONNX writer: what serving's fused ONNX model needs of the compiling stage.

This module is serving's one door into compiling (tests/test_layers.py): it writes a
callable (:func:`write_callable`) and hands on, from the node exporter
(leapp.compiling.backends.onnx), the opset, the port-name rule and the model saver that a
fused model shares with every exported node.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .backends.onnx import (deduplicate_names, default_opset,  # noqa: F401  (the door's)
                            differs_from_eager, save_model)

__all__ = ["NotWritten", "deduplicate_names", "default_opset", "save_model", "write_callable",
           "writer_enabled"]


def writer_enabled() -> bool:
    """Whether leapp's ONNX writer writes nodes (False: LEAPP_ONNX_WRITER=torch)."""
    from . import onnx_writer
    return onnx_writer.enabled()


class NotWritten(Exception):
    """Why leapp's ONNX writer did not write a callable (write_callable)."""


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def write_callable(node: str, fn: Any, example_inputs: Sequence[torch.Tensor],
                   input_names: list[str], output_names: list[str], opset: int) -> Any:
    """fn (a TorchScript module, say) as an ONNX model written by leapp's writer.

    fn runs once on the example inputs in a private trace (leapp.tracing.node_trace:
    no session state touched), and the node it records is written with the
    writer, its inputs and outputs named as given (a name on both sides becomes
    <name>_in / <name>_out, as for an exported node: deduplicate_names), then checked
    against fn on fresh inputs as every written node is.  Returns the ModelProto;
    raises NotWritten naming why (the writer turned off, a running session, a
    TorchScript construct the tracer cannot run, control flow or a data-dependent
    value, a call without a rule, a model that parts from fn)."""
    from . import onnx_writer
    from .._version import __version__
    from ..tracing.node_trace import NotTraceable, trace_callable

    if not onnx_writer.enabled():
        raise NotWritten(f"{onnx_writer.ENV}=torch chooses torch's exporter")
    inputs = [t.detach() for t in example_inputs]
    try:
        module = trace_callable(node, fn, inputs, input_names, output_names)
    except NotTraceable as exc:
        raise NotWritten(f"leapp's tracer cannot record it exactly: {exc}") from None
    except Exception as exc:  # noqa: BLE001  a construct the tracer cannot run
        raise NotWritten(f"leapp's tracer cannot run it: {_one_line(exc)}") from None
    written_in, written_out = deduplicate_names(node, list(input_names), list(output_names))
    try:
        model = onnx_writer.write_model(node, module, inputs, written_in, written_out, opset,
                                        __version__)
    except onnx_writer.NoRule as exc:
        raise NotWritten(str(exc)) from None
    except Exception as exc:  # noqa: BLE001  a writer bug must not cost the model
        raise NotWritten(f"the ONNX writer failed: {_one_line(exc)}") from None
    why = differs_from_eager(model, module, inputs, written_in, written_out, reference=fn)
    if why is not None:
        raise NotWritten(why)
    return model
