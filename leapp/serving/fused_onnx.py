"""The ONNX fused model: every node's model (exported ONNX as is, TorchScript and pt2
converted) inlined into one graph wired by the plan.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from typing import Any

import torch

from ..bundle.dtypes import onnx_type
from ..bundle.safe_load import quote
from ..models.load import load
from .fused_plan import METADATA_KEY, FuseError, Plan, fail, logger


def _ai_onnx_opset(model: Any) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def example_inputs(entry: Any) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(shape, dtype=dtype)
                 for shape, dtype in zip(entry.input_shapes, entry.input_dtypes))


def _node_onnx(name: str, entry: Any, opset: int, writer: bool = True,
               written: list[str] | None = None) -> tuple[Any, list[str | None], list[str]]:
    """One node as an ONNX model: (model, graph input per YAML input, graph outputs).

    A jit or pt2 node goes to leapp's ONNX writer first unless ``writer`` is False
    (its name is then appended to ``written``), else to torch's exporter."""
    import onnx

    from ..compiling.onnx_callable import default_opset

    backend = entry.backend
    model: Any = None
    if backend == "onnx":
        model = onnx.load(entry.model_path)
        graph_inputs = _graph_input_names(model)
        if set(graph_inputs) <= set(entry.input_names):  # by name (the loader's rule)
            mapping: list[str | None] = [n if n in graph_inputs else None
                                         for n in entry.input_names]
        else:  # positional
            mapping = list(graph_inputs) + [None] * (len(entry.input_names) - len(graph_inputs))
        return model, mapping, [o.name for o in model.graph.output]
    args = example_inputs(entry)
    program: Any = None
    if backend == "jit":
        module = load("jit", entry.model_path, device="cpu")[0]
    else:
        from ..bundle.pt2_reader import load_pt2
        program = load_pt2(entry.model_path)
        module = traced_pt2(program, args) if not has_control_flow(program) else None
    result = _written(name, entry, module, args, opset) if writer else None
    if result is not None:
        if written is not None:
            written.append(name)
        return result
    in_names = [f"leapp_in_{i}" for i in range(len(entry.input_names))]
    out_names = [f"leapp_out_{i}" for i in range(len(entry.output_names))]
    if module is not None:
        try:
            model = _torchscript_onnx(module, args, in_names, out_names,
                                      min(opset, default_opset()))
        except Exception as exc:
            # an op the TorchScript exporter lacks (aten::gru_cell): through
            # torch.export, whose decompositions the dynamo exporter covers
            logger.debug("Node %s: TorchScript ONNX export failed (%s); using the dynamo "
                         "exporter", name, exc)
            if program is None:
                from torch._export.converter import TS2EPConverter
                program = TS2EPConverter(module, args).convert()
    if model is None:
        # torch.cond / while_loop, or a converted TorchScript graph: the dynamo exporter
        exported: Any = torch.onnx.export(program, args, None, dynamo=True,
                                          opset_version=opset, input_names=in_names,
                                          output_names=out_names, optimize=True, verbose=False)
        model = exported.model_proto
    graph_inputs = _graph_input_names(model)
    mapping = [n if n in graph_inputs else None for n in in_names]
    outputs = [o.name for o in model.graph.output]
    return model, mapping, outputs


def _written(name: str, entry: Any, module: Any, args: tuple[torch.Tensor, ...],
             opset: int) -> tuple[Any, list[str | None], list[str]] | None:
    """The node (its TorchScript module, None for a pt2 program with control flow)
    written by leapp's ONNX writer, as _node_onnx returns it; None when the writer
    does not write it, with the node and the reason logged (torch's exporter then
    converts it)."""
    from ..compiling.onnx_callable import (NotWritten, deduplicate_names, write_callable,
                                           writer_enabled)

    if not writer_enabled():
        logger.info("Node %s (%s): converted to ONNX with torch's exporter (the ONNX writer "
                    "is turned off)", quote(name), entry.backend)
        return None
    try:
        if module is None:
            raise NotWritten("its torch.export program holds control flow (torch.cond or a "
                             "loop), which one trace would cut to one branch")
        model = write_callable(name, module, args, list(entry.input_names),
                               list(entry.output_names), opset)
    except NotWritten as exc:
        logger.warning("Node %s (%s): converted to ONNX with torch's exporter, not leapp's "
                       "ONNX writer: %s", quote(name), entry.backend, exc)
        return None
    logger.info("Node %s (%s): written to ONNX by leapp's ONNX writer", quote(name),
                entry.backend)
    inputs = set(_graph_input_names(model))
    names = deduplicate_names(name, list(entry.input_names), list(entry.output_names))[0]
    return model, [n if n in inputs else None for n in names], \
        [o.name for o in model.graph.output]


