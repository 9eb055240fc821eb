"""Triton Inference Server model repositories from a bundle: ``leapp triton``.

``write_repository(yaml_path, repo_dir)`` writes a directory that
``tritonserver --model-repository=repo_dir`` serves as it is:

* a **feed-forward** bundle (no ``feedback_flow``) becomes one model per node
  and an ``ensemble`` named after the pipeline that wires them as
  ``data_flow`` says; clients call the ensemble with the graph inputs and get
  the graph outputs, each named ``"<node>/<port>"`` as in the YAML;
* a bundle **with feedback** becomes one sequence model, named after the
  pipeline, that runs the fused model (``leapp.fuse``) under Triton's sequence
  batcher: each client (correlation ID) keeps its own recurrent state on the
  server, starting from the bundle's initial values.

``serve_with="native"`` (the default) uses Triton's own backends where they
exist (``onnxruntime`` for ONNX, ``pytorch`` for TorchScript; pt2 nodes run in
the ``python`` backend) and the sequence batcher's implicit state;
``serve_with="python"`` runs every model in the python backend, which is what
a server without the native backends (the ``nvidia-pytriton`` wheel's) can
serve.  The configs are built as ``tritonclient``'s ``ModelConfig`` protobuf
messages and written in protobuf text format.  docs/triton.md has the layout,
the names and the environment the python backend needs.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..bundle.modes import directory_mode
from ..bundle.pipeline import FORWARD, Node, Pipeline, join_key
from .triton_config import (SPEC_FILE, TensorSpec, TritonRepositoryError,  # noqa: F401
                            add_tensor, checked_ports, config_module, config_text, dims,
                            model_config, model_name, read_config, triton_types, write_model)

logger = logging.getLogger("leapp")

#: Accepted values of ``serve_with``.
SERVE_WITH = ("native", "python")
#: Control inputs of a python-backend sequence model (sequence start, end, correlation ID).
CONTROL_INPUTS = ("START", "END", "CORRID")
#: Robots served at once when no fleet size is given.
DEFAULT_FLEET_SIZE = 128
#: Largest fleet size a repository is written for (see docs/triton.md, "Fleet size").
MAX_FLEET_SIZE = 128
#: How long the batcher waits to fill a batch, by default (microseconds).
DEFAULT_QUEUE_DELAY_US = 1000
#: Accepted values of ``instances``.
INSTANCE_KINDS = ("cpu", "gpu")


@dataclass
class TritonRepository:
    """What ``write_repository`` wrote.

    Attributes:
        path: the repository directory.
        entry: the model clients call (the ensemble, or the sequence model).
        sequence: whether ``entry`` is a sequence model (send a correlation ID,
            ``sequence_start`` on a client's first request).
        models: every model directory written, ``entry`` included.
        inputs, outputs: ``{tensor name: (Triton datatype, shape)}`` of ``entry``.
    """

    path: str
    entry: str
    sequence: bool
    models: list[str] = field(default_factory=list)
    inputs: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    outputs: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    #: robots one request batch may hold (the config's ``max_batch_size``); 0: not batched
    max_batch_size: int = 0
    #: robots served at once (sequence models)
    fleet_size: int = 0


# ---- feed-forward: one model per node + an ensemble ----------------------------------------

def _node_model(staging: str, yaml_dir: str, spec: Node, name: str,
                serve_with: str) -> tuple[dict[str, str], dict[str, str]]:
    """Write one node's model; ``({port: model tensor name} for inputs, ... for outputs)``."""
    from ..bundle.safe_load import bundle_file
    node, backend = spec.name, spec.backend
    if backend not in ("onnx", "jit", "pt2"):
        raise TritonRepositoryError(
            f"node {node!r} has backend {backend!r}: Triton can serve nodes exported with "
            "onnx, jit or pt2; export it with one of them")
    inputs = checked_ports(spec.inputs, node, "inputs")
    outputs = checked_ports(spec.outputs, node, "outputs")
    model_file = bundle_file(yaml_dir, spec.model_path, f"model file of node {node!r}")
    if serve_with == "native" and backend in ("onnx", "jit"):
        if backend == "onnx":
            # onnxruntime matches the config's tensors to the model's by name (the port names)
            in_names = {p.name: p.name for p in inputs}
            out_names = {p.name: p.name for p in outputs}
            config = model_config(name, "onnxruntime", [(p.name, p) for p in inputs],
                                   [(p.name, p) for p in outputs])
            config.default_model_filename = "model.onnx"
            write_model(staging, name, config, {"model.onnx": model_file})
        else:
            # the pytorch backend binds tensors by position: INPUT__i / OUTPUT__i
            in_names = {p.name: f"INPUT__{i}" for i, p in enumerate(inputs)}
            out_names = {p.name: f"OUTPUT__{i}" for i, p in enumerate(outputs)}
            config = model_config(name, "pytorch", [(in_names[p.name], p) for p in inputs],
                                   [(out_names[p.name], p) for p in outputs])
            config.default_model_filename = "model.pt"
            write_model(staging, name, config, {"model.pt": model_file})
        return in_names, out_names
    in_names = {p.name: p.name for p in inputs}
    out_names = {p.name: p.name for p in outputs}
    config = model_config(name, "python", [(p.name, p) for p in inputs],
                           [(p.name, p) for p in outputs])
    local = os.path.basename(model_file)
    entry = spec.to_entry()
    entry["parameters"]["model_path"] = local
    write_model(staging, name, config, {local: model_file},
                 {"kind": "node", "name": name, "node": node, "description": entry})
    return in_names, out_names


def _feed_forward(staging: str, yaml_dir: str, graph: str, model: Pipeline, serve_with: str,
                  result: TritonRepository) -> None:
    graph_inputs, graph_outputs = model.inputs, model.outputs
    tensor_of = model.output_names()  # "__out" where an output is named like a graph input

    # what feeds each node input is the pipeline model's answer (Pipeline.feeds)
    feeds = model.feeds()
    fed = {join_key(node, port): tensor_of[fed_by[0].source]
           for node, ports in feeds.items() for port, fed_by in ports.items()
           if fed_by[0].kind == FORWARD}
    consumed = {feed.source for ports in feeds.values() for fed_by in ports.values()
                for feed in fed_by if feed.kind == FORWARD} | set(graph_outputs)
    taken: set[str] = set()
    entry = model_name(graph, taken)
    mc = config_module()
    ensemble = mc.ModelConfig(name=entry, platform="ensemble", max_batch_size=0)
    for node in model.run_order:
        name = model_name(f"{graph}.{node}", taken)
        in_names, out_names = _node_model(staging, yaml_dir, model.nodes[node], name,
                                          serve_with)
        result.models.append(name)
        step = ensemble.ensemble_scheduling.step.add()
        step.model_name, step.model_version = name, -1
        for port, tensor in in_names.items():
            key = f"{node}/{port}"
            source = fed.get(key, key if (node, port) in graph_inputs else None)
            if source is None:
                raise TritonRepositoryError(
                    f"node {node!r}, input {port!r}: neither a graph input nor fed by "
                    "data_flow, so the ensemble cannot supply it; recompile the bundle")
            step.input_map[tensor] = source
        for port, tensor in out_names.items():
            if (node, port) in consumed:
                step.output_map[tensor] = tensor_of[(node, port)]
    for node, name in graph_inputs:
        key, port = join_key(node, name), model.nodes[node].input(name)
        add_tensor(ensemble.input.add(), key, port)
        result.inputs[key] = (triton_types(port.dtype, key)[1], dims(port))
    for node, name in graph_outputs:
        key, port = join_key(node, name), model.nodes[node].output(name)
        add_tensor(ensemble.output.add(), tensor_of[(node, name)], port)
        result.outputs[tensor_of[(node, name)]] = (triton_types(port.dtype, key)[1], dims(port))
    write_model(staging, entry, ensemble)
    result.models.append(entry)
    result.entry = entry


# ---- feedback: the fused model under the sequence batcher ----------------------------------

def _recorded_fused(yaml_path: str, recorded: Any) -> str | None:
    """The fused ONNX the YAML records (``compile_graph(fuse=True)``), if its sha256 holds."""
    from ..bundle.safe_load import bundle_file_sha256
    entry = (recorded or {}).get("onnx") if isinstance(recorded, Mapping) else None
    if not isinstance(entry, Mapping) or entry.get("format_version") != 1:
        return None
    try:
        path, sha256 = bundle_file_sha256(os.path.dirname(os.path.abspath(yaml_path)),
                                          entry.get("model_path"), "recorded fused model")
    except (OSError, ValueError):
        return None
    if sha256 != entry.get("sha256sum"):
        logger.warning("The fused model recorded in %s does not match its sha256; fusing the "
                       "bundle again for the Triton repository", yaml_path)
        return None
    return path


def _implicit_state(staging: str, name: str, batching: Any,
                    states: list[dict[str, Any]]) -> None:
    """Triton's implicit state, one entry per feedback pair, initial values from files."""
    import base64
    mc = config_module()
    for i, entry in enumerate(states):
        port = TensorSpec(entry["input"], entry["dtype"], tuple(entry["shape"]))
        # the bundle's initial value, raw little-endian bytes, for Triton's implicit state
        file_name = f"state_{i}.bin"
        os.makedirs(os.path.join(staging, name, "initial_state"), exist_ok=True)
        with open(os.path.join(staging, name, "initial_state", file_name), "wb") as handle:
            handle.write(base64.b64decode(entry["initial"]["data"]))
        state = batching.state.add()
        state.input_name, state.output_name = entry["input"], entry["output"]
        state.data_type = getattr(mc, triton_types(port.dtype, port.name)[0])
        state.dims.extend(dims(port))
        initial = state.initial_state.add()
        initial.data_type = state.data_type
        initial.dims.extend(dims(port))
        initial.name = f"initial_{i}"
        initial.data_file = file_name


def _control_inputs(batching: Any) -> None:
    """START / END / CORRID: what a python model needs to keep each robot's state."""
    mc = config_module()
    kinds = {"START": mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
             "END": mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END}
    for control_name, kind in kinds.items():
        control_input = batching.control_input.add()
        control_input.name = control_name
        control = control_input.control.add()
        control.kind = kind
        control.int32_false_true.extend([0, 1])
    corrid = batching.control_input.add()
    corrid.name = "CORRID"
    control = corrid.control.add()
    control.kind = mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
    control.data_type = mc.TYPE_UINT64


def _sequence(staging: str, yaml_path: str, graph: str, fused_model: str | None,
              recorded: Any, serve_with: str, max_sequences: int, idle_seconds: float,
              result: TritonRepository, fleet: Mapping[str, Any] | None = None) -> None:
    from .fusion import fuse, read_metadata
    name = model_name(graph, set())
    if fused_model is None:
        fused_model = _recorded_fused(yaml_path, recorded)
    if fused_model is None:
        # fused next to the staged repository, so the bundle (and its YAML) stays untouched
        fused_model = fuse(yaml_path, out=os.path.join(staging, f".{name}_fused.onnx"))
    metadata = read_metadata(fused_model)
    if metadata.get("pipeline") != graph:
        raise TritonRepositoryError(
            f"fused model {fused_model} is of pipeline {metadata.get('pipeline')!r}, not "
            f"{graph!r}; give the bundle's own fused model (leapp.fuse({yaml_path!r}))")
    batched = _batched_model(staging, fused_model) if fleet is not None else None
    if batched is not None:
        _fleet(staging, name, batched, serve_with, result=result, idle_seconds=idle_seconds,
               **fleet)
        return
    suffix = ".onnx" if fused_model.endswith(".onnx") else ".pt"
    data_in = [(p["name"], TensorSpec(p["name"], p["dtype"], tuple(p["shape"])))
               for p in metadata["inputs"]]
    data_out = [(p["name"], TensorSpec(p["name"], p["dtype"], tuple(p["shape"])))
                for p in metadata["outputs"]]
    for tensor, port in data_in + data_out:
        triton_types(port.dtype, f"fused model {tensor!r}")
    native = serve_with == "native" and suffix == ".onnx"
    config = model_config(name, "onnxruntime" if native else "python", data_in, data_out)
    batching = config.sequence_batching
    batching.max_sequence_idle_microseconds = int(idle_seconds * 1e6)
    # oldest: one instance interleaves up to max_sequences robots without a batch dimension
    batching.oldest.max_candidate_sequences = max_sequences
    for entry in metadata["state"]:
        triton_types(entry["dtype"], f"fused model state {entry['input']!r}")
    if native:
        _implicit_state(staging, name, batching, metadata["state"])
        config.default_model_filename = "model.onnx"
        write_model(staging, name, config, {"model.onnx": fused_model})
    else:
        _control_inputs(batching)
        model_file = "fused" + suffix
        write_model(staging, name, config, {model_file: fused_model},
                     {"kind": "sequence", "name": name, "model_file": model_file})
    result.models.append(name)
    result.entry = name
    result.sequence = True
    result.fleet_size = max_sequences
    result.inputs.update({t: (triton_types(p.dtype, t)[1], dims(p)) for t, p in data_in})
    result.outputs.update({t: (triton_types(p.dtype, t)[1], dims(p)) for t, p in data_out})


# ---- batched: the batched fused model, one onnxruntime run for many robots -----------------

def _batched_model(staging: str, fused_model: str) -> tuple[str, dict[str, Any]] | None:
    """The batched fused ONNX of ``fused_model`` (staged), or None where it cannot batch."""
    import onnx

    from .batched import BatchError, batch_model
    from .fused_onnx import save_onnx
    from .fusion import read_metadata
    if not fused_model.endswith(".onnx"):
        logger.info("A TorchScript fused model is not batched: serving it one robot per "
                    "request (fuse to ONNX for a batched repository)")
        return None
    try:
        batched = batch_model(onnx.load(fused_model))
    except BatchError as exc:
        logger.warning("The fused model cannot step several robots at once, so the Triton "
                       "repository serves one robot per request: %s", exc)
        return None
    path = os.path.join(staging, ".batched.onnx")
    save_onnx(batched, path, path)
    metadata = read_metadata(path)
    from .batched import robot_major_shape
    scalar = [p["name"] for p in metadata["inputs"] if not robot_major_shape(p)]
    if scalar:
        # Triton writes a batched [robots] tensor as dims [1]: the robot would have to send
        # [1, 1] where it sends [1] today
        logger.warning("Input %r has shape [1]: a batched Triton model would take it as "
                       "[1, 1], so the repository serves one robot per request", scalar[0])
        return None
    return path, metadata


def _candidates(fleet_size: int, native: bool) -> int:
    # the python model refuses a robot beyond the fleet: it must see that robot's first
    # request, so the batcher admits a few more sequences than the fleet holds
    return fleet_size if native else fleet_size + max(8, fleet_size // 8)


def _fleet(staging: str, name: str, batched: tuple[str, dict[str, Any]], serve_with: str,
           fleet_size: int, idle_seconds: float, queue_delay_us: int, instances: str,
           result: TritonRepository) -> None:
    """One model running the batched fused model under Triton's batching."""
    from .batched import robot_major_shape
    path, metadata = batched
    mc = config_module()
    native = serve_with == "native"

    def ports(entries: list[dict[str, Any]]) -> list[tuple[str, TensorSpec]]:
        return [(p["name"], TensorSpec(p["name"], p["dtype"], tuple(robot_major_shape(p))))
                for p in entries]

    data_in, data_out = ports(metadata["inputs"]), ports(metadata["outputs"])
    for tensor, port in data_in + data_out:
        triton_types(port.dtype, f"fused model {tensor!r}")
    config = model_config(name, "onnxruntime" if native else "python", data_in, data_out,
                           max_batch_size=fleet_size, instances=instances)
    sequence = bool(metadata["state"])
    if sequence:
        batching = config.sequence_batching
        batching.max_sequence_idle_microseconds = int(idle_seconds * 1e6)
        batching.oldest.max_candidate_sequences = _candidates(fleet_size, native)
        batching.oldest.max_queue_delay_microseconds = queue_delay_us
        if native:
            _implicit_state(staging, name, batching, [
                dict(s, shape=robot_major_shape(s)) for s in metadata["state"]])
        else:
            _control_inputs(batching)
    else:
        config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    if native:
        config.default_model_filename = "model.onnx"
        write_model(staging, name, config, {"model.onnx": path})
    else:
        model_file = "fused_batched.onnx"
        write_model(staging, name, config, {model_file: path},
                     {"kind": "fleet", "name": name, "model_file": model_file,
                      "fleet_size": fleet_size})
    result.models.append(name)
    result.entry = name
    result.sequence = sequence
    result.max_batch_size = fleet_size
    result.fleet_size = fleet_size if sequence else 0
    # what one robot sends and gets: its row, with a leading dimension of 1 (an output
    # whose bundle shape has none, a static one say, gets one: see docs/triton.md)
    result.inputs.update({t: (triton_types(p.dtype, t)[1], [1] + dims(p)) for t, p in data_in})
    result.outputs.update({t: (triton_types(p.dtype, t)[1], [1] + dims(p)) for t, p in data_out})


def _feed_forward_fused(staging: str, yaml_path: str, graph: str, model: Pipeline,
                        serve_with: str, fleet: Mapping[str, Any],
                        result: TritonRepository) -> bool:
    """A feed-forward bundle as one batched fused model; False where it cannot be one."""
    from .fusion import FuseError, fuse
    for node in model.run_order:  # a tensor Triton has no type for: named before fusing
        checked_ports(model.nodes[node].inputs, node, "inputs")
        checked_ports(model.nodes[node].outputs, node, "outputs")
    name = model_name(graph, set())
    try:
        single = fuse(yaml_path, out=os.path.join(staging, f".{name}_fused.onnx"))
    except FuseError as exc:
        logger.warning("The bundle cannot be fused, so the Triton repository is an ensemble "
                       "of one model per node: %s", exc)
        return False
    batched = _batched_model(staging, single)
    if batched is None:
        return False
    _fleet(staging, name, batched, serve_with, idle_seconds=0.0, result=result, **fleet)
    return True


# ---- the public entry point ----------------------------------------------------------------

def write_repository(yaml_path: str, repo_dir: str, *, serve_with: str = "native",
                     fused_model: str | None = None, max_sequences: int | None = None,
                     sequence_idle_seconds: float = 60.0, batch: bool = True,
                     fleet_size: int | None = None,
                     queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
                     instances: str = "cpu") -> TritonRepository:
    """Write a Triton model repository that serves the bundle.

    Args:
        yaml_path: the bundle's YAML, as written by ``leapp.compile_graph``.
        repo_dir: the repository to create; it must not exist or be empty.  It is
            built beside itself and renamed into place, so an error leaves nothing.
        serve_with: ``"native"``: Triton's onnxruntime / pytorch backends (and
            implicit state) where they apply, the python backend for pt2 nodes and
            a TorchScript fused model; ``"python"``: every model in the python
            backend, which needs leapp installed where ``tritonserver`` runs.
        fused_model: a fused model of the bundle (``leapp.fuse``) for a bundle with
            feedback; by default the fused ONNX the YAML records (its sha256 checked),
            else the bundle is fused for the repository, leaving the bundle itself
            untouched.  Ignored for feed-forward bundles.
        max_sequences: the older name of ``fleet_size`` (one of the two, or neither).
        sequence_idle_seconds: a sequence idle this long is dropped by the server.
        batch: serve the batched fused model (``leapp.fuse(..., batch=True)``): many
            robots per model execution, ``max_batch_size`` the fleet size, the
            ``oldest`` sequence strategy (or dynamic batching for a feed-forward
            bundle) with a ``queue_delay_us`` wait.  A bundle whose fused model
            cannot batch (no leading dimension of 1) is served one robot per
            request, as with ``batch=False``, which also keeps a feed-forward
            bundle an ensemble of one model per node.
        fleet_size: robots served at once (default :data:`DEFAULT_FLEET_SIZE`, at most
            :data:`MAX_FLEET_SIZE`); the python backend refuses a robot beyond it at
            its first request.
        queue_delay_us: how long the batcher waits for more robots to fill a batch.
        instances: ``"cpu"`` or ``"gpu"``: the kind of the model's instance group.

    Returns:
        A :class:`TritonRepository` naming the model to call and its tensors.

    Raises:
        TritonRepositoryError: a node or tensor Triton cannot serve (named, with the fix).
        FileExistsError: ``repo_dir`` holds files already.
    """
    size, fleet = _fleet_options(serve_with, max_sequences, fleet_size, queue_delay_us,
                                 instances, batch)
    yaml_path = os.fspath(yaml_path)
    repo_dir = os.path.abspath(os.fspath(repo_dir))
    bundle, model = _read_pipeline(yaml_path)
    if os.path.isdir(repo_dir) and os.listdir(repo_dir):
        raise FileExistsError(f"{repo_dir} is not empty; give a new or empty directory for the "
                              "Triton repository")
    graph = os.path.splitext(os.path.basename(yaml_path))[0]
    parent = os.path.dirname(repo_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".leapp-triton-", dir=parent)
    result = TritonRepository(path=repo_dir, entry="", sequence=False)
    try:
        if any(model.feedback_edges()):
            _sequence(staging, yaml_path, graph, fused_model, bundle.get("fused"), serve_with,
                      size, sequence_idle_seconds, result, fleet)
        elif fleet is None or not _feed_forward_fused(staging, yaml_path, graph, model,
                                                      serve_with, fleet, result):
            _feed_forward(staging, os.path.dirname(os.path.abspath(yaml_path)), graph, model,
                          serve_with, result)
        _move_into_place(staging, repo_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("Wrote Triton repository %s (%s, entry model %r, %d model(s), serve_with=%s)",
                repo_dir, "sequence" if result.sequence else "ensemble", result.entry,
                len(result.models), serve_with)
    return result


def _fleet_options(serve_with: str, max_sequences: int | None, fleet_size: int | None,
                   queue_delay_us: int, instances: str,
                   batch: bool) -> tuple[int, dict | None]:
    """write_repository's options checked: (fleet size, the batched fleet's options or
    None when ``batch`` is off)."""
    if serve_with not in SERVE_WITH:
        raise ValueError(f"serve_with={serve_with!r}: expected one of {SERVE_WITH}")
    if max_sequences is not None and fleet_size is not None and max_sequences != fleet_size:
        raise ValueError("give fleet_size or its older name max_sequences, not both")
    size = fleet_size if fleet_size is not None else max_sequences
    size = DEFAULT_FLEET_SIZE if size is None else size
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"fleet_size={size!r}: expected a positive integer")
    if size > MAX_FLEET_SIZE:
        raise ValueError(f"fleet_size={size}: a repository serves at most {MAX_FLEET_SIZE} "
                         "robots (docs/triton.md, 'Fleet size', says why); run several "
                         "servers, each for part of the fleet")
    if instances not in INSTANCE_KINDS:
        raise ValueError(f"instances={instances!r}: expected one of {INSTANCE_KINDS}")
    if not isinstance(queue_delay_us, int) or queue_delay_us < 0:
        raise ValueError(f"queue_delay_us={queue_delay_us!r}: expected an integer >= 0")
    fleet = {"fleet_size": size, "queue_delay_us": queue_delay_us,
             "instances": instances} if batch else None
    return size, fleet


def _read_pipeline(yaml_path: str) -> tuple[dict, Pipeline]:
    """The bundle's document and its typed Pipeline; a bundle that does not read or wire
    is a TritonRepositoryError."""
    from ..bundle.safe_load import BundleError, read_bundle
    try:
        bundle = read_bundle(yaml_path)
        return bundle, Pipeline.from_document(bundle)
    except BundleError as exc:
        raise TritonRepositoryError(str(exc)) from exc
    except ValueError as exc:  # the bundle's wiring does not hold
        raise TritonRepositoryError(f"{yaml_path}: {exc}") from exc


def _move_into_place(staging: str, repo_dir: str) -> None:
    """The finished staging directory becomes repo_dir (its hidden leftovers removed)."""
    for leftover in os.listdir(staging):
        if leftover.startswith("."):
            os.unlink(os.path.join(staging, leftover))
    os.chmod(staging, directory_mode())
    if os.path.isdir(repo_dir):
        os.rmdir(repo_dir)
    os.rename(staging, repo_dir)


__all__ = ["write_repository", "TritonRepository", "TritonRepositoryError", "read_config",
           "config_text", "model_name", "SERVE_WITH", "CONTROL_INPUTS", "DEFAULT_FLEET_SIZE",
           "MAX_FLEET_SIZE", "INSTANCE_KINDS"]
