"""ONNX backends: onnx-dynamo (leapp's ONNX writer, else torch.onnx.export(dynamo=True))
and onnx-torchscript.

For onnx-dynamo (and `onnx`) the node's graph is written by
leapp.compiling.onnx_writer; a node with a call the writer has no rule for goes
through torch's dynamo exporter, and the warning, log.txt and the compile
summary name the call.  LEAPP_ONNX_WRITER=torch sends every node to torch's
exporter.

The ONNX graph's input and output names are the node's YAML port names, in
YAML order.  A name that is both an input and an output of the node (a state
port) becomes `<name>_in` / `<name>_out`, and the new names are returned so the
YAML, the wiring and the initial values follow.  Inputs the exporter removed
are reported and returned as dropped; inputs it renamed are an error.

Validation runs the saved file through InferenceManager's loader.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Sequence

import torch

from .. import export_caches as _export_caches
from .. import fresh_inputs
from ..fresh_inputs import Difference
from ..export_errors import exporter_call
from ...bundle.log import logger
from . import TORCH_EXPORTER, WRITER, ExportContext, Exported, prepare_inputs

# Initialisers above this many bytes go to <node>.onnx.data (protobuf caps a
# single file at 2 GB).
EXTERNAL_DATA_THRESHOLD = 1536 * 1024 * 1024


def default_opset() -> int:
    """The opset torch exports by default (and that the YAML records).

    Read from torch/onnx/_constants.py's text when torch.onnx is not imported yet:
    importing it loads part of torch's exporter, which a node the ONNX writer
    writes never needs."""
    import sys
    if "torch.onnx" not in sys.modules:
        import re
        path = os.path.join(os.path.dirname(torch.__file__), "onnx", "_constants.py")
        try:
            with open(path, encoding="utf-8") as handle:
                found = re.search(r"^ONNX_DEFAULT_OPSET\s*=\s*(\d+)\s*$", handle.read(),
                                  re.MULTILINE)
        except OSError:
            found = None
        if found is not None:
            return int(found.group(1))
    from torch.onnx import _constants
    return int(_constants.ONNX_DEFAULT_OPSET)


# What log.txt says of an onnx-dynamo node: written by the writer, or sent to torch's
# exporter (the test suite's summary counts both).
WRITTEN = "written by leapp's ONNX writer"

FELL_BACK = "exported with torch's ONNX exporter"


def deduplicate_names(node: str, input_names: list[str],
                      output_names: list[str]) -> tuple[list[str], list[str]]:
    """Rename names used on both sides to <name>_in / <name>_out."""
    shared = set(input_names) & set(output_names)
    if not shared:
        return list(input_names), list(output_names)
    taken = set(input_names) | set(output_names)
    for name in sorted(shared):
        clash = [new for new in (f"{name}_in", f"{name}_out") if new in taken]
        if clash:
            raise ValueError(
                f"[{node}] '{name}' is both an input and an output, so the ONNX export names "
                f"them '{name}_in' and '{name}_out', but {clash} is already a port name of "
                f"this node. Rename that port.")
    inputs = [f"{n}_in" if n in shared else n for n in input_names]
    outputs = [f"{n}_out" if n in shared else n for n in output_names]
    return inputs, outputs


def export(node: str, name: str, params: dict, module: torch.fx.GraphModule,
           example_inputs: list[torch.Tensor], input_names: list[str],
           output_names: list[str], out_dir: str, context: ExportContext) -> Exported:
    """Export the node's GraphModule to <out_dir>/<node>.onnx."""
    import onnx

    inputs = tuple(prepare_inputs(example_inputs))
    module = module.eval()
    input_names, output_names = deduplicate_names(node, input_names, output_names)
    opset = params.get("opset_version")
    opset = default_opset() if opset is None else int(opset)
    fallback = None
    difference = None
    with tempfile.TemporaryDirectory(prefix="leapp-onnx-") as tmp:
        proto = None
        if name == "onnx-dynamo":  # leapp's writer first; torch's exporter when it refuses
            proto, fallback, difference = _write(node, module, inputs, input_names,
                                                 output_names, opset, params)
        written = proto is not None
        if proto is None:
            with exporter_call(node, name, module):  # torch's output to log.txt, one clear error
                if name == "onnx-dynamo":
                    proto = _export_dynamo(node, module, inputs, input_names, output_names,
                                           opset, params, context.verbose)
                else:
                    proto = _export_torchscript(module, inputs, input_names, output_names,
                                                opset, params, os.path.join(tmp, "model.onnx"),
                                                context.verbose)
            # torch's model held to eager on fresh inputs too: refused where the writer's
            # differed as well, named where the writer had no part in it
            _check_torch_model(node, name, module, proto, inputs, input_names, output_names,
                               (fallback or "") if difference is not None else None)
        dropped = _sync_inputs(node, proto, input_names)
        _sync_outputs(node, proto, output_names)
        path = os.path.join(out_dir, f"{node}.onnx")
        save_model(proto, path, f"{node}.onnx.data")
    del proto
    try:
        onnx.checker.check_model(path)
    except onnx.checker.ValidationError as exc:  # the file is still useful; the runtime decides
        logger.warning("ONNX model validation warning (model still saved): [%s] %s.onnx breaks "
                       "an ONNX rule: %s", node, node, exc)
    except Exception as exc:  # noqa: BLE001  the check itself failed: said, never hidden
        logger.warning("ONNX model validation warning (model still saved): [%s] the ONNX "
                       "checker could not check %s.onnx (%s: %s); onnxruntime's validation "
                       "of the node still runs", node, node, type(exc).__name__, exc)
    # No session here: validation loads the saved file the way InferenceManager does.
    return Exported(model=None, path=path, yaml_backend="onnx",
                    input_names=input_names, output_names=output_names,
                    parameters={"opset_version": opset}, dropped_inputs=dropped,
                    fallback=fallback, writer=WRITER if written else TORCH_EXPORTER)


