"""The `leapp` logger: log.txt in the bundle, the console, and fatal().

Rules (docs/api.md, "Logging"):

* Everything goes to ``log.txt`` of the running session at DEBUG, whatever
  the console shows.
* Records propagate as for any library logger.  When the application has
  configured logging (a handler on ``leapp`` or on one of its ancestors, e.g.
  ``logging.basicConfig``), leapp adds no output of its own: records at or
  above the ``leapp`` logger's effective level reach the application's
  handlers once.  When nothing is configured, leapp prints through its own
  console handler (one at most) to stderr, as libraries do (and as upstream
  does), from the ``PROGRESS`` level up (or the level set on the ``leapp``
  logger): a script's stdout stays its own, also when it is piped.  Inside a
  notebook (an IPython kernel) the lines below WARNING and the artifacts
  record go to stdout, the cell's plain output, and warnings and errors to
  stderr.
* ``verbose=True`` (``leapp.start``, ``compile_graph``) lowers that threshold
  to DEBUG in both cases.
* Levels: DEBUG graph dumps, internals and third-party warnings raised while
  compiling, INFO steps, SECTION (25) section headers, PROGRESS (26) one line
  per compiled node (both below WARNING: ``basicConfig(level=logging.WARNING)``
  hides them, ``level=INFO`` shows them), SYSTEM (31, upstream's level, above
  WARNING) the record of the written artifacts: the application's handlers get
  it as upstream's do, and leapp's own console prints it with the other lines
  (stdout only in a notebook).
* While compile_graph's progress bar shows (leapp's own console only, see
  leapp.compiling.progress), leapp's console lines are written through the bar, so the
  two never overwrite each other.
* FATAL records are errors leapp raises: they are written to log.txt and
  never reach a console or the application's handlers (the exception carries
  the message, so it prints once).
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from typing import Callable, NoReturn, TextIO

SECTION = 25
PROGRESS = 26
SYSTEM = 31   # upstream's level: the artifacts record passes a WARNING threshold
FATAL = logging.ERROR + 1
logging.addLevelName(SECTION, "SECTION")
logging.addLevelName(PROGRESS, "PROGRESS")
logging.addLevelName(SYSTEM, "SYSTEM")
logging.addLevelName(FATAL, "FATAL")

_FORMAT = "[%(levelname)s]: %(message)s"
_COLOURS = {
    SECTION: "\033[1;4;37m",
    logging.WARNING: "\033[1;33m",
    logging.ERROR: "\033[91m",
    FATAL: "\033[91m",
    logging.CRITICAL: "\033[1;31m",
}


class _State:
    file_handler: logging.Handler | None = None
    path: str | None = None      # <bundle>/log.txt, the log's final place
    private: str | None = None   # the session's own file while not writing in place
    verbose: bool = False
    # While a progress bar shows: writes one console line (text, stream) around it.
    console_writer: Callable[[str, TextIO], None] | None = None


def in_notebook() -> bool:
    """Whether this process is a notebook's kernel (IPython running in ipykernel)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001  (an IPython without a shell: no notebook)
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


