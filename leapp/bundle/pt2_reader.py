"""Reading a ``torch.export`` archive (``.pt2``) without unpickling: every JSON entry is
bounded, symbolic expressions and guards are checked against a small grammar, and
weights are read ``weights_only``."""
from __future__ import annotations

import ast
import json
import math
import re
import zipfile
import zlib
from typing import Any

import torch

from .safe_load import MAX_PT2_JSON_BYTES, MAX_SHAPE_ELEMENTS, check_regular_file, clip, fail, quote


# What a symbolic shape expression may contain: numbers, shape symbols (s0,
# u3, ...), sympy function names torch's deserializer knows, arithmetic.
_EXPR_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|//|<=|>=|==|!="
                         r"|[-+*/%(),<>=])|('[a-z]+\d+'|\"[a-z]+\d+\"))")
_EXPR_NAMES = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "LShift", "RShift", "FloatTrueDiv",
    "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
    "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "Max", "Min", "Abs", "oo",
    "Integer", "Rational", "floor", "ceiling", "sqrt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
    "And", "Or", "Not", "True", "False", "Symbol", "Add", "Mul", "Float",
    "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Equality", "Unequality",
    # assumption keywords of Symbol(...)
    "positive", "negative", "nonnegative", "nonpositive", "nonzero", "zero", "integer",
    "real", "finite", "infinite", "rational", "even", "odd", "commutative", "extended_real",
})
_SYMBOL = re.compile(r"[a-z]+\d+")
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_sym_expr(text: Any, where: str) -> None:
    """Refuse a symbolic expression torch would hand to ``sympy.sympify`` (an eval)."""
    if not isinstance(text, str) or len(text) > 4096:
        fail(f"{where}: symbolic expression {quote(text)} is not a short string")
    pos = 0
    powers = 0
    expect_small_exponent = previous_was_exponent = False
    while pos < len(text):
        match = _EXPR_TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if text[pos:].strip() == "":
                break
            fail(f"{where}: symbolic expression {quote(text)} is not plain arithmetic over "
                 "shape symbols; refused (torch would evaluate it as Python)")
        number, name, operator = match.group(1), match.group(2), match.group(3)
        # no huge numbers and no towers of powers: sympy would compute them exactly
        if number is not None and len(number) > 19:
            fail(f"{where}: symbolic expression {quote(text)} holds a number longer than 19 "
                 "digits; refused")
        if expect_small_exponent and not (number is not None and "." not in number
                                          and int(number) <= 64):
            fail(f"{where}: symbolic expression {quote(text)} raises to a power other than "
                 "a literal int <= 64; refused")
        if operator == "**" and previous_was_exponent:
            fail(f"{where}: symbolic expression {quote(text)} stacks powers (a**b**c); "
                 "refused")
        previous_was_exponent = expect_small_exponent
        expect_small_exponent = operator == "**"
        powers += operator == "**"
        if powers > 2:
            fail(f"{where}: symbolic expression {quote(text)} has more than two powers; "
                 "refused")
        if name is not None and name not in _EXPR_NAMES and not _SYMBOL.fullmatch(name):
            fail(f"{where}: symbolic expression {quote(text)} names {quote(name)}, which is "
                 "not a shape symbol or a known sympy function; refused (torch would "
                 "evaluate it as Python)")
        pos = match.end()


