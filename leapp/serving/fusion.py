"""The whole pipeline as one model: ``leapp.fuse``.

A bundle is one model per node plus the YAML that wires them.  ``fuse`` turns
it into one model that runs one step of the whole pipeline, nodes in run
order, so that a runtime knowing nothing of LEAPP (onnxruntime, TensorRT, a
C++ TorchScript runtime, a Triton server) can run it.  Feedback becomes
explicit state: each feedback target is a state input named
``"<node>/<port>"`` and its source this step a state output named
``"<node>/<port>__next"``; the initial values travel in the model's metadata.
The convention is documented in docs/fuse.md.

The bundle is read the way ``InferenceManager`` reads it (it *is* an
``InferenceManager``: same parser, same checksums, same confined paths, pt2
never unpickled), so fusing trusts a bundle no more than running it does.

* ``format="onnx"``: ONNX nodes are merged as graphs (``onnx.compose``
  prefixes against name clashes), TorchScript nodes are re-exported with
  torch's TorchScript-based ONNX exporter, pt2 nodes with the dynamo exporter.
* ``format="torchscript"``: jit nodes are kept as they are, pt2 nodes are
  traced; a node that only exists as ONNX cannot be turned into TorchScript
  and is refused, naming the node.

The fused model is then run step by step next to ``InferenceManager`` on the
same bundle, state carried across :data:`VALIDATION_STEPS` steps, and refused
if any output differs.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..bundle.digest import file_digests
from ..bundle.dtypes import BY_TORCH, onnx_type
from ..bundle.safe_load import quote
from ..compiling.backends.load import load
from ..bundle.pipeline import split_key

logger = logging.getLogger("leapp")

#: Version of the fused-model convention (metadata ``format_version``).
FORMAT_VERSION = 1
#: Metadata key (ONNX ``metadata_props``) holding the convention's JSON.
METADATA_KEY = "leapp_fused"
#: TorchScript ``_extra_files`` entry holding the same JSON.
TORCHSCRIPT_EXTRA_FILE = "leapp_fused.json"
#: Suffix of a state output's name.
STATE_SUFFIX = "__next"
#: Suffix of a data output named like an input ("reader/base" in and out).
OUTPUT_SUFFIX = "__out"
#: Top-level YAML key recording fused models (upstream's reader ignores it).
YAML_KEY = "fused"
#: Steps the fused model is run next to InferenceManager before it is accepted.
VALIDATION_STEPS = 12
#: Accepted ``format`` values and the file suffix of each.
FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}




class FuseError(ValueError):
    """The bundle cannot be fused (or the fused model does not match the bundle)."""


@dataclass
class Port:
    """One input or output of the fused model."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    key: str | None = None  # the YAML's "node/port" where the name differs from it

    def describe(self) -> dict[str, Any]:
        entry = {"name": self.name, "dtype": BY_TORCH[self.dtype].name, "shape": list(self.shape)}
        if self.key is not None and self.key != self.name:
            entry["key"] = self.key
        return entry


@dataclass
class State:
    """One feedback pair: ``input`` is the target's value, ``output`` its next value."""

    input: str
    output: str
    source: tuple[str, str]
    dtype: torch.dtype
    shape: tuple[int, ...]
    initial: torch.Tensor

    def describe(self) -> dict[str, Any]:
        raw = self.initial.detach().cpu().contiguous()
        data = raw.view(torch.uint8).numpy().tobytes() if raw.numel() else b""
        return {"input": self.input, "output": self.output, "dtype": BY_TORCH[self.dtype].name,
                "shape": list(self.shape),
                "initial": {"encoding": "base64-le", "data": base64.b64encode(data).decode()}}


@dataclass
class Plan:
    """What the fused model computes, read from the bundle.

    ``feeds[node][port]`` says where each node input comes from: ``("input", name)``
    a data input, ``("state", name)`` a state input, ``("node", (src, port))``
    another node's output this step, ``("constant", tensor)`` a value no edge
    feeds (the zeros or initial value ``InferenceManager`` leaves there).
    """

    pipeline: str
    bundle_dir: str
    order: list[str]
    inputs: list[Port]
    outputs: list[Port]
    outputs_from: list[tuple[str, str]]
    states: list[State]
    feeds: dict[str, dict[str, tuple[str, Any]]]

    def metadata(self) -> dict[str, Any]:
        from .._version import __version__
        return {"format_version": FORMAT_VERSION, "pipeline": self.pipeline,
                "leapp_version": __version__,
                "inputs": [p.describe() for p in self.inputs],
                "outputs": [p.describe() for p in self.outputs],
                "state": [s.describe() for s in self.states]}


