"""What compile_graph() shows while it runs: one line per node, a progress bar.

* One line per node as it finishes (exported or reused, then validated), at
  the PROGRESS level of the `leapp` logger: the node, its backend, the export
  seconds and the validation verdict.  It goes to log.txt always and to the
  console as any leapp record does (leapp/bundle/log.py: stderr, stdout only in
  a notebook, so a script's piped stdout stays its own): shown by default,
  hidden by ``logging.getLogger("leapp").setLevel(logging.WARNING)`` or an
  application's ``basicConfig(level=logging.WARNING)``.
* A progress bar over the whole compile (every export, the bundle's files,
  every validation), from ``tqdm.auto``: a widget in notebooks, a text bar on a
  terminal.  It shows only where leapp prints through its own console handler
  (an application that configured logging gets plain lines, nothing else) and
  where it can redraw in place (a notebook or a terminal: redirected output
  and CI logs get the lines only).  TQDM_DISABLE=1 hides it.
* ``compile_graph(verbose=False)`` turns both off for that compile: the lines
  still go to log.txt (at INFO).

Warnings raised while compiling (torch's and pytree's FutureWarnings,
TorchScript's notices, ...) and the records torch's and ONNX's own loggers
emit below ERROR (torchvision notices of the ONNX exporter) are written to
log.txt at DEBUG, never to the console (verbose=True shows them):
third_party_to_log().
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Any, Iterator

from ..bundle import log as _logging
from ..bundle.log import PROGRESS, logger
from ..tracing import escapes as _escapes
from .result import verdict


def _bar_class() -> Any:
    """tqdm.auto's class (the notebook widget in Jupyter), or None without tqdm."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from tqdm.auto import tqdm
    except ImportError:
        return None
    for warning in caught:  # e.g. "IProgress not found": tqdm falls back to text
        logger.debug("tqdm: %s", warning.message)
    return tqdm


def _tqdm_disabled() -> bool:
    """TQDM_DISABLE as tqdm reads it (any non-empty value)."""
    return bool(os.environ.get("TQDM_DISABLE", ""))


# Loggers of the libraries compile_graph drives; their records below ERROR are
# notices about the export (e.g. "torchvision is not installed. Skipping ...").
_THIRD_PARTY = ("torch", "onnx", "onnxscript", "onnx_ir", "onnxruntime")


class _ToLogTxt(logging.Filter):
    """A handler filter: a third-party record below ERROR goes to log.txt instead."""

    def __init__(self) -> None:
        super().__init__()
        self.doing: list[str] = []   # what the compile is doing, innermost last
        self.last: logging.LogRecord | None = None  # one record may reach several handlers

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or record.name.split(".", 1)[0] not in _THIRD_PARTY:
            return True
        if record is not self.last:
            self.last = record
            logger.debug("%s logged while %s: %s: %s", record.name,
                         self.doing[-1] if self.doing else "compiling", record.levelname,
                         record.getMessage())
        return False


class _Diversion:
    filter: _ToLogTxt | None = None  # installed by the outermost third_party_to_log()


def _third_party_handlers() -> list[logging.Handler]:
    """The console handlers a third-party library's record can reach (lastResort too).

    Files (torch's structured trace, an application's log file) keep their records.
    """
    handlers: list[logging.Handler] = list(logging.getLogger().handlers)
    for name, item in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(item, logging.Logger) and name.split(".", 1)[0] in _THIRD_PARTY:
            handlers.extend(item.handlers)
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    consoles = [h for h in handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler) and _console(h.stream)]
    return list({id(h): h for h in consoles}.values())