class _ConsoleHandler(logging.Handler):
    """leapp's own console output when the application configured none.

    The stream is looked up at each record (notebooks and test runners swap
    sys.stdout / sys.stderr): stderr, as for any library; in a notebook the
    records below WARNING (and SYSTEM) go to stdout, the cell's plain output.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            quiet = record.levelno < logging.WARNING or record.levelno == SYSTEM
            stream = sys.stdout if quiet and in_notebook() else sys.stderr
            text = self.format(record)
            code = _COLOURS.get(record.levelno)
            if code and getattr(stream, "isatty", lambda: False)():
                text = f"{code}{text}\033[0m"
            writer = _State.console_writer
            if writer is not None:
                writer(text, stream)
                return
            stream.write(text + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001  (logging must never raise)
            self.handleError(record)


_CONSOLE = _ConsoleHandler()
_CONSOLE.setFormatter(logging.Formatter(_FORMAT))


def _own(handler: logging.Handler) -> bool:
    """A handler leapp itself manages (log.txt, its console), wherever it is attached."""
    return handler is _State.file_handler or handler is _CONSOLE


class _LeappLoggerMixin:
    """Routing of the `leapp` logger's records (see the module docstring)."""

    def _application_handlers(self) -> list:
        """The handlers a record of this logger propagates to, leapp's own left out."""
        found, current = [], self
        while current is not None:
            found.extend(h for h in current.handlers if not _own(h))
            if not current.propagate:
                break
            current = current.parent
        return found

    def _console_threshold(self, configured: bool) -> int:
        if _State.verbose:
            return logging.DEBUG
        if configured:                   # the application's configuration decides
            return self.getEffectiveLevel()  # type: ignore[attr-defined]
        return self.level or PROGRESS    # type: ignore[attr-defined]

    def isEnabledFor(self, level: int) -> bool:
        if self.disabled or self.manager.disable >= level:  # type: ignore[attr-defined]
            return False
        if _State.file_handler is not None:
            return True                  # log.txt takes everything
        if level == FATAL:
            return False                 # raised, not printed
        return level >= self._console_threshold(bool(self._application_handlers()))

    def handle(self, record: logging.LogRecord) -> None:
        if self.disabled or not self.filter(record):  # type: ignore[attr-defined]
            return
        handler = _State.file_handler
        if handler is not None and record.levelno >= handler.level:
            handler.handle(record)
        if record.levelno == FATAL:
            return                       # an error leapp raises: the exception shows it
        targets = self._application_handlers()
        if record.levelno < self._console_threshold(bool(targets)):
            return
        if not targets:
            targets = [_CONSOLE]
        for target in targets:           # what Logger.callHandlers does, once per handler
            if record.levelno >= target.level:
                target.handle(record)


def _install(log: logging.Logger) -> logging.Logger:
    """Give the `leapp` logger the routing above, keeping its class's own behaviour."""
    cls = type(log)
    if not issubclass(cls, _LeappLoggerMixin):
        log.__class__ = type(f"Leapp{cls.__name__}", (_LeappLoggerMixin, cls), {})
    return log  # level and propagate stay the application's (NOTSET and True by default)


logger = _install(logging.getLogger("leapp"))


def write_console_through(writer: Callable[[str, TextIO], None] | None) -> None:
    """Have leapp's console lines written by writer(text, stream) (None: directly)."""
    _State.console_writer = writer


def prints_itself(level: int) -> bool:
    """Whether a record at level reaches the console through leapp's own handler
    (no handler of the application's takes it; the console threshold lets it by)."""
    log = logger
    if log.disabled or log.manager.disable >= level:
        return False
    if log._application_handlers():  # type: ignore[attr-defined]
        return False
    return level >= log._console_threshold(False)  # type: ignore[attr-defined]


def holds_bundle(directory: str) -> bool:
    """Whether directory holds a compiled bundle (a YAML) whose log.txt is not ours yet."""
    try:
        return any(name.endswith(".yaml") for name in os.listdir(directory))
    except OSError:
        return False


def _private_file() -> str:
    handle, path = tempfile.mkstemp(prefix="leapp-session-", suffix=".log")
    os.close(handle)
    return path


def _open(path: str, mode: str) -> None:
    """Point the file handler at path (mode "w" or "a")."""
    handler = logging.FileHandler(path, mode=mode, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(_FORMAT))
    old = _State.file_handler
    if old is not None:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    _State.file_handler = handler


def configure(directory: str, verbose: bool) -> None:
    """Send every record to <directory>/log.txt; set the console verbosity.

    When directory already holds a compiled bundle, its log.txt belongs to that
    bundle until a compile replaces it: the session logs to a file of its own,
    which compile_graph() publishes as log.txt with the new bundle.
    """
    close()
    path = os.path.join(directory, "log.txt")
    _State.path = path
    if holds_bundle(directory):
        _State.private = _private_file()
        _open(_State.private, "w")
    else:
        _open(path, "w")
    set_verbose(verbose)


def set_verbose(verbose: bool) -> None:
    """Console threshold DEBUG when verbose (see the module docstring otherwise)."""
    _State.verbose = bool(verbose)