def _fail(message: str) -> None:
    from ..bundle import log as _logging
    _logging.fatal(message, FuseError)


# ---- reading the bundle -----------------------------------------------------------


def _fed_twice(edge: Any, first: str) -> str:
    """Why a node input that ``edge`` feeds and that is already a ``first`` cannot be fused."""
    if edge.feedback:
        return (f"Feedback target {quote(edge.target)} is also fed as a {first} of the "
                "pipeline: it cannot be both state and data in the fused model. Fix the "
                "bundle's YAML.")
    return (f"Node input {quote(edge.target)} is fed by {quote(edge.source)} and is also a "
            f"{first} of the pipeline: one step of this bundle has no single meaning, so it "
            "cannot be fused. Fix the bundle's YAML.")


def plan(manager: Any) -> Plan:
    """The fused model's interface and wiring, from a loaded ``InferenceManager``."""
    nodes, graph = manager.nodes, manager.graph
    pipeline = os.path.splitext(os.path.basename(manager.model_path))[0]

    def port_of(node: str, port: str, side: str) -> tuple[torch.dtype, tuple[int, ...]]:
        entry = nodes[node]
        names = entry.input_names if side == "input" else entry.output_names
        i = names.index(port)
        if side == "input":
            return entry.input_dtypes[i], entry.input_shapes[i]
        return entry.output_dtypes[i], entry.output_shapes[i]

    inputs = []
    feeds: dict[str, dict[str, tuple[str, Any]]] = {name: {} for name in nodes}
    for node, port in graph.inputs:
        dtype, shape = port_of(node, port, "input")
        inputs.append(Port(f"{node}/{port}", dtype, shape))
        feeds[node][port] = ("input", f"{node}/{port}")
    states = []
    for edge in graph.edges:  # forward edges first, as the YAML lists them
        node, port, src = edge.dst_node, edge.dst_port, (edge.src_node, edge.src_port)
        if port in feeds[node]:
            _fail(_fed_twice(edge, feeds[node][port][0]))
        if not edge.feedback:
            feeds[node][port] = ("node", src)
            continue
        dtype, shape = port_of(node, port, "input")
        initial = manager._program.get(manager._slot_of[(node, port)]).detach().cpu().clone()
        states.append(State(f"{node}/{port}", f"{node}/{port}{STATE_SUFFIX}", src, dtype,
                            shape, initial))
        feeds[node][port] = ("state", f"{node}/{port}")
    for name, entry in nodes.items():
        for port in entry.input_names:
            if port not in feeds[name]:
                value = manager._program.get(manager._slot_of[(name, port)])
                feeds[name][port] = ("constant", value.detach().cpu().clone())
    taken = {p.name for p in inputs} | {s.input for s in states} | {s.output for s in states}
    outputs = []
    outputs_from = []
    for node, port in graph.outputs:
        dtype, shape = port_of(node, port, "output")
        key = f"{node}/{port}"
        # a node's input and output may share a port name (a pass-through), and
        # both be graph ports: one model cannot name two values alike
        name = f"{key}{OUTPUT_SUFFIX}" if key in taken else key
        if name in taken:
            _fail(f"The fused model of {quote(pipeline)} would name two of its ports "
                  f"{quote(name)}. Rename the port {quote(key)}.")
        outputs.append(Port(name, dtype, shape, key))
        outputs_from.append((node, port))
        taken.add(name)
    names = [p.name for p in inputs] + [s.input for s in states] + [s.output for s in states]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        _fail(f"The fused model of {quote(pipeline)} would name two of its ports "
              f"{quote(twice[0])} (a port named like another's state output). Rename the port.")
    return Plan(pipeline, os.path.dirname(os.path.abspath(manager.model_path)),
                list(manager.run_order), inputs, outputs, outputs_from, states, feeds)


# ---- the ONNX fused model ---------------------------------------------------------


def _ai_onnx_opset(model: Any) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def _example_inputs(entry: Any) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(shape, dtype=dtype)
                 for shape, dtype in zip(entry.input_shapes, entry.input_dtypes))