def _write(node: str, module: torch.fx.GraphModule, inputs: tuple, input_names: list[str],
           output_names: list[str], opset: int, params: dict
           ) -> tuple[Any, str | None, Difference | None]:
    """(the writer's model, None, None), or (None, why, the difference) when this node
    goes to torch's exporter: the writer has no rule, onnxruntime cannot load its
    model, or its model parts from eager on fresh inputs (the difference, on which
    torch's exporter's model is then checked too)."""
    from .. import onnx_writer
    from ..._version import __version__

    if not onnx_writer.enabled():
        return None, None, None  # chosen by the user: not a fallback
    torch_only = [k for k in ("verify", "report") if params.get(k)]
    difference = None
    if torch_only:
        reason = f"backend_params {torch_only} ask for torch's exporter"
    else:
        try:
            origins: dict = {}
            model = onnx_writer.write_model(node, module, list(inputs), input_names,
                                            output_names, opset, __version__, origins)
            session, reason = _session(model)
            if session is not None:
                difference = _fresh_difference(module, session, inputs, input_names,
                                               output_names, tie_ordered=_tie_ordered(origins))
                if difference is None:
                    logger.debug("[%s] %s", node, WRITTEN)
                    return model, None, None
                reason = _difference_reason(model, module, origins, difference, input_names)
        except onnx_writer.NoRule as exc:
            reason = str(exc)
        except Exception as exc:  # a writer bug must not cost the user the export
            reason = f"the ONNX writer failed: {type(exc).__name__}: {exc}"
    logger.warning("[%s] %s: %s (set %s=torch to use it for every node)", node, FELL_BACK,
                   reason, onnx_writer.ENV)
    return None, reason, difference