def _torchscript_onnx(module: Any, args: tuple[torch.Tensor, ...], in_names: list[str],
                      out_names: list[str], opset: int) -> Any:
    """TorchScript's exporter: a straight-line graph exports in milliseconds."""
    import onnx
    with tempfile.TemporaryDirectory(prefix="leapp-fuse-") as tmp, warnings.catch_warnings():
        # the exporter warns that a ScriptModule's inputs are taken as given
        warnings.simplefilter("ignore", UserWarning)
        path = os.path.join(tmp, "node.onnx")
        torch.onnx.export(module, args, path, dynamo=False, input_names=in_names,
                          output_names=out_names, opset_version=opset)
        return onnx.load(path)


def has_control_flow(program: Any) -> bool:
    """Whether a torch.export program holds higher-order ops (cond, while_loop, ...).

    Tracing runs one branch of those; a straight-line aten graph (what leapp's
    pt2 backend writes) traces exactly.
    """
    return any(node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)
               for node in program.graph.nodes)


def traced_pt2(program: Any, args: tuple[torch.Tensor, ...]) -> Any:
    """A straight-line torch.export program as TorchScript (traced once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(program.module(), args, check_trace=False, strict=False)


def _graph_input_names(model: Any) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in initializers]


def _to_opset(name: str, model: Any, opset: int) -> Any:
    current = _ai_onnx_opset(model)
    if current == opset or current == 0:
        return model
    import onnx.version_converter
    try:
        return onnx.version_converter.convert_version(model, opset)
    except Exception as exc:
        fail(f"Node {quote(name)}: its ONNX model uses opset {current} and the fused model "
              f"needs opset {opset}; converting failed ({type(exc).__name__}: "
              f"{quote(str(exc))}). Re-export the node with opset_version={opset}.")
    raise AssertionError("unreachable")


def _node_model(name: str, entry: Any, opset: int, writer: bool = True,
                written: list[str] | None = None) -> tuple[Any, list[str | None], list[str]]:
    """_node_onnx, its failures refused with the node's name and the fix."""
    try:
        return _node_onnx(name, entry, opset, writer, written)
    except FuseError:
        raise
    except Exception as exc:
        fail(f"Node {quote(name)} ({entry.backend}, {quote(entry.model_path)}) could not "
              f"be converted to ONNX for the fused model: {type(exc).__name__}: "
              f"{quote(' '.join(str(exc).split()), 400)}. Export the node with "
              "export_with='onnx' and compile again"
              + (", or fuse to format='torchscript'." if entry.backend != "onnx" else "."))


def build_onnx(the_plan: Plan, manager: Any, writer: bool = True,
               written: list[str] | None = None) -> Any:
    """The fused ``onnx.ModelProto`` for ``the_plan``.

    ``writer=False`` converts every jit and pt2 node with torch's exporters (the
    batched model's second try: the writer's graphs hold the traced shapes, robot
    dimension included); the nodes leapp's ONNX writer wrote are appended to
    ``written``."""
    opset = _asked_opset(the_plan, manager)
    models = [_node_model(name, manager.nodes[name], opset, writer, written)
              for name in the_plan.order]
    # An exporter may write a newer opset than asked for (torch 2.7's dynamo
    # exporter writes 18 at the least): the fused model takes the newest one,
    # since converting up is what the ONNX version converter does reliably.
    parts = _Parts(max([opset] + [_ai_onnx_opset(m[0]) for m in models]))
    for index, (name, (model, in_map, out_names)) in enumerate(zip(the_plan.order, models)):
        parts.add_node(the_plan, index, name, manager.nodes[name], model, in_map, out_names)
    parts.add_ends(the_plan)
    return parts.model(the_plan)


