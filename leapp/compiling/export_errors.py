"""A torch exporter call: its console output to log.txt, its failure as one clear error.

torch's exporters fail often and badly: the TorchScript ONNX exporter prints the
whole TorchScript IR on stderr from C++ before it raises, its error classes do
not rebuild from a message, and the real cause (the op) sits in the middle of
a multi-line dump.  ``exporter_call(node, backend, module)`` wraps one call of
an exporter (torch.onnx.export, torch.export.export, torch.jit.script / trace):

* everything the call writes on the console (Python's sys.stdout / sys.stderr
  and the process's file descriptors 1 and 2, where torch's C++ writes) goes
  to log.txt at DEBUG instead, with the full traceback of a failure;
* a failure becomes one ``ExportError``: the node, the backend, the op that
  failed (read from torch's message and found in the node's graph) with where
  the node was traced, torch's message in one line, and the fix.

compile_graph adds to that error the backends that do export the node
(leapp.compiling.backend_survey).  The file descriptors are the process's: a
line another thread prints while an exporter runs lands in log.txt too.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
import traceback
from typing import Any, Iterator

from ..bundle.log import logger

# How long torch's message may be in the one-line summary.
REASON_CHARS = 300


class ExportError(RuntimeError):
    """A backend could not export a node.

    Attributes: node, backend (canonical name), op (the failing op's name, or
    None when torch's message names none), calls (how the node's graph calls
    that op), reason (torch's message in one line), fix (the change a known
    cause asks for, or ''), where (where the node was traced, or ''), others
    (what the other backends did with the node: leapp.compiling.backend_survey,
    or None when not tried) and error (torch's own exception; its traceback is
    in log.txt).
    """

    def __init__(self, message: str, node: str = "", backend: str = "", op: str | None = None,
                 reason: str = "", fix: str = "", error: BaseException | None = None,
                 calls: tuple = (), where: str = "", others: Any = None) -> None:
        super().__init__(message)
        self.node = node
        self.backend = backend
        self.op = op
        self.reason = reason
        self.fix = fix
        self.error = error
        self.calls = tuple(calls)
        self.where = where
        self.others = others

    __module__ = "leapp"  # shown and pickled as leapp.ExportError, its public name

    def __reduce__(self) -> Any:  # picklable (torch's exception left out)
        return (type(self), (str(self), self.node, self.backend, self.op, self.reason,
                             self.fix, None, self.calls, self.where, None))

    def with_context(self, where: str = "", others: Any = None,
                     advice: str = "") -> "ExportError":
        """This error with where the node was traced and what the other backends did
        (advice: the sentence naming them) in its message."""
        return compose(self.node, self.backend, self.op, self.calls, self.reason, self.fix,
                       self.error, where or self.where, others, advice)


def compose(node: str, backend: str, op: str | None, calls: tuple, reason: str, fix: str,
            error: BaseException | None, where: str = "", others: Any = None,
            advice: str = "") -> ExportError:
    """The ExportError and its message: the node, the backend, the op and where it was
    traced, torch's message in one line, the fix and the backends that work."""
    what = f"op `{op}`" if op else "the export"
    if calls:
        what += f" ({', '.join(calls)})"
    if where:
        what += f", in the node whose inputs are declared at {where},"
    lines = [f"node '{node}' cannot be exported with backend '{backend}': {what} failed.",
             f"  torch says: {reason}"]
    if fix:
        lines.append(f"  Fix: {fix}.")
    if advice:
        prefix = "" if advice.startswith("No backend") else ("Or: " if fix else "Fix: ")
        lines.append(f"  {prefix}{advice}")
    if not fix and not advice:
        lines.append("  Fix: export this node with another backend (export_with=...), or "
                     "change the code that uses the op; torch's full output is in log.txt.")
    return ExportError("\n".join(lines), node=node, backend=backend, op=op, reason=reason,
                       fix=fix, error=error, calls=calls, where=where, others=others)


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    """The process's C library (ctypes), or None where it cannot be opened."""
    try:
        import ctypes
        return ctypes.CDLL(None)
    except (OSError, AttributeError, TypeError):
        return None


def _flush_c_stdio() -> None:
    """fflush(NULL): C stdio buffers (std::cout) reach the descriptors before they move."""
    libc = _libc()
    if libc is not None:
        try:
            libc.fflush(None)
        except (AttributeError, TypeError, OSError):  # no fflush to call: nothing buffered
            pass