def _check_guard(code: Any, where: str) -> None:
    """Refuse a guard unless it only compares input sizes with numbers.

    ``ExportedProgram.module()`` compiles ``guards_code`` with ``exec``; a guard
    such as ``L['x'].size()[0] == 3`` is accepted, anything else is refused.
    """
    if not isinstance(code, str) or len(code) > 4096:
        fail(f"{where}: guard {quote(code)} is not a short string")
    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        fail(f"{where}: guard {quote(code)} is not a Python expression")
    allowed = (ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Constant,
               ast.Name, ast.Subscript, ast.Call, ast.Attribute, ast.Load, ast.cmpop,
               ast.boolop, ast.operator, ast.unaryop)
    for node in ast.walk(tree):
        ok = isinstance(node, allowed)
        if isinstance(node, ast.Name):
            ok = node.id == "L"
        elif isinstance(node, ast.Constant):
            ok = (isinstance(node.value, (int, float)) and not isinstance(node.value, bool)) \
                or (isinstance(node.value, str) and bool(_IDENTIFIER.fullmatch(node.value)))
        elif isinstance(node, ast.Call):
            ok = (isinstance(node.func, ast.Attribute) and node.func.attr in _GUARD_METHODS
                  and not node.keywords
                  and all(isinstance(a, ast.Constant) for a in node.args))
        elif isinstance(node, ast.Attribute):
            ok = node.attr in _GUARD_METHODS
        if not ok:
            fail(f"{where}: guard {quote(code)} is not a plain comparison of input sizes; "
                 "refused (torch would run it as Python code)")


def _check_graph_json(program: Any, where: str) -> None:
    """Walk the serialized ExportedProgram: guard code and symbolic expressions."""
    if not isinstance(program, dict):
        fail(f"{where}: the serialized program is not a JSON object")
    for guard in program.get("guards_code") or []:
        _check_guard(guard, where)
    stack = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "expr_str":
                    _check_sym_expr(value, where)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, (dict, list)))


def _read_entry(archive: zipfile.ZipFile, name: str, limit: int, where: str) -> bytes:
    try:
        info = archive.getinfo(name)
    except KeyError:
        fail(f"{where}: the archive has no entry {quote(name)}")
    if info.file_size > limit:
        fail(f"{where}: archive entry {quote(name)} declares {info.file_size} bytes, more "
             f"than {limit}")
    with archive.open(info) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        fail(f"{where}: archive entry {quote(name)} is larger than {limit} bytes")
    return data


def _read_json(archive: zipfile.ZipFile, name: str, where: str) -> Any:
    data = _read_entry(archive, name, MAX_PT2_JSON_BYTES, where)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        fail(f"{where}: archive entry {quote(name)} is not valid JSON: {clip(str(exc))}")


