"""The contract an exported model carries: what its tensors mean, inside the file.

A bundle's YAML says what every tensor is (``kind``, ``element_names``, the
history axis, extra fields), how the nodes are wired, which ports are the
pipeline's inputs and outputs, the feedback pairs and their initial values and
the pipeline's ``configs``.  A deployer often ships only a model file, so every
model ``compile_graph`` exports (and every fused model) carries the part of the
YAML that concerns it as one JSON document, the *contract* (docs/deploy.md):

* ONNX: ``metadata_props`` key :data:`ONNX_KEY`;
* TorchScript: the extra file :data:`EXTRA_FILE` (``torch.jit.load(...,
  _extra_files=...)`` reads it; in the archive ``<archive>/extra/<name>``);
* torch.export (``.pt2``): the extra file :data:`EXTRA_FILE`
  (``<archive>/extra/<name>``, or ``extra_files/<name>`` in torch 2.7's flat
  archive).

The contract is built from the YAML's documents only (never from traced
objects), so :func:`expected` rebuilds it from a bundle on disk and a reader
compares the two.  It is written after the export and before the model's
checksums are taken: the YAML's sha256 is that of the file with its contract.
:func:`read` never unpickles and never loads the model: ONNX metadata comes
from the protobuf (external data untouched), archives are read as zip files.
"""
from __future__ import annotations

import base64
import io
import json
import os
import zipfile
from typing import Any, Mapping

from .._version import __implementation__
from .pipeline import STATE_SUFFIX

#: The ``schema`` value of every contract.
SCHEMA = "leapp.contract"
#: Bumped whenever a field changes meaning or is removed (added fields keep it).
SCHEMA_VERSION = 1
#: ONNX ``metadata_props`` key holding the contract's JSON.
ONNX_KEY = "leapp_contract"
#: TorchScript / torch.export extra file holding the same JSON.
EXTRA_FILE = "leapp_contract.json"
#: A contract larger than this is not read (a file from elsewhere may be hostile).
MAX_CONTRACT_BYTES = 64 * 1024 * 1024

_PORT_FIELDS = ("name", "dtype", "shape", "type")
_ZIP_MAGIC = b"PK\x03\x04"
# torch 2.7's flat torch.export archive (leapp.bundle.safe_load reads it too)
_LEGACY_PT2_PROGRAM = "serialized_exported_program.json"


class ContractError(ValueError):
    """The file carries no contract, or one that cannot be read."""


# ---- building -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON's view of YAML data (tuples become lists, mappings plain dicts)."""
    return json.loads(json.dumps(value, default=str))


def encode_tensor(tensor: Any) -> dict[str, Any] | None:
    """A tensor as ``{"dtype", "shape", "encoding": "base64-le", "data"}`` (None stays None)."""
    if tensor is None:
        return None
    import torch
    raw = tensor.detach().cpu().contiguous()
    data = raw.view(torch.uint8).numpy().tobytes() if raw.numel() else b""
    return {"dtype": str(raw.dtype).replace("torch.", ""),  # the YAML's dtype names
            "shape": list(raw.shape), "encoding": "base64-le",
            "data": base64.b64encode(data).decode("ascii")}


def decode_tensor(entry: Mapping[str, Any]) -> Any:
    """The tensor :func:`encode_tensor` described."""
    import torch

    from .pipeline import torch_dtype
    dtype = torch_dtype(entry["dtype"], "contract tensor")
    raw = bytearray(base64.b64decode(entry["data"]))
    flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.reshape(entry["shape"]).clone()


def _port(port: Any, index: int) -> dict[str, Any]:
    entry = port.description()
    return {"index": index, "name": port.name, "key": port.key, "dtype": port.dtype,
            "shape": list(port.shape), "type": entry.get("type"),
            "semantics": {k: v for k, v in entry.items() if k not in _PORT_FIELDS}}


