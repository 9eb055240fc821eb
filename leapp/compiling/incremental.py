"""Incremental compiles: a node unchanged since the previous compile reuses its file.

Each exported node gets a content key, a SHA-256 over everything its artifact
follows from: the node's name, the canonical backend and its backend_params
(and, for ONNX, the effective opset and the onnx / onnxscript / onnx_ir
versions), its input and output descriptions (names, dtypes, shapes,
semantics, the example inputs' devices), the fx graph (every node's op,
target, arguments and literals), the bytes of its constants, and the versions
of leapp, torch and Python.  Constants are hashed straight from their memory
(about 1 GB/s).

The keys live in a hidden file of the bundle, MANIFEST (JSON): per node its
key, its files with their SHA-256, and what the export returned besides the
file (the final port names, the inputs ONNX dropped, the YAML parameters and
the warnings it logged).  The YAML stays exactly upstream's.  The next compile
into the same bundle looks each node's key up there: on a match whose files
still hash as recorded, the files are hard-linked (copied where links are
refused or their mode differs) into the staging directory and checked again
there, and the node is not exported; its validation runs as for any node.  A
changed key, a missing or altered file, a manifest that does not parse, or
LEAPP_INCREMENTAL=0 in the environment means a fresh export.  Bring-your-own
models are never reused (their own file is the artifact).
"""
from __future__ import annotations

import contextlib
import enum
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import sys
from typing import Any, Iterator

import torch
import torch.fx as fx

from ..bundle.log import FATAL, logger
from ..bundle.modes import file_mode
from .._version import __implementation__, __version__

MANIFEST = ".leapp_cache.json"
# Bumped whenever what a key covers or the manifest's layout changes.
FORMAT = 1
# A manifest larger than this is not read (a bundle from elsewhere may be hostile).
_MAX_MANIFEST_BYTES = 16 * 1024 * 1024
_OFF = ("0", "false", "no", "off")
# The model file suffix each YAML backend writes.
_SUFFIX = {"jit": ".pt", "onnx": ".onnx", "pt2": ".pt2"}
_SCALARS = (str, int, float, bool, type(None))


class _Uncacheable(Exception):
    """Something in the node cannot be keyed faithfully: the node is always exported."""


def enabled() -> bool:
    """Whether compiles reuse unchanged nodes (LEAPP_INCREMENTAL=0 turns it off)."""
    return os.environ.get("LEAPP_INCREMENTAL", "").strip().lower() not in _OFF


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---- content keys ------------------------------------------------------------------------------