def _read_payloads(archive: zipfile.ZipFile, prefix: str, directory: str, config_name: str,
                   constants: bool, archive_size: int, where: str) -> dict[str, torch.Tensor]:
    """Tensors of a weights or constants config, built from raw bytes (no pickle)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import deserialize_scalar_type

    config_entry = prefix + directory + config_name
    config = _read_json(archive, config_entry, where)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        fail(f"{where}: {quote(config_entry)} has no 'config' object")
    flat: dict[str, torch.Tensor] = {}
    tensors: dict[str, torch.Tensor] = {}
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
            fail(f"{where}: {quote(config_entry)} entry {quote(fqn)} is malformed")
        entry = prefix + directory + meta["path_name"]
        if meta.get("use_pickle"):
            fail(f"{where}: archive entry {quote(entry)} ({quote(fqn)}) is a pickle; pickled "
                 "weights and constants are never loaded from a bundle (re-export the model "
                 "with plain tensors)")
        if constants and not meta["path_name"].startswith("tensor_"):
            fail(f"{where}: archive entry {quote(entry)} ({quote(fqn)}) is a pickled custom "
                 "or opaque object; it is never loaded from a bundle")
        tensor_meta = meta.get("tensor_meta")
        try:
            dtype = deserialize_scalar_type(schema.ScalarType(tensor_meta["dtype"]))
            sizes = [s["as_int"] for s in tensor_meta["sizes"]]
            strides = [s["as_int"] for s in tensor_meta["strides"]]
            offset = tensor_meta["storage_offset"]["as_int"]
            requires_grad = bool(tensor_meta.get("requires_grad", False))
        except (TypeError, KeyError, ValueError) as exc:
            fail(f"{where}: tensor description of {quote(fqn)} in {quote(config_entry)} is "
                 f"malformed ({type(exc).__name__}: {clip(str(exc))})")
        if not all(type(v) is int and v >= 0 for v in [*sizes, *strides, offset]):
            fail(f"{where}: tensor {quote(fqn)} has invalid sizes/strides/offset "
                 f"{quote((sizes, strides, offset))}")
        if meta["path_name"] not in flat:
            try:
                info = archive.getinfo(entry)
            except KeyError:
                fail(f"{where}: the archive has no entry {quote(entry)} for {quote(fqn)}")
            if info.compress_type != zipfile.ZIP_STORED:
                fail(f"{where}: archive entry {quote(entry)} is compressed; torch stores "
                     "tensor payloads uncompressed")
            data = _read_entry(archive, entry, archive_size, where)
            element = torch.empty((), dtype=dtype).element_size()
            if len(data) == 0:
                numel = math.prod(sizes)
                if numel * element > MAX_SHAPE_ELEMENTS * 8:
                    fail(f"{where}: tensor {quote(fqn)} declares {numel} elements")
                storage = torch.zeros(numel, dtype=dtype)
            else:
                if len(data) % element:
                    fail(f"{where}: archive entry {quote(entry)} holds {len(data)} bytes, not a "
                         f"multiple of the {element}-byte {dtype}")
                storage = torch.frombuffer(bytearray(data), dtype=dtype)
            flat[meta["path_name"]] = storage
        try:
            tensor = torch.as_strided(flat[meta["path_name"]], sizes, strides, offset)
        except RuntimeError as exc:
            fail(f"{where}: tensor {quote(fqn)} does not fit its storage: {clip(str(exc))}")
        if meta.get("is_param"):
            tensor = torch.nn.Parameter(tensor, requires_grad=requires_grad)
        tensors[fqn] = tensor
    return tensors


def load_pt2(path: str) -> Any:
    """The ``torch.export`` program saved at ``path``, loaded without unpickling.

    Returns the ``ExportedProgram``.  Raises :class:`BundleError` for an
    archive holding anything torch would unpickle or run as code.
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    where = f"torch.export archive {quote(path)}"
    size = check_regular_file(path, where).st_size
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        fail(f"{where} is not a readable zip archive: {clip(str(exc))}")
    try:
        with archive:
            if LEGACY_PT2_PROGRAM in archive.namelist():
                program, state_dict, constants, model_entry = _read_legacy_archive(
                    archive, size, where)
            else:
                program, state_dict, constants, model_entry = _read_archive(
                    archive, size, where)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        fail(f"{where} is corrupt: {type(exc).__name__}: {clip(str(exc))}")
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, program)
    except Exception as exc:
        fail(f"{where}: {quote(model_entry)} is not a serialized ExportedProgram: "
             f"{type(exc).__name__}: {clip(str(exc))}")
    # The sample inputs (a pickle) are never read: None means "no example inputs".
    return ExportedProgramDeserializer(None).deserialize(serialized, state_dict, constants, None)


# torch 2.7's torch.export.save writes this flat archive: the program as JSON
# and the state dict and constants as torch.save pickles.  Later releases write
# the PT2 archive read by _read_archive.
LEGACY_PT2_PROGRAM = "serialized_exported_program.json"
LEGACY_PT2_ENTRIES = {LEGACY_PT2_PROGRAM, "serialized_state_dict.pt", "serialized_constants.pt",
                      "serialized_example_inputs.pt", "version"}


def _weights_only_tensors(data: bytes, entry: str, where: str) -> dict[str, torch.Tensor]:
    """A torch.save'd dict of tensors, read by torch's weights-only unpickler.

    That unpickler rebuilds tensors and plain containers only and refuses
    every other global, so a payload that would run code is refused here.
    """
    import io

    if not data:
        return {}
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # the unpickler's refusals are UnpicklingError/RuntimeError
        fail(f"{where}: archive entry {quote(entry)} is not a plain dict of tensors "
             f"(torch's weights-only reader refused it: {clip(str(exc).splitlines()[0])})")
    if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()):
        fail(f"{where}: archive entry {quote(entry)} is not a dict of named tensors")
    return loaded