def _header(model: Any, graph: str, artifact: str) -> dict[str, Any]:
    system = model.system_information
    configs = model.sections.get("configs")
    from .pipeline import thawed
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "artifact": artifact,
            "graph": graph, "leapp_version": system.get("leapp version"),
            "leapp_implementation": __implementation__,
            "config_version": system.get("leapp config version"),
            "configs": None if configs is None else thawed(configs)}


def node_contract(model: Any, graph: str, name: str,
                  initial: Mapping[str, Any]) -> dict[str, Any]:
    """The contract of node ``name``'s model, from the bundle's typed :class:`Pipeline`.

    ``initial``: the bundle's initial values by ``"node/port"`` (a feedback
    target without one gets ``"initial": null``).
    """
    node = model.nodes[name]
    graph_inputs = {key: i for i, key in enumerate(model.input_keys())}
    graph_outputs = {key: i for i, key in enumerate(model.output_keys())}
    fed_by: dict[str, Any] = {}
    feeds: dict[str, list[Any]] = {}
    for edge in model.edges:
        fed_by.setdefault(edge.target, edge)
        feeds.setdefault(edge.source, []).append(edge)
    inputs = []
    for index, port in enumerate(node.inputs):
        entry = _port(port, index)
        entry["graph_input"] = graph_inputs.get(port.key)
        edge = fed_by.get(port.key)
        entry["source"] = None if edge is None else edge.source
        entry["feedback"] = bool(edge is not None and edge.feedback)
        if entry["feedback"]:
            entry["initial"] = encode_tensor(initial.get(port.key))
        inputs.append(entry)
    outputs = []
    for index, port in enumerate(node.outputs):
        entry = _port(port, index)
        entry["graph_output"] = graph_outputs.get(port.key)
        edges = feeds.get(port.key, [])
        entry["targets"] = [e.target for e in edges if not e.feedback]
        entry["feedback_targets"] = [e.target for e in edges if e.feedback]
        outputs.append(entry)
    contract = _header(model, graph, "node")
    contract.update({"node": name, "backend": node.backend, "inputs": inputs,
                     "outputs": outputs})
    return _plain(contract)


def fused_contract(model: Any, graph: str, format: str,
                   initial: Mapping[str, Any]) -> dict[str, Any]:
    """The contract of the bundle's fused model (``format`` "onnx" or "torchscript").

    Port names follow the fused-model convention (docs/fuse.md): data inputs
    ``"node/port"``, then one state input per feedback target; data outputs
    ``"node/port"`` (``"__out"`` appended where an input has that name), then
    the state outputs ``"<target>__next"``.
    """
    inputs: list[dict[str, Any]] = []
    for i, (node, port) in enumerate(model.inputs):
        entry = _port(model.nodes[node].input(port), len(inputs))
        entry.update(name=entry["key"], graph_input=i)
        inputs.append(entry)
    feedback = []
    states_in, states_out = [], []
    for edge in model.feedback_edges():
        target = model.nodes[edge.dst_node].input(edge.dst_port)
        source = model.nodes[edge.src_node].output(edge.src_port)
        pair = {"target": edge.target, "source": edge.source, "input": edge.target,
                "output": edge.target + STATE_SUFFIX,
                "initial": encode_tensor(initial.get(edge.target))}
        feedback.append(pair)
        state_in = _port(target, 0)
        state_in.update(name=pair["input"], state=pair["target"])
        states_in.append(state_in)
        state_out = _port(source, 0)
        state_out.update(name=pair["output"], state=pair["target"])
        states_out.append(state_out)
    names = model.output_names()  # the pipeline model's one renaming rule
    outputs: list[dict[str, Any]] = []
    for i, (node, port) in enumerate(model.outputs):
        entry = _port(model.nodes[node].output(port), 0)
        entry.update(name=names[(node, port)], graph_output=i)
        outputs.append(entry)
    for index, entry in enumerate(inputs + states_in):
        entry["index"] = index
    for index, entry in enumerate(outputs + states_out):
        entry["index"] = index
    contract = _header(model, graph, "fused")
    contract.update({"format": format, "nodes": list(model.run_order),
                     "inputs": inputs + states_in, "outputs": outputs + states_out,
                     "feedback": feedback})
    return _plain(contract)