class _Hasher:
    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def text(self, tag: str, value: str) -> None:
        self.digest.update(f"{tag}\x00{value}\x00".encode("utf-8", "surrogatepass"))

    def tensor(self, tag: str, tensor: torch.Tensor) -> None:
        """dtype, shape, device and the bytes of tensor."""
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type == "meta":
            raise _Uncacheable(f"{tag}: a {tensor.layout} / quantized / meta tensor")
        self.text(tag, f"{tensor.dtype} {tuple(tensor.shape)} {tensor.device} "
                       f"{tensor.requires_grad}")
        with torch._C.DisableTorchFunctionSubclass():
            flat = tensor.detach()
            if flat.device.type != "cpu":
                flat = flat.cpu()
            flat = flat.resolve_conj().resolve_neg().contiguous().reshape(-1)
            data = flat.view(torch.uint8).numpy() if flat.numel() else b""
        self.digest.update(memoryview(data))

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _package_version(name: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _target(target: Any) -> str:
    """A call target's stable name; a user function's code is part of it."""
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{target}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        raise _Uncacheable(f"call target {target!r} has no name")
    text = f"{module}.{name}"
    root = module.split(".", 1)[0]
    if root not in ("torch", "operator", "_operator", "builtins", "math", "leapp", "numpy"):
        code = getattr(target, "__code__", None)
        if code is None:
            raise _Uncacheable(f"call target {text} is neither torch's nor Python code")
        text += f" {code.co_code.hex()} {_canonical(code.co_consts)} {code.co_names}"
    return text


def _canonical(value: Any) -> str:
    """A text that changes whenever an fx argument changes (never a lossy repr)."""
    if isinstance(value, fx.Node):
        return f"%{value.name}"
    if value is None or value is Ellipsis or isinstance(value, bool):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        return f"f{value.hex()}"
    if isinstance(value, complex):
        return f"c{value.real.hex()},{value.imag.hex()}"
    if isinstance(value, (str, bytes)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        body = ",".join(_canonical(v) for v in value)
        return f"{type(value).__name__}({body})"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_canonical(k)}:{_canonical(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return f"slice({_canonical(value.start)},{_canonical(value.stop)},{_canonical(value.step)})"
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format,
                          torch.qscheme)):
        return f"{type(value).__name__}:{value}"
    if isinstance(value, torch.Tensor):
        hasher = _Hasher()
        hasher.tensor("literal", value)
        return f"tensor:{hasher.hexdigest()}"
    if type(value).__module__ == "numpy":
        import numpy as np
        if isinstance(value, np.ndarray):
            return f"ndarray:{value.dtype}:{value.shape}:{hashlib.sha256(value.tobytes()).hexdigest()}"
        if isinstance(value, (np.generic, np.dtype)):
            return f"numpy:{value!r}"
    raise _Uncacheable(f"argument of type {type(value).__name__}")


def _graph_lines(module: fx.GraphModule) -> Iterator[str]:
    for node in module.graph.nodes:
        yield (f"{node.name}={node.op}[{_target(node.target)}]"
               f"({_canonical(node.args)}|{_canonical(node.kwargs)})")


def node_key(node: Any, backend: str, params: dict, module: fx.GraphModule) -> str | None:
    """The content key of node exported with canonical backend and params; None when the
    node holds something that cannot be keyed (it is then always exported)."""
    hasher = _Hasher()
    try:
        hasher.text("format", str(FORMAT))
        hasher.text("leapp", f"{__version__} {__implementation__}")
        hasher.text("torch", str(torch.__version__))
        hasher.text("python", f"{sys.version_info[0]}.{sys.version_info[1]}")
        hasher.text("node", node.name)
        hasher.text("backend", backend)
        hasher.text("params", _canonical(dict(sorted(params.items()))))
        if backend.startswith("onnx"):
            from .backends.onnx import default_opset
            hasher.text("opset", str(default_opset()))
            for package in ("onnx", "onnxscript", "onnx_ir"):
                hasher.text(package, _package_version(package))
        for side, ports in (("input", node.inputs), ("output", node.outputs)):
            for port in ports:
                hasher.text(side, json.dumps(port.describe(), sort_keys=True, default=repr))
                value = port.value
                if isinstance(value, torch.Tensor):
                    hasher.text(f"{side} value", f"{value.dtype} {tuple(value.shape)} "
                                                 f"{value.device}")
        for line in _graph_lines(module):
            hasher.text("fx", line)
        for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
            hasher.tensor(f"constant {name}", tensor)
    except _Uncacheable as exc:  # the node holds what a key cannot follow: exported
        logger.debug("%s: not reused across compiles (%s)", node.name, exc)
        return None
    except Exception as exc:  # noqa: BLE001  a fault of this module's: said, then exported
        logger.warning("%s: the incremental compile's key of this node could not be computed "
                       "(%s: %s); the node is exported again on every compile. This is a bug "
                       "of leapp's: please report it with this message.", node.name,
                       type(exc).__name__, exc)
        return None
    return hasher.hexdigest()


class _Notes(logging.Filter):
    """Collects the warnings leapp logs while a node is exported (replayed on reuse)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.WARNING <= record.levelno < FATAL:
            self.messages.append(record.getMessage())
        return True


@contextlib.contextmanager
def collect_notes() -> Iterator[list[str]]:
    """The warnings leapp logs inside the block, as a list filled as they come."""
    notes = _Notes()
    logger.addFilter(notes)
    try:
        yield notes.messages
    finally:
        logger.removeFilter(notes)


def key_of(node: Any, export_with: str | None, params: dict | None,
           module: fx.GraphModule) -> str | None:
    """node_key() for the backend export_with names; None for a bring-your-own model."""
    from .backends import canonical
    backend = canonical(node.name, export_with)
    if backend is None:
        return None
    params = dict(params or {})
    if backend == "onnx-dynamo":  # leapp's writer or torch's exporter make different files
        from .onnx_writer import enabled
        params["(onnx writer)"] = enabled()
    return node_key(node, backend, params, module)


# ---- the manifest -------------------------------------------------------------------------------

def read_manifest(bundle: str) -> dict:
    """{node: entry} of the committed bundle's manifest; {} when absent or unusable."""
    path = os.path.join(bundle, MANIFEST)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return {}
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_MANIFEST_BYTES + 1)
        if len(raw) > _MAX_MANIFEST_BYTES:
            raise ValueError("too large")
        document = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        logger.debug("Ignoring %s: %s", path, exc)
        return {}
    if not isinstance(document, dict) or document.get("format") != FORMAT \
            or not isinstance(document.get("nodes"), dict):
        logger.debug("Ignoring %s: not a format %d manifest", path, FORMAT)
        return {}
    return document["nodes"]


def write_manifest(directory: str, entries: dict) -> None:
    """Write the manifest of this compile's keyed nodes into directory (none: no file)."""
    if not entries:
        return
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as handle:
        json.dump({"format": FORMAT, "nodes": entries}, handle, indent=1, sort_keys=True)
        handle.write("\n")