def _node_onnx(name: str, entry: Any, opset: int) -> tuple[Any, list[str | None], list[str]]:
    """One node as an ONNX model: (model, graph input per YAML input, graph outputs)."""
    import onnx

    from ..compiling.backends.onnx import default_opset

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
    in_names = [f"leapp_in_{i}" for i in range(len(entry.input_names))]
    out_names = [f"leapp_out_{i}" for i in range(len(entry.output_names))]
    args = _example_inputs(entry)
    program: Any = None
    if backend == "jit":
        module = load("jit", entry.model_path, device="cpu")[0]
    else:
        from ..bundle.safe_load import load_pt2
        program = load_pt2(entry.model_path)
        module = _traced_pt2(program, args) if not _has_control_flow(program) else None
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


def _has_control_flow(program: Any) -> bool:
    """Whether a torch.export program holds higher-order ops (cond, while_loop, ...).

    Tracing runs one branch of those; a straight-line aten graph (what leapp's
    pt2 backend writes) traces exactly.
    """
    return any(node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)
               for node in program.graph.nodes)


def _traced_pt2(program: Any, args: tuple[torch.Tensor, ...]) -> Any:
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
        _fail(f"Node {quote(name)}: its ONNX model uses opset {current} and the fused model "
              f"needs opset {opset}; converting failed ({type(exc).__name__}: "
              f"{quote(str(exc))}). Re-export the node with opset_version={opset}.")
    raise AssertionError("unreachable")


def _node_model(name: str, entry: Any, opset: int) -> tuple[Any, list[str | None], list[str]]:
    """_node_onnx, its failures refused with the node's name and the fix."""
    try:
        return _node_onnx(name, entry, opset)
    except FuseError:
        raise
    except Exception as exc:
        _fail(f"Node {quote(name)} ({entry.backend}, {quote(entry.model_path)}) could not "
              f"be converted to ONNX for the fused model: {type(exc).__name__}: "
              f"{quote(' '.join(str(exc).split()), 400)}. Export the node with "
              "export_with='onnx' and compile again"
              + (", or fuse to format='torchscript'." if entry.backend != "onnx" else "."))


def build_onnx(the_plan: Plan, manager: Any) -> Any:
    """The fused ``onnx.ModelProto`` for ``the_plan``."""
    import onnx
    from onnx import helper, numpy_helper

    from ..compiling.backends.onnx import default_opset

    onnx_opsets = [0]
    for name in the_plan.order:
        entry = manager.nodes[name]
        if entry.backend == "onnx":
            onnx_opsets.append(_ai_onnx_opset(onnx.load(entry.model_path,
                                                         load_external_data=False)))
    opset = max(max(onnx_opsets), default_opset())

    nodes: list[Any] = []
    initializers: list[Any] = []
    value_infos: list[Any] = []
    functions: list[Any] = []
    opsets: dict[str, int] = {"": opset}
    ir_version = 0
    produced: dict[tuple[str, str], str] = {}  # (node, port) -> value name in the fused graph
    models = [_node_model(name, manager.nodes[name], opset) for name in the_plan.order]
    # An exporter may write a newer opset than asked for (torch 2.7's dynamo
    # exporter writes 18 at the least): the fused model takes the newest one,
    # since converting up is what the ONNX version converter does reliably.
    opset = opsets[""] = max([opset] + [_ai_onnx_opset(m[0]) for m in models])
    for index, (name, (model, in_map, out_names)) in enumerate(zip(the_plan.order, models)):
        entry = manager.nodes[name]
        model = _to_opset(name, model, opset)
        if len(out_names) != len(entry.output_names):
            _fail(f"Node {quote(name)}: its model has {len(out_names)} outputs but the bundle "
                  f"declares {len(entry.output_names)} ({quote(entry.output_names)}).")
        prefix = f"n{index}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}::"
        model = onnx.compose.add_prefix(model, prefix)
        graph = model.graph
        ir_version = max(ir_version, model.ir_version)
        for entry_opset in model.opset_import:
            domain = "" if entry_opset.domain == "ai.onnx" else entry_opset.domain
            if domain:
                opsets[domain] = max(opsets.get(domain, 0), int(entry_opset.version))
        for port, graph_input in zip(entry.input_names, in_map):
            if graph_input is None:
                continue  # the exporter dropped it: nothing reads it
            kind, what = the_plan.feeds[name][port]
            target = prefix + graph_input
            if kind in ("input", "state"):
                source = what
            elif kind == "node":
                source = produced[what]
            else:
                source = f"leapp::constant::{index}::{port}"  # outside every prefix
                initializers.append(numpy_helper.from_array(what.numpy(), source))
            nodes.append(helper.make_node("Identity", [source], [target],
                                          name=f"{prefix}feed::{port}"))
        nodes.extend(graph.node)
        initializers.extend(graph.initializer)
        value_infos.extend(graph.value_info)
        functions.extend(model.functions)
        for port, out in zip(entry.output_names, out_names):
            produced[(name, port)] = prefix + out

    outputs = []
    for port, source in zip(the_plan.outputs, the_plan.outputs_from):
        nodes.append(helper.make_node("Identity", [produced[source]], [port.name],
                                      name=f"output::{port.name}"))
        outputs.append(port)
    for state in the_plan.states:
        nodes.append(helper.make_node("Identity", [produced[state.source]], [state.output],
                                      name=f"state::{state.output}"))

    def info(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
        return helper.make_tensor_value_info(name, onnx_type(dtype), list(shape))

    graph = helper.make_graph(
        nodes, f"{the_plan.pipeline}_fused",
        [info(p.name, p.dtype, p.shape) for p in the_plan.inputs]
        + [info(s.input, s.dtype, s.shape) for s in the_plan.states],
        [info(p.name, p.dtype, p.shape) for p in outputs]
        + [info(s.output, s.dtype, s.shape) for s in the_plan.states],
        initializer=initializers, value_info=value_infos)
    fused = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        functions=functions, producer_name="leapp.fuse")
    fused.ir_version = max(ir_version, 8)
    helper.set_model_props(fused, {METADATA_KEY: json.dumps(the_plan.metadata())})
    return fused