@contextlib.contextmanager
def console_to_log(label: str) -> Iterator[None]:
    """What the block writes on the console goes to log.txt at DEBUG (see the module)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    python_out, python_err = sys.stdout, sys.stderr
    buffer = io.StringIO()
    sink = tempfile.TemporaryFile(mode="w+b")
    saved: list[tuple[int, int]] = []
    try:
        _flush_c_stdio()
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
            except OSError:  # a closed descriptor: nothing of it to capture
                pass
        sys.stdout = sys.stderr = buffer
        yield
    finally:
        sys.stdout, sys.stderr = python_out, python_err
        _flush_c_stdio()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        sink.seek(0)
        written = sink.read().decode("utf-8", "replace") + buffer.getvalue()
        sink.close()
        if written.strip():
            logger.debug("console output of %s (%d lines):\n%s", label,
                         written.count("\n") + 1, written.rstrip())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torch.onnx's summary of the error that stopped the export: "<class 'a.b.Name'>: message"
_SUMMARY = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>: (.+)")


def one_line(error: BaseException) -> str:
    """torch's message of error in one line: the IR, the graph excerpts and the
    invitation to file an issue left out (they are in log.txt); for the dynamo
    ONNX exporter, the error its exception summary names first."""
    text = _ANSI.sub("", str(error)) or type(error).__name__
    name = type(error).__name__
    if "## Exception summary" in text:
        match = _SUMMARY.search(text.split("## Exception summary", 1)[1])
        if match:
            name, text = match.group(1), match.group(2)
    for cut in ("[Caused by the value", "Please feel free to request support",
                "\n\nInputs:", "\nSet TORCHDYNAMO_VERBOSE", "\nfrom user code:",
                "\n\nWhile executing", "\nOriginal traceback:", "\n\nThe following"):
        head, found, _ = text.partition(cut)
        if found and head.strip():
            text = head
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # a TorchScript frontend message puts the cause first, then the source excerpt
    text = " ".join(lines[:3]) if lines else type(error).__name__
    text = " ".join(text.split())
    if len(text) > REASON_CHARS:
        text = text[:REASON_CHARS - 3].rstrip() + "..."
    return f"{name}: {text}"


# The op torch's message names, most specific first.
_OP_PATTERNS = (
    re.compile(r"ONNX export of operator (\w+)"),
    re.compile(r"Exporting the operator '?(?:aten::)?(\w+)'? to ONNX"),
    re.compile(r"(?:No|no) (?:decomposition|symbolic function|ONNX function) \w* ?for "
               r"['\"<]?(?:aten|torch\.ops\.aten)[:.]+(\w+)"),
    re.compile(r"Unknown builtin op: aten::(\w+)"),
    re.compile(r"(?:torch\.ops\.)?aten[:.]{1,2}(\w+)"),
    re.compile(r"torch\.nn\.functional\.(\w+)"),
    re.compile(r"(?:function|method|builtin) '?(?:torch\.)?(\w+)'? (?:is not|isn't) supported"),
)


def failing_op(error: BaseException, module: Any = None) -> str | None:
    """The op torch's message names (e.g. ``adaptive_avg_pool2d``), or None."""
    text = _ANSI.sub("", str(error))
    if "## Exception summary" in text:  # the dynamo exporter: the error it summarises
        text = text.split("## Exception summary", 1)[1]
    for pattern in _OP_PATTERNS:
        match = pattern.search(text)
        if match:
            return _base_name(match.group(1))
    if module is not None:  # a TorchScript source excerpt: the fx line it points at
        return _op_from_excerpt(text, module)
    return None


def _base_name(name: str) -> str:
    """adaptive_avg_pool2d for adaptive_avg_pool2d.default / _adaptive_avg_pool2d."""
    name = name.split(".", 1)[0]
    return name.lstrip("_") or name


def _op_from_excerpt(text: str, module: Any) -> str | None:
    """The op of the fx node assigned on the line a '~~~ <--- HERE' excerpt points at."""
    names = {n.name: n for n in getattr(getattr(module, "graph", None), "nodes", ())}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if "<--- HERE" in line or re.fullmatch(r"\s*~+\s*(<---.*)?", line or "x"):
            for source in reversed(lines[max(0, index - 3):index]):
                match = re.match(r"\s*(\w+)\s*=", source)
                if match and match.group(1) in names:
                    return _target_name(names[match.group(1)])
    return None


