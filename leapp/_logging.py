"""The `leapp` logger: log.txt in the bundle, a console handler, and fatal()."""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from typing import NoReturn

SECTION = 25
SYSTEM = 31
FATAL = logging.ERROR + 1
logging.addLevelName(SECTION, "SECTION")
logging.addLevelName(SYSTEM, "SYSTEM")
logging.addLevelName(FATAL, "FATAL")

logger = logging.getLogger("leapp")
logger.setLevel(logging.DEBUG)
logger.propagate = True

_FORMAT = "[%(levelname)s]: %(message)s"
_COLOURS = {
    SECTION: "\033[1;4;37m",
    logging.WARNING: "\033[1;33m",
    logging.ERROR: "\033[91m",
    FATAL: "\033[91m",
    logging.CRITICAL: "\033[1;31m",
}


class _ConsoleFormatter(logging.Formatter):
    """Colour the level and message on a terminal, plain text elsewhere."""

    def __init__(self, colour: bool) -> None:
        super().__init__(_FORMAT)
        self._colour = colour

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        code = _COLOURS.get(record.levelno) if self._colour else None
        return f"{code}{text}\033[0m" if code else text


class _State:
    file_handler: logging.FileHandler | None = None
    console_handler: logging.Handler | None = None
    path: str | None = None      # <bundle>/log.txt, the log's final place
    private: str | None = None   # the session's own file while not writing in place


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
    """Send every record to <directory>/log.txt and warnings to stderr.

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
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(_ConsoleFormatter(sys.stderr.isatty()))
    logger.addHandler(console)
    _State.console_handler = console
    set_verbose(verbose)


def set_verbose(verbose: bool) -> None:
    """Console threshold: DEBUG when verbose, WARNING otherwise."""
    if _State.console_handler is not None:
        _State.console_handler.setLevel(logging.DEBUG if verbose else logging.WARNING)


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
    """Detach and close the handlers of the previous session."""
    for handler in (_State.file_handler, _State.console_handler):
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()
    if _State.private is not None:
        _remove(_State.private)
    _State.file_handler = _State.console_handler = _State.path = _State.private = None


@atexit.register
def _drop_private() -> None:
    """A session's private log is never published after the process ends."""
    if _State.private is not None:
        _remove(_State.private)


def log_path() -> str | None:
    """Where log.txt ends up (<bundle>/log.txt), if a session configured it."""
    return _State.path


def section(message: str) -> None:
    logger.log(SECTION, message + "\n")


def system(message: str) -> None:
    logger.log(SYSTEM, message)


def fatal(message: str, error_type: type[BaseException] = RuntimeError,
          cause: BaseException | None = None) -> NoReturn:
    """Log message at FATAL level, then raise error_type(message)."""
    logger.log(FATAL, message)
    raise error_type(message) from cause