# ---- from a bundle on disk ------------------------------------------------------------------


def initial_values(model: Any, bundle_dir: str) -> dict[str, Any]:
    """The bundle's initial values by ``"node/port"`` ({} when it names none).

    Read with safetensors (no pickle), the file confined to the bundle.
    """
    if not model.initial_values:
        return {}
    from safetensors.torch import load_file

    from .safe_load import bundle_file
    path = bundle_file(bundle_dir, model.initial_values, "initial values file")
    return dict(load_file(path))


def load_bundle(yaml_path: str) -> Any:
    """The typed :class:`Pipeline` of a bundle, read safely (wiring not re-checked)."""
    from .safe_load import read_bundle
    from .pipeline import Pipeline
    return Pipeline.from_document(read_bundle(os.fspath(yaml_path)), check_wiring=False)


def expected(yaml_path: str, node: str | None = None, fused: str | None = None) -> dict:
    """The contract the bundle's YAML says a model should carry.

    ``node``: that node's model; ``fused``: the fused model of that format
    ("onnx" or "torchscript").
    """
    yaml_path = os.fspath(yaml_path)
    model = load_bundle(yaml_path)
    graph = os.path.splitext(os.path.basename(yaml_path))[0]
    initial = initial_values(model, os.path.dirname(os.path.abspath(yaml_path)))
    if fused is not None:
        return fused_contract(model, graph, fused, initial)
    if node is None or node not in model.nodes:
        raise KeyError(f"the bundle {yaml_path} has no node {node!r}")
    return node_contract(model, graph, node, initial)


def differences(actual: Mapping[str, Any], wanted: Mapping[str, Any],
                where: str = "") -> list[str]:
    """Where two contracts differ (``leapp_implementation`` aside), as short texts."""
    found: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(found) >= 20:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in list(a) + [k for k in b if k not in a]:
                if key == "leapp_implementation" and not path:
                    continue
                if key not in a or key not in b:
                    found.append(f"{path}{key}: {'missing' if key not in a else 'unexpected'}")
                else:
                    walk(a[key], b[key], f"{path}{key}.")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}{i}.")
        elif a != b:
            found.append(f"{path.rstrip('.')}: {_short(a)} in the model, {_short(b)} in the YAML")

    walk(dict(actual), dict(wanted), where)
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- reading --------------------------------------------------------------------------------