def _current_file() -> str | None:
    handler = _State.file_handler
    return handler.baseFilename if handler is not None else None


def detach() -> None:
    """Log to a private copy from now on (compile_graph: nothing goes into the bundle)."""
    current = _current_file()
    if current is None or _State.private is not None:
        return
    private = _private_file()
    _State.file_handler.flush()
    shutil.copyfile(current, private)
    _open(private, "a")
    _State.private = private


def snapshot(destination: str) -> None:
    """Copy the session's log so far to destination."""
    current = _current_file()
    if current is None:
        return
    _State.file_handler.flush()
    shutil.copyfile(current, destination)


def attach(path: str, copy: bool = False) -> None:
    """Log into path (the committed bundle's log.txt) again; drop the private file.

    copy: write the private file's content to path first (path holds no bundle's log).
    """
    private = _State.private
    if private is None or _State.file_handler is None:
        return
    if copy:
        snapshot(path)
    _open(path, "a")
    _State.private = None
    _remove(private)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def close() -> None:
    """Close log.txt (or the private log) of the previous session."""
    handler = _State.file_handler
    if handler is not None:
        logger.removeHandler(handler)
        handler.close()
    if _State.private is not None:
        _remove(_State.private)
    _State.file_handler = _State.path = _State.private = None


@atexit.register
def _drop_private() -> None:
    """A session's private log is never published after the process ends."""
    if _State.private is not None:
        _remove(_State.private)


def log_path() -> str | None:
    """Where log.txt ends up (<bundle>/log.txt), if a session configured it."""
    return _State.path


def _only_the_file_takes(level: int) -> logging.Handler | None:
    """log.txt's handler when a record at level would reach it and nothing else: no
    application handler, below the console threshold, no filter on the logger or on
    log.txt's handler (None otherwise)."""
    handler = _State.file_handler
    log = logger
    if handler is None or handler.filters or log.filters or log.disabled \
            or log.manager.disable >= level or level < handler.level \
            or handler.formatter is None or handler.formatter._fmt != _FORMAT:
        return None
    if log._application_handlers():  # type: ignore[attr-defined]
        return None
    if level >= log._console_threshold(False):  # type: ignore[attr-defined]
        return None
    return handler


def log_messages(messages: list[tuple[str, str]]) -> None:
    """Log ``(level name, text)`` pairs in order, as ``getattr(logger, level)(text)`` would.

    A run of INFO lines that only log.txt takes (compile's one line per connection, 200
    for a 200-node chain) is written to it in one write, formatted as its handler formats
    a record: the same bytes without a record per line.
    """
    run: list[str] = []

    def write_run() -> None:
        handler = _only_the_file_takes(logging.INFO)
        if handler is None:
            for text in run:
                logger.info(text)
        else:
            lines = "".join(_FORMAT % {"levelname": "INFO", "message": text} + "\n"
                            for text in run)
            handler.acquire()
            try:
                handler.stream.write(lines)  # type: ignore[attr-defined]
                handler.flush()
            finally:
                handler.release()
        run.clear()

    for level, text in messages:
        if level == "info":
            run.append(text)
            continue
        if run:
            write_run()
        getattr(logger, level)(text)
    if run:
        write_run()


def section(message: str) -> None:
    logger.log(SECTION, message + "\n")


def system(message: str) -> None:
    logger.log(SYSTEM, message)


# The one way leapp raises an error it reports: fatal() logs it to log.txt at FATAL
# (never to a console: the exception carries the message), then raises it.  A
# kind of error raised in many places has one helper of its own that names the
# kind (as psutil's C helpers do): reject() below for refused values,
# _safe_load.fail() for a malformed bundle (BundleError).


def fatal(message: str, error_type: type[BaseException] = RuntimeError,
          cause: BaseException | None = None) -> NoReturn:
    """Write message to log.txt at FATAL, then raise error_type(message) (printed once)."""
    logger.log(FATAL, message)
    raise error_type(message) from cause


def reject(message: str) -> NoReturn:
    """fatal() for a value leapp refuses: a ValueError."""
    fatal(message, ValueError)