def _save_onnx(model: Any, path: str, final: str) -> None:
    """Save to path; large weights go beside it as <final's name>.data."""
    from ..compiling.backends.onnx import save_model
    save_model(model, path, os.path.basename(final) + ".data")


# ---- the TorchScript fused model --------------------------------------------------


class _Pipeline(torch.nn.Module):
    """Runs the nodes in order; traced once into the fused TorchScript module."""

    def __init__(self, the_plan: Plan, modules: dict[str, torch.nn.Module],
                 manager: Any) -> None:
        super().__init__()
        self.plan = the_plan
        self.manager = manager
        self.steps = torch.nn.ModuleDict()
        self._keys = {}
        for i, name in enumerate(the_plan.order):
            key = f"n{i}"
            self.steps[key] = modules[name]
            self._keys[name] = key
        self._constants: dict[tuple[str, str], str] = {}
        for name, feeds in the_plan.feeds.items():
            for port, (kind, what) in feeds.items():
                if kind == "constant":
                    buffer = f"c_{self._keys[name]}_{len(self._constants)}"
                    self.register_buffer(buffer, what)
                    self._constants[(name, port)] = buffer

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        the_plan = self.plan
        values = {p.name: a for p, a in zip(the_plan.inputs, args)}
        values.update({s.input: a for s, a in zip(the_plan.states,
                                                  args[len(the_plan.inputs):])})
        produced: dict[tuple[str, str], torch.Tensor] = {}
        for name in the_plan.order:
            entry = self.manager.nodes[name]
            call_args = []
            for port in entry.input_names:
                kind, what = the_plan.feeds[name][port]
                if kind in ("input", "state"):
                    call_args.append(values[what])
                elif kind == "node":
                    call_args.append(produced[what])
                else:
                    call_args.append(getattr(self, self._constants[(name, port)]))
            result = self.steps[self._keys[name]](*call_args)
            if isinstance(result, torch.Tensor):
                result = (result,)
            for port, value in zip(entry.output_names, result):
                produced[(name, port)] = value
        # every output is a distinct tensor: TorchScript returns them as given
        return tuple([produced[s] for s in the_plan.outputs_from]
                     + [produced[s.source] for s in the_plan.states])


