"""The `leapp` logger: log.txt in the bundle, a console handler, and fatal()."""
from __future__ import annotations

import logging
import os
import sys
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
    file_handler: logging.Handler | None = None
    console_handler: logging.Handler | None = None
    path: str | None = None


def configure(directory: str, verbose: bool) -> None:
    """Send every record to <directory>/log.txt (truncated) and warnings to stderr."""
    close()
    path = os.path.join(directory, "log.txt")
    file_handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    file_handler.setLevel(logging.DEBUG)
    file_handler.setFormatter(logging.Formatter(_FORMAT))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(_ConsoleFormatter(sys.stderr.isatty()))
    logger.addHandler(file_handler)
    logger.addHandler(console)
    _State.file_handler, _State.console_handler, _State.path = file_handler, console, path
    set_verbose(verbose)


def set_verbose(verbose: bool) -> None:
    """Console threshold: DEBUG when verbose, WARNING otherwise."""
    if _State.console_handler is not None:
        _State.console_handler.setLevel(logging.DEBUG if verbose else logging.WARNING)


def close() -> None:
    """Detach and close the handlers of the previous session."""
    for handler in (_State.file_handler, _State.console_handler):
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()
    _State.file_handler = _State.console_handler = _State.path = None


def log_path() -> str | None:
    """Where log.txt is being written, if a session configured it."""
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