def _session(model: Any) -> tuple[Any, str | None]:
    """(an onnxruntime session of the model, None), or (None, why onnxruntime cannot
    load it: a kernel it lacks for a type, say): a written model it refuses goes to
    torch's exporter rather than failing validation."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # the refusal is reported here, once
    try:
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]), None
    except Exception as exc:  # noqa: BLE001  onnxruntime's own refusal
        return None, ("onnxruntime cannot load the written model: "
                      f"{' '.join(str(exc).split())[:300]}")


def _checkable(module: torch.fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Whether fresh inputs can check the node: no random op (eager's draws differ
    from any export's), inputs onnxruntime takes from NumPy (no bfloat16)."""
    from ..onnx_writer.emit import may_draw_random
    if any(n.op == "call_function" and may_draw_random(n.target) for n in module.graph.nodes):
        return False
    return not any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in inputs)


def _tie_ordered(origins: dict) -> set[str]:
    """The written values that are topk's indices: their order among equal values is
    eager's kernel's, which follows no rule (fresh_inputs.first_difference)."""
    from ..onnx_writer.emit import rule_key
    return {name for name, (node, path) in origins.items()
            if path == (1,) and node.op in ("call_function", "call_method")
            and rule_key(node) == "topk"}


def _fresh_difference(module: torch.fx.GraphModule, session: Any, inputs: Sequence[Any],
                      input_names: list[str], output_names: list[str],
                      reference: Any = None, tie_ordered: set[str] = frozenset()
                      ) -> Difference | None:
    """How the session's model parts from eager (the module, or the callable it was
    traced from) on inputs the trace never drew (leapp.compiling.fresh_inputs), or
    None."""
    if not _checkable(module, inputs):
        return None
    fed = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    order = [names.index(n) for n in output_names]

    def run(draw: Sequence[Any]) -> list:
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(input_names, draw) if n in fed}
        got = session.run(None, feeds)
        return [torch.from_numpy(got[i]) for i in order]

    return fresh_inputs.first_difference(module if reference is None else reference, run,
                                         inputs, output_names, tie_ordered=tie_ordered)


def _difference_reason(model: Any, module: torch.fx.GraphModule, origins: dict,
                       difference: Difference, input_names: list[str]) -> str:
    """'its torch.fmax differs from eager on an input with NaN (x): output ...'."""
    from .. import onnx_writer
    from ..onnx_writer.emit import op_label

    def differs(got: torch.Tensor, want: torch.Tensor) -> str:
        return fresh_inputs.compare(got, want, difference.draw.kind)

    try:
        culprit = onnx_writer.locate(model, module, list(difference.draw.inputs), origins,
                                     differs)
    except Exception:  # noqa: BLE001  locating is a courtesy: the difference stands
        culprit = None
    what = f"its {op_label(culprit)}" if culprit is not None else "its model"
    return f"{what} differs from eager {difference.describe(input_names)}"


#: what log.txt and the warning say of a model of torch's exporter that differs from eager
#: on fresh inputs, where leapp's writer had no part in it (bench/opinfo counts it named)
TORCH_MODEL_DIFFERS = "its ONNX model, written by torch's ONNX exporter, differs from eager"


def _check_torch_model(node: str, backend: str, module: torch.fx.GraphModule, proto: Any,
                       inputs: Sequence[Any], input_names: list[str],
                       output_names: list[str], writer_reason: str | None) -> None:
    """torch's exporter's model against eager on fresh inputs.  Where the writer's model
    differed too (writer_reason), no ONNX model of this node is exact: an ExportError
    (compile_graph then names the backends that are).  Where the writer had no part
    (no rule, LEAPP_ONNX_WRITER=torch, onnx-torchscript): a warning naming the input and
    the output, and the backends that compute as eager does there."""
    from ..export_errors import compose

    if not _checkable(module, inputs):
        return
    session, _ = _session(proto)
    if session is None:
        return  # validation reports what onnxruntime says of it
    difference = _fresh_difference(module, session, inputs, input_names, output_names)
    if difference is None:
        return
    if writer_reason is None:
        logger.warning("[%s] %s %s; export_with='jit' or 'pt2' computes as eager does "
                       "there", node, TORCH_MODEL_DIFFERS, difference.describe(input_names))
        return
    op = writer_reason.split(" differs from eager")[0].removeprefix("its ")
    raise compose(node, backend, None if op == "model" else op, (), (
        f"leapp's ONNX writer's model and torch's ONNX exporter's both part from eager: "
        f"the writer's: {writer_reason.removeprefix('its ')}; torch's exporter's model "
        f"differs from eager {difference.describe(input_names)}"),
        "export this node with a backend that is exact on such inputs, or keep such "
        "values out of the node's inputs", None)