def _plain_name(name: Any) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..") and os.sep not in name
            and (os.altsep is None or os.altsep not in name) and "\x00" not in name)


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _usable(name: str, entry: Any, inputs: int, outputs: int) -> bool:
    """Whether a manifest entry is well formed for node name with these port counts."""
    if not isinstance(entry, dict):
        return False
    backend, model, files = entry.get("yaml_backend"), entry.get("model_file"), entry.get("files")
    if backend not in _SUFFIX or model != f"{name}{_SUFFIX[backend]}" or not _plain_name(model):
        return False
    allowed = {model, f"{model}.data"} if backend == "onnx" else {model}
    if not isinstance(files, dict) or model not in files or not set(files) <= allowed \
            or not all(isinstance(v, str) for v in files.values()):
        return False
    names_in, names_out = entry.get("input_names"), entry.get("output_names")
    dropped, notes = entry.get("dropped_inputs"), entry.get("notes")
    parameters = entry.get("parameters")
    return (_string_list(names_in) and len(names_in) == inputs and _string_list(names_out)
            and len(names_out) == outputs and _string_list(dropped)
            and set(dropped) <= set(names_in) and _string_list(notes)
            and isinstance(parameters, dict)
            and all(isinstance(k, str) and isinstance(v, _SCALARS)
                    for k, v in parameters.items()))


def _stage_file(source: str, target: str) -> None:
    """source into target: a hard link when it already has the mode a new file gets."""
    info = os.lstat(source)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{source} is not a regular file")
    if stat.S_IMODE(info.st_mode) == file_mode():
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copyfile(source, target)


class Cache:
    """The previous compile's manifest and this compile's entries."""

    def __init__(self, bundle: str, staging: str, use: bool) -> None:
        self.bundle = bundle
        self.staging = staging
        self.previous = read_manifest(bundle) if use else {}
        self.entries: dict = {}
        self.reused: set[str] = set()

    def reuse(self, node: Any, key: str | None) -> Any:
        """The Exported of node's file from the previous compile, staged; None to export."""
        from .backends import Exported
        entry = self.previous.get(node.name)
        if key is None or not isinstance(entry, dict) or entry.get("key") != key:
            return None
        if not _usable(node.name, entry, len(node.inputs), len(node.outputs)):
            logger.debug("%s: the manifest's entry is malformed; exporting again", node.name)
            return None
        staged = []
        try:
            for name, digest in entry["files"].items():
                target = os.path.join(self.staging, name)
                _stage_file(os.path.join(self.bundle, name), target)
                staged.append(target)
                if file_sha256(target) != digest:  # hashed where it will ship
                    raise OSError(f"{name} changed since it was written")
        except OSError as exc:
            for path in staged:
                os.remove(path)
            logger.info("%s: the previous compile's file cannot be reused (%s); exporting "
                        "again", node.name, exc)
            return None
        for note in entry["notes"]:
            logger.warning("%s", note)
        logger.info("%s: unchanged since the previous compile; reusing %s", node.name,
                    entry["model_file"])
        self.entries[node.name] = entry
        self.reused.add(node.name)
        return Exported(model=None, path=os.path.join(self.staging, entry["model_file"]),
                        yaml_backend=entry["yaml_backend"],
                        input_names=list(entry["input_names"]),
                        output_names=list(entry["output_names"]),
                        parameters=dict(entry["parameters"]),
                        dropped_inputs=list(entry["dropped_inputs"]))

    def remember(self, node: Any, key: str | None, result: Any, notes: list[str]) -> None:
        """Record a fresh export for the next compile (when it can be reused at all)."""
        if key is None or result.path is None or result.external or result.yaml_backend \
                not in _SUFFIX:
            return
        model = os.path.basename(result.path)
        if os.path.dirname(os.path.abspath(result.path)) != os.path.abspath(self.staging) \
                or model != f"{node.name}{_SUFFIX[result.yaml_backend]}":
            return
        files = {model: file_sha256(result.path)}
        data = result.path + ".data"
        if result.yaml_backend == "onnx" and os.path.isfile(data):
            files[model + ".data"] = file_sha256(data)
        parameters = dict(result.parameters)
        if not all(isinstance(k, str) and isinstance(v, _SCALARS)
                   for k, v in parameters.items()):
            return
        self.entries[node.name] = {
            "key": key, "model_file": model, "files": files,
            "yaml_backend": result.yaml_backend, "input_names": list(result.input_names),
            "output_names": list(result.output_names), "parameters": parameters,
            "dropped_inputs": list(result.dropped_inputs), "notes": list(notes)}

    def write(self) -> None:
        write_manifest(self.staging, self.entries)