def build_torchscript(the_plan: Plan, manager: Any) -> Any:
    """The fused ``torch.jit.ScriptModule`` for ``the_plan``."""
    from ..bundle.safe_load import load_pt2

    modules: dict[str, torch.nn.Module] = {}
    for name in the_plan.order:
        entry = manager.nodes[name]
        if entry.backend == "jit":
            modules[name] = load("jit", entry.model_path, device="cpu")[0]
        elif entry.backend == "pt2":
            program = load_pt2(entry.model_path)
            if _has_control_flow(program):
                _fail(f"Node {quote(name)} (pt2) holds control flow (torch.cond or a loop), "
                      "which tracing into TorchScript would cut to one branch. Fuse to "
                      "format='onnx' instead.")
            try:
                modules[name] = _traced_pt2(program, _example_inputs(entry))
            except Exception as exc:
                _fail(f"Node {quote(name)} (pt2) could not be traced into TorchScript for the "
                      f"fused model: {type(exc).__name__}: {quote(str(exc), 400)}. Fuse to "
                      "format='onnx' instead.")
        else:
            _fail(f"Node {quote(name)} exists only as an ONNX model ({quote(entry.model_path)}), "
                  "which cannot be turned into TorchScript. Fuse this bundle to format='onnx' "
                  f"(leapp.fuse(..., format='onnx')), or export node {quote(name)} with "
                  "export_with='jit' and compile again.")
    wrapper = _Pipeline(the_plan, modules, manager).eval()
    example = tuple(torch.zeros(p.shape, dtype=p.dtype) for p in the_plan.inputs) + tuple(
        s.initial.clone() for s in the_plan.states)
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, example, check_trace=False, strict=False)
    return traced


# ---- running a fused model --------------------------------------------------------


def read_metadata(path: str) -> dict[str, Any]:
    """The convention's JSON of a fused model (``.onnx`` or TorchScript ``.pt``)."""
    if path.endswith(".onnx"):
        import onnx
        model = onnx.load(path, load_external_data=False)
        for prop in model.metadata_props:
            if prop.key == METADATA_KEY:
                return json.loads(prop.value)
        raise FuseError(f"{quote(path)} carries no {METADATA_KEY!r} metadata: not a fused model")
    extra = {TORCHSCRIPT_EXTRA_FILE: ""}
    torch.jit.load(path, map_location="cpu", _extra_files=extra)
    if not extra[TORCHSCRIPT_EXTRA_FILE]:
        raise FuseError(f"{quote(path)} carries no {TORCHSCRIPT_EXTRA_FILE!r}: not a fused model")
    return json.loads(extra[TORCHSCRIPT_EXTRA_FILE])


def initial_state(metadata: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``{state input name: initial value}`` decoded from the fused model's metadata."""
    from ..bundle.pipeline import torch_dtype
    state = {}
    for entry in metadata["state"]:
        dtype = torch_dtype(entry["dtype"], entry["input"])
        raw = bytearray(base64.b64decode(entry["initial"]["data"]))
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        state[entry["input"]] = flat.reshape(entry["shape"]).clone()
    return state


class FusedModel:
    """Runs a fused model step by step, carrying its state.

    ``FusedModel(path)`` loads a fused ``.onnx`` with onnxruntime (the CUDA
    provider first when onnxruntime has it) or a fused TorchScript ``.pt``,
    both through :func:`leapp.compiling.backends.load.load`, and reads the state
    convention from its metadata.
    ``step(inputs)`` takes ``{"node/port": tensor}`` like
    ``InferenceManager.run_policy`` (every data input, each call) and returns
    the data outputs; ``reset()`` puts the initial state back.
    """

    def __init__(self, path: str, providers: list[str] | None = None) -> None:
        self.path = os.fspath(path)
        self.metadata = read_metadata(self.path)
        if self.metadata.get("batched"):
            raise FuseError(f"{quote(self.path)} is a batched fused model: run it with "
                            "leapp.serving.fleet.FleetRunner")
        self.input_names = [p["name"] for p in self.metadata["inputs"]]
        self.output_names = [p["name"] for p in self.metadata["outputs"]]
        #: the YAML's "node/port" of each output (``step`` returns these keys)
        self.output_keys = [p.get("key", p["name"]) for p in self.metadata["outputs"]]
        self.state_inputs = [s["input"] for s in self.metadata["state"]]
        self.state_outputs = [s["output"] for s in self.metadata["state"]]
        self._initial = initial_state(self.metadata)
        if self.path.endswith(".onnx"):
            from ..compiling.backends.onnx_runner import default_providers

            if providers is None:
                providers = default_providers()
            # InferenceManager's runner: numpy views on CPU, I/O binding for CUDA tensors
            described = self.metadata["outputs"] + [
                {"name": s["output"], "dtype": s["dtype"], "shape": s["shape"]}
                for s in self.metadata["state"]]
            #: "cuda" when onnxruntime runs the model on the GPU (inputs go there)
            self._runner, _, self.device = load(
                "onnx", self.path, input_names=self.input_names + self.state_inputs,
                outputs=described, providers=providers)
            self.session = self._runner.session
            self._run = self._run_onnx
        else:
            self.module, _, self.device = load("jit", self.path, device="cpu")
            self._run = self._run_torchscript
        self.reset()

    def reset(self) -> None:
        """Put every state input back to its initial value."""
        self.state = {name: value.to(self.device, copy=True)
                      for name, value in self._initial.items()}

    def _run_onnx(self, args: list[torch.Tensor]) -> list[Any]:
        if self.device != "cpu":
            args = [a.to(self.device) for a in args]
        return list(self._runner(*args))

    def _run_torchscript(self, args: list[torch.Tensor]) -> list[Any]:
        with torch.no_grad():
            return list(self.module(*args))

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step: the data outputs ``{"node/port": tensor}``; the state advances."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise KeyError(f"FusedModel.step: missing inputs {missing}; every data input "
                           f"({self.input_names}) is needed at each step")
        args = [inputs[n] for n in self.input_names] + [self.state[n] for n in self.state_inputs]
        results = self._run(args)
        count = len(self.output_names)
        self.state = dict(zip(self.state_inputs, results[count:]))
        return dict(zip(self.output_keys, results[:count]))


