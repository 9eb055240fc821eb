"""Reading a bundle without trusting it: bounded YAML, contained paths, no pickles.

Everything ``InferenceManager`` reads from a bundle goes through this module:

* :func:`quote` cuts any value an error message shows to :data:`MAX_QUOTE`
  characters, so a hostile YAML cannot make a message huge.
* :func:`load_yaml` reads at most :data:`MAX_YAML_BYTES` of a regular file and
  refuses anchors and aliases (LEAPP's own YAML never uses them; an alias chain
  is how a "billion laughs" document explodes) and nesting deeper than
  :data:`MAX_YAML_DEPTH`.
* :func:`bundle_file` resolves a path the bundle names, following symlinks, and
  refuses one that lands outside the bundle directory (unless the caller opted
  in) or that is not a regular file.
* :func:`leapp.bundle.pt2_reader.load_pt2` loads a torch.export archive without ever unpickling: the
  weights and constants are read as raw tensor bytes described by their JSON
  configs, the pickled sample inputs are never read, and entries torch would
  unpickle or run (pickled payloads, custom objects, AOTInductor libraries,
  Python guard code, non-arithmetic symbolic expressions) are refused.
"""
from __future__ import annotations

import json
import math
import os
import reprlib
import stat
from typing import Any, NoReturn


from .digest import file_digests
from .log import fatal

#: Longest rendering of a bundle value inside an error message.
MAX_QUOTE = 200
#: Largest YAML description read (16 MiB).
MAX_YAML_BYTES = 16 * 1024 * 1024
#: Deepest nesting of YAML mappings and sequences accepted.
MAX_YAML_DEPTH = 64
#: Most elements one declared port shape may have (2**31).
MAX_SHAPE_ELEMENTS = 2 ** 31
#: Most dimensions one declared port shape may have.
MAX_SHAPE_DIMS = 64
#: Most bytes one declared port may take (2 GiB): InferenceManager allocates a buffer of
#: every port's shape, and no robot policy's port comes near (a 4096-robot batch of
#: 64x64 RGB float32 images is 200 MiB).
MAX_PORT_BYTES = 2 ** 31
#: Most bytes all the declared ports of one bundle may take together (8 GiB).
MAX_BUNDLE_PORT_BYTES = 2 ** 33
#: Largest JSON entry (model graph, payload config) read from a .pt2 archive.
MAX_PT2_JSON_BYTES = 256 * 1024 * 1024

_REPR = reprlib.Repr()
_REPR.maxlevel = 4
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 16
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_QUOTE


class BundleError(ValueError):
    """A bundle file is malformed, unsafe or inconsistent."""


def quote(value: Any, limit: int = MAX_QUOTE) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters.

    The rendering itself is bounded (nested containers and long strings are
    abbreviated before formatting), so quoting a huge or deeply nested value
    costs little.  What is left out is marked with ``...``.
    """
    try:
        text = _REPR.repr(value)
    except Exception:  # a hostile __repr__ cannot happen for YAML data, but be safe
        text = f"<{type(value).__name__}>"
    if len(text) > limit:
        text = text[:max(limit - 3, 0)] + "..."
    return text


def clip(value: Any, limit: int = MAX_QUOTE) -> str:
    """A string as is (cut to ``limit`` characters), anything else as :func:`quote`."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:max(limit - 3, 0)] + "..."
    return quote(value, limit)


def fail(message: str) -> NoReturn:
    """fatal() of this module's kind: a BundleError (malformed, unsafe or inconsistent file)."""
    fatal(message, BundleError)


# ---- files ----------------------------------------------------------------------------