def _console(stream: Any) -> bool:
    if stream is None:
        return False
    if any(stream is s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@contextlib.contextmanager
def third_party_to_log(while_doing: str) -> Iterator[None]:
    """Warnings and third-party log records of the block go to log.txt (DEBUG).

    Warnings are recorded and logged; the filters in force still apply (an
    ignored warning stays ignored, one turned into an error still raises).
    Records of torch's and ONNX's loggers below ERROR are taken off every
    handler they could reach for the duration of the block.
    """
    divert = _Diversion.filter
    handlers: list[logging.Handler] = []
    if divert is None:
        divert = _Diversion.filter = _ToLogTxt()
        handlers = _third_party_handlers()
        for handler in handlers:
            handler.addFilter(divert)
    divert.doing.append(while_doing)
    try:
        with warnings.catch_warnings(record=True) as caught:
            try:
                yield
            finally:
                for warning in caught:
                    logger.debug("warning while %s: %s:%s: %s: %s", while_doing,
                                 warning.filename, warning.lineno, warning.category.__name__,
                                 warning.message)
    finally:
        divert.doing.pop()
        if handlers:
            for handler in handlers:
                handler.removeFilter(divert)
            _Diversion.filter = None


# The backend of a node described without a model (bring-your-own, no model_path).
NO_MODEL = "no model"


def _verdict(result: Any) -> str:
    if result is True or result is False or isinstance(result, BaseException):
        return f"validation {verdict(result).strip().splitlines()[0]}"[:200]
    return "not validated"


class CompileProgress:
    """The lines and the bar of one compile_graph().

    nodes: the names of the nodes that will be exported, in order; validate:
    whether they will be validated (each line then waits for the verdict);
    quiet: compile_graph(verbose=False).
    """

    def __init__(self, graph: str, nodes: list[str], validate: bool, quiet: bool,
                 one_pass: set[str] | frozenset = frozenset()) -> None:
        self.nodes = list(nodes)
        self.one_pass = set(one_pass)  # nodes traced on one pass only
        self.validate = validate
        self.level = logging.INFO if quiet else PROGRESS
        self.rows: dict[str, tuple[str, float, bool]] = {}
        self.bar: Any = None
        if quiet or not self.nodes or _tqdm_disabled() or not _logging.prints_itself(PROGRESS):
            return
        tqdm = _bar_class()
        if tqdm is None:
            return
        widget = any(base.__module__ == "tqdm.notebook" for base in tqdm.__mro__)
        stream = sys.stderr
        if not widget and not getattr(stream, "isatty", lambda: False)():
            return  # a file or a pipe: the lines are the progress
        steps = 2 * len(self.nodes) + 1 if validate else len(self.nodes) + 1
        self.shown: Any = None  # the widget's display handle: updated when the bar closes
        try:
            self.bar = tqdm(total=steps, desc=f"compile {graph}", file=stream, leave=True,
                            bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]",
                            dynamic_ncols=True, **({"display": False} if widget else {}))
            if widget:  # shown with a handle, so that its plain-text form ends at 100 %
                from IPython.display import display
                self.shown = display(self.bar.container, display_id=True)
                self.bar.displayed = True
        except Exception as exc:  # noqa: BLE001  (a front end without widgets: lines only)
            logger.debug("No progress bar: %s: %s", type(exc).__name__, exc)
            self.bar = None
            return
        _logging.write_console_through(lambda text, to: tqdm.write(text, file=to))

    def _show(self, doing: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(doing, refresh=True)

    def _advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def exporting(self, node: str) -> None:
        self._show(f"exporting {node}")

    def exported(self, node: str, backend: str, seconds: float, reused: bool) -> None:
        self.rows[node] = (backend, seconds, reused)
        self._advance()
        if not self.validate:
            self._line(node, None)

    def writing(self) -> None:
        self._show("writing the bundle")

    def written(self) -> None:
        self._advance()

    def validating(self, node: str) -> None:
        if node in self.rows:
            self._show(f"validating {node}")

    def validated(self, node: str, result: Any) -> None:
        if node in self.rows:
            self._advance()
            self._line(node, result)

    def _line(self, node: str, result: Any) -> None:
        backend, seconds, reused = self.rows[node]
        index = self.nodes.index(node) + 1 if node in self.nodes else len(self.rows)
        if backend == NO_MODEL:
            how = "described without a model"
        elif reused:
            how = f"reused from the previous compile ({seconds:.2f} s)"
        else:
            how = f"exported in {seconds:.2f} s"
        if not self.validate:
            verdict = "not validated"
        elif backend == NO_MODEL:
            verdict = "nothing to validate"
        else:
            verdict = _verdict(result)
        logger.log(self.level, "%d/%d %s (%s): %s, %s", index, len(self.nodes), node, backend,
                   how, verdict)
        if node in self.one_pass and backend != NO_MODEL:
            logger.log(self.level, "    %s was traced on one pass only: validated on one "
                       "sample, so branches, Python numbers read from traced values and "
                       "state kept in Python between calls are unchecked%s (trace two "
                       "passes; docs/tracing.md)", node, _escapes.one_pass_note(node))

    def close(self) -> None:
        """Take the bar down (it stays on screen, finished or where it stopped)."""
        bar, self.bar = self.bar, None
        _logging.write_console_through(None)
        if bar is not None:
            bar.set_postfix_str("", refresh=False)
            bar.close()
            shown, self.shown = getattr(self, "shown", None), None
            if shown is not None:
                shown.update(bar.container)  # the text fallback now reads where it ended