def _same_op(name: str, op: str) -> bool:
    """Whether an fx target name and an op torch names are one op (linalg_inv_ex is
    torch.linalg.inv, fft_rfft torch.fft.rfft)."""
    def norm(text: str) -> str:
        text = text.lstrip("_")
        text = re.sub(r"_(ex|default|out)$", "", text)
        return re.sub(r"^(linalg|fft|special|nn)_", "", text)
    return norm(name) == norm(op)


def _target_name(node: Any) -> str:
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return _base_name(str(name))


def op_calls(module: Any, op: str) -> list[str]:
    """How the node's graph calls op: ``torch.nn.functional.adaptive_avg_pool2d`` ..."""
    found: list[str] = []
    for node in getattr(getattr(module, "graph", None), "nodes", ()):
        if node.op not in ("call_function", "call_method") or not _same_op(_target_name(node),
                                                                             op):
            continue
        target = node.target
        if isinstance(target, str):
            text = f"Tensor.{target}"
        else:
            owner = getattr(target, "__module__", None) or ""
            owner = {"torch._C._nn": "torch._C._nn", "torch._C._VariableFunctions": "torch",
                     "torch._C._linalg": "torch.linalg", "torch._C._special": "torch.special",
                     "torch._C._fft": "torch.fft"}.get(owner, owner)
            name = str(getattr(target, "__name__", target))
            prefix = owner.rsplit(".", 1)[-1] + "_"  # torch.linalg's linalg_inv is inv
            if owner.count(".") and name.startswith(prefix):
                name = name[len(prefix):]
            text = f"{owner}.{name}" if owner else str(target)
        if text not in found:
            found.append(text)
    return found


# Known causes: (op pattern, message pattern, fix).
_FIXES = (
    (r"adaptive_(avg|max)_pool", r"factor|divis",
     "choose an output size that divides the input size (or a fixed-size pool / "
     "interpolation)"),
    (r".*", r"inference tensor",
     "create the model's tensors outside torch.inference_mode() (torch.no_grad() there "
     "instead): torch's exporters refuse inference tensors"),
    (r".*", r"data.dependent|guard|GuardOnDataDependent",
     "replace the data-dependent size or branch with a fixed one (docs/tracing.md)"),
)


def fix_for(backend: str, op: str | None, reason: str) -> str:
    """The change to the model that a known cause asks for, or ''."""
    for op_pattern, reason_pattern, fix in _FIXES:
        if re.search(op_pattern, op or "") and re.search(reason_pattern, reason, re.I):
            return fix
    return ""


def where_traced(origins: Any) -> str:
    """'traced from policy.py:27' from a node's annotation origins (file, line)."""
    places = []
    for origin in sorted(origins or (), key=str):
        if origin and origin[0] == "method":
            places.append(f"@annotate.method {getattr(origin[1], 'co_name', origin[1])} "
                          f"({getattr(origin[1], 'co_filename', '?')}:"
                          f"{getattr(origin[1], 'co_firstlineno', '?')})")
        elif origin and len(origin) == 2:
            places.append(f"{origin[0]}:{origin[1]}")
    return ", ".join(places)


def describe(node: str, backend: str, error: BaseException,
             module: Any = None) -> ExportError:
    """The ExportError for torch's error raised exporting node with backend."""
    op = failing_op(error, module)
    reason = one_line(error)
    calls = tuple(op_calls(module, op)) if op else ()
    chain: list[str] = []  # the causes torch's wrappers hide
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        chain.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    return compose(node, backend, op, calls, reason, fix_for(backend, op, " ".join(chain)),
                   error)


@contextlib.contextmanager
def exporter_call(node: str, backend: str, module: Any = None) -> Iterator[None]:
    """One call of torch's exporter for node: console to log.txt, failure as ExportError.

    ExportError and leapp's own errors raised inside pass through unchanged.
    """
    try:
        with console_to_log(f"exporting {node} with {backend}"):
            yield
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001  (torch's exporters raise anything)
        if _leapps_own(error, node):
            raise
        logger.debug("%s: torch's error exporting with %s:\n%s", node, backend,
                     "".join(traceback.format_exception(type(error), error,
                                                        error.__traceback__)).rstrip())
        raise describe(node, backend, error, module) from None


def _leapps_own(error: BaseException, node: str) -> bool:
    """An error leapp raised itself: raised in leapp's code and naming the node (torch's
    C++ errors surface in the Python frame that called torch, which may be leapp's)."""
    if node not in str(error):
        return False
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package + os.sep)