def differs_from_eager(model: Any, module: torch.fx.GraphModule, inputs: Sequence[Any],
                       input_names: list[str], output_names: list[str],
                       reference: Any = None) -> str | None:
    """Why a written ONNX model does not stand for the module (or the callable it was
    traced from, reference) on inputs the trace never drew: onnxruntime refuses to load
    or run it, or a fresh input's outputs part from eager's; None when it computes as
    eager does.  The check every written node passes, for callables written elsewhere
    (leapp.compiling.onnx_callable)."""
    session, unloadable = _session(model)
    if session is None:
        return unloadable
    try:
        difference = _fresh_difference(module, session, inputs, input_names, output_names,
                                       reference=reference)
    except Exception as exc:  # noqa: BLE001  a model onnxruntime cannot run
        return (f"onnxruntime could not run the written model: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    if difference is not None:
        return f"the written model differs from the callable {difference.describe(input_names)}"
    return None


def _export_dynamo(node: str, module: torch.fx.GraphModule, inputs: tuple,
                   input_names: list[str], output_names: list[str], opset: int,
                   params: dict, verbose: bool) -> Any:
    """torch.onnx.export(dynamo=True) (its registry and tables built once per
    process: leapp.compiling.export_caches), then name the graph's inputs and outputs.

    The names are set here rather than by the exporter, which renames values in
    place and so can collide with the exporter's own value names (an output
    called 'add' or 'gt' next to the Add / Greater node's result).
    """
    program = _export_caches.export_dynamo(
        module, inputs, opset=opset, verbose=verbose,
        verify=bool(params.get("verify", False)), optimize=bool(params.get("optimize", True)),
        report=bool(params.get("report", False)))
    placeholders = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    _name_ir_graph(node, program.model.graph, placeholders, input_names, output_names)
    return program.model_proto


def _name_ir_graph(node: str, graph: Any, placeholders: list[str], input_names: list[str],
                   output_names: list[str]) -> None:
    """Give the onnx_ir graph's inputs and outputs the node's port names."""
    import onnx_ir as ir

    graph_inputs = list(graph.inputs)
    if len(graph_inputs) == len(input_names):  # every input kept: positional
        wanted = dict(zip(graph_inputs, input_names))
    else:
        by_placeholder = dict(zip(placeholders, input_names))
        unknown = [v.name for v in graph_inputs if v.name not in by_placeholder]
        if unknown:
            missing = [n for p, n in by_placeholder.items()
                       if p not in {v.name for v in graph_inputs}]
            _renamed_error(node, missing, unknown)
        wanted = {v: by_placeholder[v.name] for v in graph_inputs}
    if len(graph.outputs) != len(output_names):
        raise RuntimeError(f"[{node}] ONNX export produced {len(graph.outputs)} outputs but the "
                           f"node declares {len(output_names)}: {output_names}")
    for index, value in enumerate(list(graph.outputs)):
        if value in wanted:  # an input returned as is, or one value returned twice
            identity = ir.Node("", "Identity", inputs=[value], num_outputs=1)
            graph.append(identity)
            value = identity.outputs[0]
            graph.outputs[index] = value
        wanted[value] = output_names[index]
    names: dict[str, Any] = {}
    for value in list(graph.inputs) + list(graph.initializers.values()):
        names[value.name] = value
    for ir_node in ir.traversal.RecursiveGraphIterator(graph):
        for value in ir_node.outputs:
            names[value.name] = value
    for value, name in wanted.items():
        holder = names.get(name)
        if holder is not None and holder is not value:
            k = 1
            while f"{name}_{k}" in names:
                k += 1
            names.pop(name)
            holder.name = f"{name}_{k}"
            names[holder.name] = holder
        names.pop(value.name, None)
        value.name = name
        names[name] = value


def _renamed_error(node: str, missing: list[str], renamed: list[str]) -> None:
    raise RuntimeError(
        f"[{node}] ONNX export renamed inputs: {missing} became {renamed}. This typically "
        f"happens with identity/passthrough functions with onnx-dynamo: an input returned "
        f"unchanged takes the output's name. Compute the output from the input (e.g. "
        f"x.clone()) or export this node with export_with='onnx-torchscript' or 'jit'.")


def _export_torchscript(module: torch.nn.Module, inputs: tuple, input_names: list[str],
                        output_names: list[str], opset: int, params: dict,
                        tmp_path: str, verbose: bool) -> Any:
    import onnx

    model: Any = module
    if params.get("prescript"):
        from .jit import torchscript_enabled
        with torchscript_enabled():
            model = torch.jit.script(module)
    torch.onnx.export(model, inputs, tmp_path, dynamo=False, input_names=input_names,
                      output_names=output_names, opset_version=opset,
                      verbose=verbose or bool(params.get("report", False)))
    return onnx.load(tmp_path)


def _graph_inputs(proto: Any) -> list[str]:
    initializers = {t.name for t in proto.graph.initializer}
    return [v.name for v in proto.graph.input if v.name not in initializers]


def _reorder(values: Any, order: Sequence[str]) -> None:
    """Put the repeated ValueInfo field `values` in `order` (others keep their place after)."""
    rank = {name: i for i, name in enumerate(order)}
    items = list(values)
    items.sort(key=lambda v: rank.get(v.name, len(rank)))
    copies = [type(v)() for v in items]
    for copy, item in zip(copies, items):
        copy.CopyFrom(item)
    del values[:]
    values.extend(copies)


def _sync_inputs(node: str, proto: Any, input_names: list[str]) -> list[str]:
    """Check the exported graph's inputs against the node's; returns those it dropped."""
    actual = _graph_inputs(proto)
    renamed = [n for n in actual if n not in input_names]
    if renamed:
        _renamed_error(node, [n for n in input_names if n not in actual], renamed)
    dropped = [n for n in input_names if n not in actual]
    if dropped:
        logger.warning("[%s] ONNX export optimized away %d inputs: %s. They do not affect the "
                       "outputs and are removed from the node's inputs in the YAML.",
                       node, len(dropped), dropped)
    _reorder(proto.graph.input, input_names)
    return dropped


def _sync_outputs(node: str, proto: Any, output_names: list[str]) -> None:
    actual = [v.name for v in proto.graph.output]
    if sorted(actual) != sorted(output_names):
        raise RuntimeError(
            f"[{node}] ONNX export produced outputs {actual} but the node declares "
            f"{output_names}. Export this node with another backend or return distinct "
            f"computed tensors.")
    _reorder(proto.graph.output, output_names)


def _initializer_bytes(proto: Any) -> int:
    total = 0
    for tensor in proto.graph.initializer:
        if tensor.raw_data:
            total += len(tensor.raw_data)
        else:
            total += 8 * max(len(tensor.float_data), len(tensor.int32_data),
                             len(tensor.int64_data), len(tensor.double_data),
                             len(tensor.uint64_data))
    return total


def save_model(proto: Any, path: str, data_name: str) -> None:
    """Save proto to path; initialisers over EXTERNAL_DATA_THRESHOLD bytes in all go to
    data_name beside it (a node's model and the fused model alike)."""
    import onnx

    if _initializer_bytes(proto) > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
    else:
        onnx.save_model(proto, path)