def _asked_opset(the_plan: Plan, manager: Any) -> int:
    """The opset the fused model asks its converted nodes for: the newest of the bundle's
    ONNX nodes and torch's default."""
    import onnx

    from ..compiling.onnx_callable import default_opset

    opsets = [0]
    for name in the_plan.order:
        entry = manager.nodes[name]
        if entry.backend == "onnx":
            opsets.append(_ai_onnx_opset(onnx.load(entry.model_path, load_external_data=False)))
    return max(max(opsets), default_opset())


class _Parts:
    """The fused graph being assembled: every node's graph under its own prefix, fed by
    Identity nodes from the graph inputs, states, constants or earlier nodes."""

    def __init__(self, opset: int) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.value_infos: list[Any] = []
        self.functions: list[Any] = []
        self.opsets: dict[str, int] = {"": opset}
        self.ir_version = 0
        self.produced: dict[tuple[str, str], str] = {}  # (node, port) -> fused value name

    def add_node(self, the_plan: Plan, index: int, name: str, entry: Any, model: Any,
                 in_map: list, out_names: list) -> None:
        """One node's model, converted to the fused opset, prefixed and wired."""
        import onnx
        from onnx import helper, numpy_helper

        model = _to_opset(name, model, self.opsets[""])
        if len(out_names) != len(entry.output_names):
            fail(f"Node {quote(name)}: its model has {len(out_names)} outputs but the bundle "
                 f"declares {len(entry.output_names)} ({quote(entry.output_names)}).")
        prefix = f"n{index}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}::"
        model = onnx.compose.add_prefix(model, prefix)
        self.ir_version = max(self.ir_version, model.ir_version)
        for entry_opset in model.opset_import:
            domain = "" if entry_opset.domain == "ai.onnx" else entry_opset.domain
            if domain:
                self.opsets[domain] = max(self.opsets.get(domain, 0), int(entry_opset.version))
        for port, graph_input in zip(entry.input_names, in_map):
            if graph_input is None:
                continue  # the exporter dropped it: nothing reads it
            kind, what = the_plan.feeds[name][port]
            if kind in ("input", "state"):
                source = what
            elif kind == "node":
                source = self.produced[what]
            else:
                source = f"leapp::constant::{index}::{port}"  # outside every prefix
                self.initializers.append(numpy_helper.from_array(what.numpy(), source))
            self.nodes.append(helper.make_node("Identity", [source], [prefix + graph_input],
                                               name=f"{prefix}feed::{port}"))
        graph = model.graph
        self.nodes.extend(graph.node)
        self.initializers.extend(graph.initializer)
        self.value_infos.extend(graph.value_info)
        self.functions.extend(model.functions)
        for port, out in zip(entry.output_names, out_names):
            self.produced[(name, port)] = prefix + out

    def add_ends(self, the_plan: Plan) -> None:
        """The fused model's outputs and next states, each an Identity of its source."""
        from onnx import helper
        for port, source in zip(the_plan.outputs, the_plan.outputs_from):
            self.nodes.append(helper.make_node("Identity", [self.produced[source]], [port.name],
                                               name=f"output::{port.name}"))
        for state in the_plan.states:
            self.nodes.append(helper.make_node("Identity", [self.produced[state.source]],
                                               [state.output], name=f"state::{state.output}"))

    def model(self, the_plan: Plan) -> Any:
        """The ModelProto: inputs then states in, outputs then states out, the plan's
        metadata."""
        from onnx import helper

        def info(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
            return helper.make_tensor_value_info(name, onnx_type(dtype), list(shape))

        graph = helper.make_graph(
            self.nodes, f"{the_plan.pipeline}_fused",
            [info(p.name, p.dtype, p.shape) for p in the_plan.inputs]
            + [info(s.input, s.dtype, s.shape) for s in the_plan.states],
            [info(p.name, p.dtype, p.shape) for p in the_plan.outputs]
            + [info(s.output, s.dtype, s.shape) for s in the_plan.states],
            initializer=self.initializers, value_info=self.value_infos)
        fused = helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets.items()],
            functions=self.functions, producer_name="leapp.fuse")
        fused.ir_version = max(self.ir_version, 8)
        helper.set_model_props(fused, {METADATA_KEY: json.dumps(the_plan.metadata())})
        return fused


def save_onnx(model: Any, path: str, final: str) -> None:
    """Save to path; large weights go beside it as <final's name>.data."""
    from ..compiling.onnx_callable import save_model
    save_model(model, path, os.path.basename(final) + ".data")