# ---- validation -------------------------------------------------------------------


def validate(path: str, yaml_path: str | Any, steps: int = VALIDATION_STEPS,
             rtol: float = 1e-3, atol: float = 1e-5, allow_external_paths: bool = False,
             seed: int = 0, shown: str | None = None) -> None:
    """Run the fused model and ``InferenceManager`` side by side for ``steps`` steps.

    ``yaml_path`` is the bundle's YAML (or an ``InferenceManager`` already
    loaded from it, which is reset first).  Both get the same random inputs
    each step; the fused model carries its own state.  Raises
    :class:`FuseError` naming the step and the output (data or state) that
    differs (as ``shown``, where the file is not yet at its final path).
    """
    from ..running.inference_manager import InferenceManager

    shown = path if shown is None else shown
    if isinstance(yaml_path, InferenceManager):
        manager = yaml_path
        manager.reset()
    else:
        manager = InferenceManager(yaml_path, allow_external_paths=allow_external_paths)
    fused = FusedModel(path, providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        inputs = {}
        for name, port in zip(fused.input_names, fused.metadata["inputs"]):
            inputs[name] = _random(tuple(port["shape"]), manager, name, generator)
        expected = manager.run_policy({k: v.clone() for k, v in inputs.items()})
        actual = fused.step(inputs)
        pairs = [(name, expected[name], actual[name]) for name in fused.output_keys]
        for state, entry in zip(fused.state_inputs, fused.metadata["state"]):
            node, port = split_key(state, "fused state")
            # InferenceManager holds the target's next value in its input buffer
            # (or a staging slot): compare with what the fused model carries.
            pairs.append((entry["output"], _next_state(manager, node, port), fused.state[state]))
        for name, want, got in pairs:
            got = got.to(want.device)
            if want.shape != got.shape or want.dtype != got.dtype:
                _fail(f"Fused model {quote(shown)}: step {step}, {quote(name)} is "
                      f"{got.dtype} {tuple(got.shape)} but InferenceManager gives "
                      f"{want.dtype} {tuple(want.shape)}")
            if not _close(want, got, rtol, atol):
                worst = (want.double() - got.double()).abs().max().item() \
                    if want.dtype != torch.bool else float("nan")
                _fail(f"Fused model {quote(shown)} differs from InferenceManager at step "
                      f"{step} on {quote(name)} (largest difference {worst:.3g}, rtol={rtol}, "
                      f"atol={atol}). The bundle was not fused faithfully: please report it.")
    logger.info("Fused model %s matches InferenceManager over %d steps", shown, steps)


def _random(shape: tuple[int, ...], manager: Any, name: str,
            generator: torch.Generator) -> torch.Tensor:
    node, port = split_key(name, "fused input")
    entry = manager.nodes[node]
    dtype = entry.input_dtypes[entry.input_names.index(port)]
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    # 0 or 1: valid as an index or a flag wherever an integer input is one
    return torch.randint(0, 2, shape, generator=generator).to(dtype)


def _next_state(manager: Any, node: str, port: str) -> torch.Tensor:
    # staged feedback is committed after the last node: the target's buffer
    # holds the value the next step will read
    return manager._program.get(manager._slot_of[(node, port)])


def _close(want: torch.Tensor, got: torch.Tensor, rtol: float, atol: float) -> bool:
    if want.dtype.is_floating_point or want.dtype.is_complex:
        return bool(torch.allclose(want.double(), got.double(), rtol=rtol, atol=atol,
                                   equal_nan=True))
    return bool(torch.equal(want, got))


# ---- the YAML record --------------------------------------------------------------


_SECTION = re.compile(r"^\S[^\n]*:[^\n]*$", re.MULTILINE)


def record(yaml_path: str, fused_path: str, format: str) -> None:
    """Write the fused model's path and checksum under the YAML's ``fused`` key.

    The rest of the YAML is kept byte for byte; the file is replaced in one
    rename.  Only a fused model inside the bundle directory is recorded.
    """
    from .. import _core
    bundle = os.path.dirname(os.path.abspath(yaml_path))
    relative = os.path.relpath(os.path.abspath(fused_path), bundle)
    if relative.startswith(os.pardir) or os.path.isabs(relative):
        logger.info("Fused model %s lies outside the bundle: not recorded in its YAML",
                    fused_path)
        return
    with open(yaml_path, encoding="utf-8") as handle:
        text = handle.read()
    current = _recorded(text)
    current[format] = {"model_path": relative, "sha256sum": file_digests(fused_path)[0],
                       "format_version": FORMAT_VERSION}
    text = _without_section(text, YAML_KEY)
    text = text.rstrip("\n") + "\n\n" + _core.emit_yaml([{YAML_KEY: current}])
    fd, tmp = tempfile.mkstemp(prefix=".leapp-fuse-", dir=bundle)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, os.stat(yaml_path).st_mode & 0o7777)
        os.replace(tmp, yaml_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _recorded(text: str) -> dict[str, Any]:
    """The YAML's current ``fused`` entries (only well-formed ones are kept)."""
    import yaml
    section = _section(text, YAML_KEY)
    if section is None:
        return {}
    try:
        value = yaml.safe_load(section)
    except yaml.YAMLError:
        return {}
    entries = value.get(YAML_KEY) if isinstance(value, dict) else None
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if k in FORMATS and isinstance(v, dict)}