def _decode(data: bytes | str, where: str) -> dict[str, Any]:
    if len(data) > MAX_CONTRACT_BYTES:
        raise ContractError(f"{where}: its contract is larger than {MAX_CONTRACT_BYTES} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"{where}: its contract is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or value.get("schema") != SCHEMA:
        raise ContractError(f"{where}: its {EXTRA_FILE} is not a {SCHEMA} document")
    return value


def _archive_entry(names: list[str]) -> str | None:
    """The contract's entry in a TorchScript or torch.export zip archive."""
    for name in names:
        parts = name.split("/")
        if parts[-1] != EXTRA_FILE:
            continue
        if len(parts) == 3 and parts[1] in ("extra", "extra_files"):
            return name
        if len(parts) == 2 and parts[0] == "extra_files":  # torch 2.7's flat pt2 archive
            return name
    return None


def _is_zip(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == _ZIP_MAGIC


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The contract a model file carries (ONNX, TorchScript ``.pt``, torch.export ``.pt2``).

    Per node model or fused model alike; the file is never run or unpickled.
    Raises :class:`ContractError` when it carries none.
    """
    found = read_or_none(path)
    if found is None:
        raise ContractError(f"{os.fspath(path)} carries no leapp contract (metadata "
                            f"{ONNX_KEY!r} / extra file {EXTRA_FILE!r}): it was not exported "
                            "by this leapp's compile_graph or fuse; compile the bundle again")
    return found


def read_or_none(path: str | os.PathLike) -> dict[str, Any] | None:
    """:func:`read`, or None when the file carries no contract."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such model file: {path}")
    if _is_zip(path):
        try:
            with zipfile.ZipFile(path) as archive:
                entry = _archive_entry(archive.namelist())
                if entry is None:
                    return None
                info = archive.getinfo(entry)
                if info.file_size > MAX_CONTRACT_BYTES:
                    raise ContractError(f"{path}: its contract is larger than "
                                        f"{MAX_CONTRACT_BYTES} bytes")
                with archive.open(info) as handle:
                    data = handle.read(MAX_CONTRACT_BYTES + 1)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise ContractError(f"{path} is not a readable model archive: {exc}") from None
        return _decode(data, path)
    import onnx
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001  (protobuf's errors have no common base)
        raise ContractError(f"{path} is neither an ONNX model nor a TorchScript / "
                            f"torch.export archive: {type(exc).__name__}: {exc}") from None
    for prop in proto.metadata_props:
        if prop.key == ONNX_KEY:
            return _decode(prop.value, path)
    return None


# ---- writing --------------------------------------------------------------------------------


def dumps(contract: Mapping[str, Any]) -> str:
    """The contract's JSON text as it is stored (compact, keys in the schema's order)."""
    return json.dumps(contract, separators=(",", ":"), ensure_ascii=False)


def set_onnx(proto: Any, contract: Mapping[str, Any]) -> None:
    """Put the contract into an in-memory ``onnx.ModelProto``'s ``metadata_props``."""
    for prop in list(proto.metadata_props):
        if prop.key == ONNX_KEY:
            proto.metadata_props.remove(prop)
    entry = proto.metadata_props.add()
    entry.key, entry.value = ONNX_KEY, dumps(contract)


def write(path: str, contract: Mapping[str, Any]) -> bool:
    """Write the contract into the model file at ``path``; False when it already holds it.

    The file is replaced by a new one (never written through): a file
    hard-linked from a previous bundle (an incremental compile) keeps its old
    bytes there.  Meant for files of a directory being written (a staging
    directory): it is not an atomic replacement.
    """
    current = read_or_none(path)
    if current == contract:
        return False
    text = dumps(contract).encode("utf-8")
    if _is_zip(path):
        data = _archive_with(path, text, replace=current is not None)
    else:
        import onnx
        proto = onnx.load(path, load_external_data=False)  # weights beside it stay as they are
        set_onnx(proto, contract)
        data = proto.SerializeToString()
        del proto
    # A new file, not a write through: compile_graph stamps files of its private
    # staging directory, some hard-linked from the committed bundle (reused).
    mode = os.stat(path).st_mode & 0o7777
    os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return True


def _archive_with(path: str, text: bytes, replace: bool) -> bytes:
    """The archive's bytes with the contract entry added (or replaced).

    Added: appended after the entries torch wrote, which keep their offsets
    (and so the alignment torch gives tensor payloads).  Replaced: the archive
    is rewritten entry by entry (torch reads unaligned entries as well).
    """
    with open(path, "rb") as handle:
        original = handle.read()
    with zipfile.ZipFile(io.BytesIO(original)) as archive:
        names = archive.namelist()
        old = _archive_entry(names)
        entry = _entry_name(names) if old is None else old
        if not replace:
            buffer = io.BytesIO(original)
            with zipfile.ZipFile(buffer, "a") as out:
                out.writestr(_info(entry), text)
            return buffer.getvalue()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as out:
            for info in archive.infolist():
                if info.filename != old:
                    out.writestr(info, archive.read(info))
            out.writestr(_info(entry), text)
        return buffer.getvalue()


def _info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # same bytes every compile
    info.compress_type = zipfile.ZIP_STORED
    return info


def _entry_name(names: list[str]) -> str:
    """Where torch keeps extra files in this archive."""
    if _LEGACY_PT2_PROGRAM in names:
        return f"extra_files/{EXTRA_FILE}"
    prefix = names[0].split("/", 1)[0] if names else "archive"
    return f"{prefix}/extra/{EXTRA_FILE}"  # TorchScript and torch>=2.8 PT2 archives alike


# ---- compile_graph --------------------------------------------------------------------------