def _read_legacy_archive(archive: zipfile.ZipFile, size: int, where: str
                         ) -> tuple[Any, dict[str, torch.Tensor], dict[str, torch.Tensor], str]:
    """(model JSON, state dict, constants, model entry name) of a torch 2.7 archive."""
    stray = sorted(e for e in archive.namelist()
                   if e not in LEGACY_PT2_ENTRIES and not e.startswith("extra_files/"))
    if stray:
        fail(f"{where} holds {quote(stray[0])}, which a torch.export archive of torch 2.7 "
             "never holds; refused")
    program = _read_json(archive, LEGACY_PT2_PROGRAM, where)
    _check_graph_json(program, where)
    tensors = [
        _weights_only_tensors(_read_entry(archive, entry, size, where)
                              if entry in archive.namelist() else b"", entry, where)
        for entry in ("serialized_state_dict.pt", "serialized_constants.pt")]
    # serialized_example_inputs.pt (the sample inputs) is never read.
    return program, tensors[0], tensors[1], LEGACY_PT2_PROGRAM


def _read_archive(archive: zipfile.ZipFile, size: int, where: str
                  ) -> tuple[Any, dict[str, torch.Tensor], dict[str, torch.Tensor], str]:
    """(model JSON, state dict, constants, model entry name) of an open PT2 archive."""
    try:
        from torch.export.pt2_archive import constants as names
    except ImportError:
        fail(f"{where} is a PT2 archive of a newer torch than this one "
             f"({torch.__version__}); load it with the torch that exported it")

    entries = archive.namelist()
    if not entries:
        fail(f"{where} is empty")
    prefix = entries[0].split("/", 1)[0] + "/"
    stray = [e for e in entries if not e.startswith(prefix)]
    if stray:
        fail(f"{where} has entries outside its root folder: {quote(stray)}")
    inner = {e[len(prefix):] for e in entries}
    if names.ARCHIVE_VERSION_PATH not in inner:
        fail(f"{where} is not a torch>=2.7 PT2 archive (no {names.ARCHIVE_VERSION_PATH}); "
             "older archives keep their weights as pickles and are not loaded")
    version = _read_entry(archive, prefix + names.ARCHIVE_VERSION_PATH, 64, where)
    if version.decode("utf-8", "replace").strip() != names.ARCHIVE_VERSION_VALUE:
        fail(f"{where} has archive version {quote(version)}, expected "
             f"{names.ARCHIVE_VERSION_VALUE}")
    model = "model"
    refused = sorted(
        e for e in inner
        if e.startswith(names.AOTINDUCTOR_DIR) or e.startswith(names.EXECUTORCH_DIR)
        or e in (f"{names.WEIGHTS_DIR}{model}.pt", f"{names.CONSTANTS_DIR}{model}.pt")
        or e.endswith(".so") or e.endswith(".pkl"))
    if refused:
        fail(f"{where} holds {quote(prefix + refused[0])}, a pickled payload or native "
             "library that loading would run; refused")
    model_entry = prefix + names.MODELS_FILENAME_FORMAT.format(model)
    program = _read_json(archive, model_entry, where)
    _check_graph_json(program, where)
    state_dict = _read_payloads(archive, prefix, names.WEIGHTS_DIR,
                                names.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model)
                                [len(names.WEIGHTS_DIR):], False, size, where)
    constants = _read_payloads(archive, prefix, names.CONSTANTS_DIR,
                               names.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model)
                               [len(names.CONSTANTS_DIR):], True, size, where)
    return program, state_dict, constants, model_entry