def _section(text: str, key: str) -> str | None:
    starts = [m.start() for m in _SECTION.finditer(text)]
    for i, start in enumerate(starts):
        if text.startswith(f"{key}:", start):
            end = starts[i + 1] if i + 1 < len(starts) else len(text)
            return text[start:end]
    return None


def _without_section(text: str, key: str) -> str:
    section = _section(text, key)
    if section is None:
        return text
    start = text.index(section)
    return text[:start] + text[start + len(section):]


# ---- entry point ------------------------------------------------------------------


def fuse(yaml_path: str, out: str | None = None, format: str = "onnx", *,
         validate_steps: int = VALIDATION_STEPS, rtol: float = 1e-3, atol: float = 1e-5,
         allow_external_paths: bool = False, batch: bool = False,
         _shown_dir: str | None = None) -> str:
    """Fuse a compiled bundle into one model that runs one step of the whole pipeline.

    Args:
        yaml_path: the bundle's YAML (as written by ``leapp.compile_graph``).
        out: where to write the fused model; default
            ``<bundle_dir>/<pipeline>_fused.onnx`` (``_fused.pt`` for TorchScript).
        format: ``"onnx"`` or ``"torchscript"``.
        validate_steps: steps the fused model is run next to ``InferenceManager``
            (state carried across) before it is accepted; at least 10.
        rtol, atol: tolerances of that comparison (integers and booleans exact).
        allow_external_paths: as for ``InferenceManager`` (trusted bundles only).
        batch: write the batched model instead (ONNX only; default file
            ``<pipeline>_fused_batched.onnx``, not recorded in the YAML): it steps
            any number of robots at once, every data input, output and state
            robot-major, and is checked robot by robot against one
            ``InferenceManager`` per robot (see ``leapp.serving.fleet``).

    Returns:
        The path of the fused model.  When it lies inside the bundle directory,
        its path and sha256 are recorded in the YAML under ``fused: {<format>: ...}``.

    Raises:
        FuseError: the bundle holds a node that cannot be fused into ``format``
            (named, with the fix), or the fused model does not match
            ``InferenceManager``; nothing is written then.
        BundleError, FileNotFoundError: the bundle itself is unreadable, as for
            ``InferenceManager``.
    """
    from ..running.inference_manager import InferenceManager

    if format not in FORMATS:
        raise ValueError(f"leapp.fuse(format={format!r}): expected one of {sorted(FORMATS)}")
    if batch and format != "onnx":
        raise ValueError(f"leapp.fuse(batch=True, format={format!r}): only the ONNX fused "
                         "model is batched")
    if not isinstance(validate_steps, int) or validate_steps < 10:
        raise ValueError(f"leapp.fuse(validate_steps={validate_steps!r}): at least 10 steps "
                         "are needed to check feedback")
    yaml_path = os.fspath(yaml_path)
    manager = InferenceManager(yaml_path, allow_external_paths=allow_external_paths)
    the_plan = plan(manager)
    if out is None:
        stem = f"{the_plan.pipeline}_fused" + ("_batched" if batch else "")
        out = os.path.join(the_plan.bundle_dir, stem + FORMATS[format])
    out = os.fspath(out)
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    # messages name the final place (compile_graph fuses the bundle it stages)
    shown = out if _shown_dir is None else os.path.join(_shown_dir, os.path.basename(out))
    fd, tmp = tempfile.mkstemp(prefix=".leapp-fuse-", suffix=FORMATS[format], dir=directory)
    os.close(fd)
    from ..bundle import contract as _contract
    contract = _contract.expected(yaml_path, fused=format)  # docs/deploy.md
    try:
        if batch:
            _fuse_batched(the_plan, manager, tmp, out, validate_steps, rtol, atol, shown,
                          allow_external_paths, contract)
        elif format == "onnx":
            fused = build_onnx(the_plan, manager)
            _contract.set_onnx(fused, contract)
            _save_onnx(fused, tmp, out)
            del fused
        else:
            module = build_torchscript(the_plan, manager)
            extra = {TORCHSCRIPT_EXTRA_FILE: json.dumps(the_plan.metadata()),
                     _contract.EXTRA_FILE: _contract.dumps(contract)}
            from ..compiling.backends import save_via_memory
            save_via_memory(lambda h: torch.jit.save(module, h, _extra_files=extra), tmp)
        if not batch:
            validate(tmp, manager, validate_steps, rtol, atol, shown=shown)
        from ..bundle.modes import file_mode
        os.chmod(tmp, file_mode())  # mkstemp's 0600 is no file mode of a bundle
        os.replace(tmp, out)
    except BaseException:
        for leftover in (tmp,):
            if os.path.exists(leftover):
                os.unlink(leftover)
        raise
    logger.info("Fused %d nodes of %s into %s (%d state pairs%s)", len(the_plan.order),
                the_plan.pipeline, shown, len(the_plan.states), ", batched" if batch else "")
    if not batch:
        record(yaml_path, out, format)
    return out