def _is_inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_regular_file(path: str, what: str) -> os.stat_result:
    """The stat of ``path`` (symlinks followed); refuses anything but a regular file."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        fatal(f"{what} not found at {quote(path)}", FileNotFoundError)
    except OSError as exc:
        fail(f"{what} at {quote(path)} cannot be read: {clip(str(exc))}")
    if not stat.S_ISREG(info.st_mode):
        fail(f"{what} at {quote(path)} is not a regular file (devices, FIFOs, sockets and "
             "directories are never read from a bundle)")
    return info


def open_regular(path: str, what: str) -> int:
    """A read-only descriptor of ``path``, checked to be a regular file once opened.

    ``O_NONBLOCK`` keeps a FIFO swapped in after an earlier check from blocking
    the open; the ``fstat`` of the open descriptor is what decides.
    """
    check_regular_file(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        fail(f"{what} at {quote(path)} cannot be opened: {clip(str(exc))}")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        fail(f"{what} at {quote(path)} is not a regular file")
    return fd


def bundle_file(bundle_dir: str, name: Any, what: str, allow_external: bool = False) -> str:
    """The real path of the file a bundle names, checked to stay inside the bundle.

    Args:
        bundle_dir: the directory holding the bundle's YAML.
        name: the path as written in the YAML (relative to ``bundle_dir``).
        what: what the file is, for error messages (``"model file of node 'a'"``).
        allow_external: accept absolute paths and paths that resolve outside
            ``bundle_dir`` (``InferenceManager(..., allow_external_paths=True)``).

    Raises:
        BundleError: the name is not a non-empty string, is absolute, resolves
            (after symlinks) outside the bundle, or is not a regular file.
        FileNotFoundError: nothing is there.
    """
    if not isinstance(name, str) or not name:
        fail(f"The path of the {what} must be a non-empty string, got {quote(name)}")
    if "\x00" in name:
        fail(f"The path of the {what} contains a NUL byte: {quote(name)}")
    joined = os.path.join(bundle_dir, name)
    if allow_external:
        # upstream also looked the path up as given (relative to the working directory)
        path = joined if os.path.exists(joined) or os.path.isabs(name) else name
        if not os.path.exists(path):
            fatal(f"{what[0].upper()}{what[1:]} not found at {quote(joined)}", FileNotFoundError)
        real = os.path.realpath(path)
    else:
        if os.path.isabs(name):
            fail(f"The {what} is named by an absolute path {quote(name)}; a bundle names its "
                 "files relative to its own directory (pass allow_external_paths=True to "
                 "InferenceManager to load files outside the bundle)")
        real = os.path.realpath(joined)
        root = os.path.realpath(bundle_dir)
        if not _is_inside(real, root):
            fail(f"The {what} {quote(name)} resolves to {quote(real)}, outside the bundle "
                 f"directory {quote(root)} (pass allow_external_paths=True to "
                 "InferenceManager to load files outside the bundle)")
        if not os.path.lexists(joined):
            fatal(f"{what[0].upper()}{what[1:]} not found at {quote(joined)}", FileNotFoundError)
    check_regular_file(real, what[0].upper() + what[1:])
    return real


def bundle_file_sha256(bundle_dir: str, name: Any, what: str,
                       allow_external: bool = False) -> tuple[str, str]:
    """(real path, sha256) of a file the bundle names: confined as :func:`bundle_file`
    confines it, opened as a regular file (no FIFO or device is read) and hashed."""
    path = bundle_file(bundle_dir, name, what, allow_external)
    return path, file_digests(open_regular(path, what[0].upper() + what[1:]))[0]


# ---- YAML -----------------------------------------------------------------------------


def load_yaml(path: str) -> Any:
    """Parse the bundle YAML at ``path`` safely.

    Refuses a file that is not regular, is larger than :data:`MAX_YAML_BYTES`,
    is not UTF-8, uses anchors or aliases, nests deeper than
    :data:`MAX_YAML_DEPTH` or is not valid YAML.  Only plain YAML types are
    built (``yaml.SafeLoader``, in C when PyYAML has libyaml).
    """
    import yaml

    fd = open_regular(path, "Leapp description file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        fail(f"Leapp description file {quote(path)} is larger than {MAX_YAML_BYTES} bytes "
             f"(16 MiB); refusing to parse it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"Leapp description file {quote(path)} is not UTF-8 text: {clip(str(exc))}")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        depth = 0
        for event in yaml.parse(text, Loader=loader):
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                fail(f"Leapp description file {quote(path)} uses a YAML anchor or alias "
                     f"({quote(event.anchor)}, line {line}); bundle YAML never uses them, "
                     "so it is refused")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    fail(f"Leapp description file {quote(path)} nests deeper than "
                         f"{MAX_YAML_DEPTH} levels (line {line})")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):
            # PyYAML >= 6.0.3 has a nesting limit of its own that can trip
            # before ours: the refusal reads the same whichever comes first.
            fail(f"Leapp description file {quote(path)} nests deeper than "
                 f"{MAX_YAML_DEPTH} levels (the YAML parser's own limit was reached)")
        fail(f"Leapp description file {quote(path)} is not valid YAML: "
             f"{clip(str(exc), 400)}")
    except (ValueError, OverflowError, RecursionError) as exc:
        if isinstance(exc, BundleError):
            raise
        fail(f"Leapp description file {quote(path)} holds a value that cannot be read: "
             f"{type(exc).__name__}: {clip(str(exc))}")


# ---- shapes ---------------------------------------------------------------------------


BUNDLE_DOCUMENTS = ("models", "pipeline", "system information")


def read_bundle(path: str) -> dict:
    """The bundle YAML's three top-level mappings, read by :func:`load_yaml`.

    Raises BundleError (one line, naming the file) when the path is not a
    bundle's .yaml file or its documents are missing or not mappings.
    """
    if not os.path.exists(path):
        raise BundleError(f"no such file: {path}")
    if os.path.isdir(path):
        raise BundleError(f"{path} is a directory; give the bundle's .yaml file")
    if not path.endswith(".yaml"):
        raise BundleError(f"{path} is not a .yaml file; give the bundle's .yaml file")
    try:
        loaded = load_yaml(path)
    except (OSError, ValueError) as exc:
        text = " ".join((str(exc).strip() or type(exc).__name__).split())
        raise BundleError(f"cannot read {path}: {text}") from exc
    if not isinstance(loaded, dict) or not all(k in loaded for k in BUNDLE_DOCUMENTS):
        raise BundleError(f"{path} is not a leapp bundle: it needs the documents "
                          f"{', '.join(BUNDLE_DOCUMENTS)}")
    if not isinstance(loaded["models"] or {}, dict) \
            or not isinstance(loaded["pipeline"] or {}, dict):
        raise BundleError(f"{path} is not a leapp bundle: 'models' and 'pipeline' must be "
                          f"mappings")
    return loaded


def parse_shape(value: Any, where: str) -> tuple[int, ...]:
    """A declared port shape: a list of non-negative ints (or its JSON text).

    Refuses floats, strings, bools, negatives, more than :data:`MAX_SHAPE_DIMS`
    dimensions and more than :data:`MAX_SHAPE_ELEMENTS` elements, naming
    ``where`` (``"node/port"``).
    """
    raw = value
    if isinstance(value, str):
        try:
            value = json.loads(value) if len(value) <= 4096 else None
        except ValueError:
            value = None
    if not isinstance(value, (list, tuple)):
        fail(f"Invalid shape {quote(raw)} for {where}: expected a list of non-negative ints")
    if len(value) > MAX_SHAPE_DIMS:
        fail(f"Invalid shape {quote(raw)} for {where}: more than {MAX_SHAPE_DIMS} dimensions")
    for dim in value:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            fail(f"Invalid shape {quote(raw)} for {where}: dimension {quote(dim)} is not a "
                 "non-negative int")
    numel = math.prod(value)
    if numel > MAX_SHAPE_ELEMENTS:
        fail(f"Shape {quote(raw)} for {where} declares {numel} elements, more than the "
             f"{MAX_SHAPE_ELEMENTS} (2**31) a port may have; refusing to allocate it")
    return tuple(value)


def size_text(nbytes: int) -> str:
    """nbytes for a message: '8.0 GiB (8589934592 bytes)'."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


def check_port_bytes(shape: tuple[int, ...], dtype: str, itemsize: int, node: str,
                     port: str) -> int:
    """The bytes of port ``port`` of node ``node`` as declared; refuses more than
    :data:`MAX_PORT_BYTES` before anything is allocated."""
    nbytes = math.prod(shape) * itemsize
    if nbytes > MAX_PORT_BYTES:
        fail(f"Node {quote(node)}, port {quote(port)} ({node}/{port}) declares {dtype} "
             f"{list(shape)}: {size_text(nbytes)}, more than "
             f"the {size_text(MAX_PORT_BYTES)} one port may take (MAX_PORT_BYTES); refusing "
             f"to allocate it. leapp never exports such a port: was the YAML edited? "
             f"(docs/safety.md)")
    return nbytes


# ---- ONNX external data ---------------------------------------------------------------


def check_onnx_external_data(path: str, bundle_dir: str, allow_external: bool = False) -> None:
    """Refuse ONNX external-data files that leave the bundle or are not regular files.

    onnxruntime already refuses ``..`` and absolute locations; this also follows
    symlinks and refuses FIFOs and devices, before onnxruntime opens anything.
    Models without external data (no ``location`` key in the file) are not parsed.
    """
    with os.fdopen(open_regular(path, "ONNX model"), "rb") as handle:
        if b"location" not in handle.read():
            return
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors
    except ImportError:  # onnxruntime's own path checks still apply
        return
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:
        fail(f"ONNX model {quote(path)} cannot be parsed: {type(exc).__name__}: "
             f"{clip(str(exc))}")
    base = os.path.dirname(os.path.realpath(path))
    for tensor in _get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        what = f"external data file of ONNX tensor {quote(tensor.name)}"
        if not location or os.path.isabs(location):
            fail(f"The {what} has location {quote(location)}: expected a relative path")
        real = os.path.realpath(os.path.join(base, location))
        root = os.path.realpath(bundle_dir)
        if not allow_external and not _is_inside(real, root):
            fail(f"The {what} {quote(location)} resolves to {quote(real)}, outside the "
                 f"bundle directory {quote(root)} (pass allow_external_paths=True to "
                 "InferenceManager to load files outside the bundle)")
        check_regular_file(real, what[0].upper() + what[1:])