def _fuse_batched(the_plan: Plan, manager: Any, tmp: str, out: str, steps: int, rtol: float,
                  atol: float, shown: str, allow_external_paths: bool,
                  contract: Mapping[str, Any]) -> None:
    """fuse(batch=True): the one-robot model, checked, then batched and checked per robot."""
    from . import batched as _batched
    from ..bundle import contract as _contract
    from ..running.inference_manager import InferenceManager
    single = build_onnx(the_plan, manager)
    _contract.set_onnx(single, contract)
    _save_onnx(single, tmp, out)
    validate(tmp, manager, steps, rtol, atol, shown=shown)
    try:
        batched = _batched.batch_model(single, steps=steps)
    except _batched.BatchError as exc:
        _fail(f"The fused model of {quote(the_plan.pipeline)} cannot be batched: {exc}")
    _contract.set_onnx(batched, contract)
    _save_onnx(batched, tmp, out)
    manager.reset()
    managers = [manager] + [InferenceManager(manager.model_path,
                                             allow_external_paths=allow_external_paths)
                            for _ in range(_batched.CHECK_ROBOTS - 1)]
    problem = _batched.check_per_robot(tmp, read_metadata(tmp), managers, steps,
                                       max(rtol, 1e-4), atol)
    if problem is not None:
        _fail(f"Batched fused model {quote(shown)}: {problem}. The bundle was not batched "
              "faithfully: please report it.")


def fuse_staged(staging: str, bundle: str, graph: str,
                allow_external_paths: bool = False) -> str:
    """compile_graph(fuse=True): fuse the bundle being staged, before its commit."""
    from ..bundle.log import section
    section("Fusing the pipeline into one ONNX model")
    return fuse(os.path.join(staging, f"{graph}.yaml"), format="onnx",
                allow_external_paths=allow_external_paths, _shown_dir=bundle)


__all__ = ["fuse", "FusedModel", "FuseError", "read_metadata", "initial_state", "validate"]
