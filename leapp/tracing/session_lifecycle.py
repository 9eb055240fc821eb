"""leapp.start() and leapp.stop(): a tracing session begun (its configuration, patches,
the C core's tracing switch, nn.Module attribute probes) and ended (all of that undone, the
traced tensors plain again).  Compiling what it traced is leapp.compiling.compiler's."""
from __future__ import annotations

import os
from typing import Any

from .. import _core
from ..bundle import log as _logging
from ..bundle.log import fatal, logger
from . import escapes as _escapes, guards as _guards
from .annotations import API, check_session_thread, info
from .session_state import SESSION, SessionConfig


def _resolve_name(name: Any, save_path: str) -> tuple[str, str]:
    """(graph name, bundle directory) from a name that may be a path."""
    if not isinstance(name, str):
        fatal(f"leapp.start(name=...) must be a string, got {type(name).__name__}", TypeError)
    stripped = name.strip().rstrip("/\\")
    if not stripped or stripped in (".", ".."):
        fatal(f"leapp.start(name={name!r}) does not contain a usable graph name", ValueError)
    graph = os.path.basename(stripped)
    if not graph or graph in (".", ".."):
        fatal(f"leapp.start(name={name!r}) resolved to an empty graph name basename",
              ValueError)
    parent = os.path.dirname(stripped)
    directory = os.path.join(save_path, parent, graph) if not os.path.isabs(stripped) \
        else stripped
    return graph, directory


def start(name: str, save_path: str = ".", verbose: bool = False, dry_run: bool = False,
          non_traced: list[str] | None = None, max_cached_io: int = 5,
          global_patching: bool = True, patching: list | None = None,
          strict: bool | None = None, strict_guards: bool | None = None) -> None:
    """Start a tracing session; artifacts go to {save_path}/{name}/.

    Calling start() while a session runs resets the graph (with a warning).
    strict=True (default: the LEAPP_STRICT environment variable) makes an
    input computed outside every node from a node's output an error instead of
    a warning.  strict_guards=True (default: the LEAPP_STRICT_GUARDS environment
    variable) refuses every traced value read into Python inside a node (a
    branch on it, int(), .item(), a data-dependent size), which is otherwise
    baked into the export with a warning (docs/tracing.md).
    """
    if strict is None:
        strict = os.environ.get("LEAPP_STRICT", "").strip().lower() in ("1", "true", "yes", "on")
    if strict_guards is None:
        strict_guards = os.environ.get("LEAPP_STRICT_GUARDS", "").strip().lower() in (
            "1", "true", "yes", "on")
    graph, directory = _resolve_name(name, save_path)
    if not isinstance(max_cached_io, int) or max_cached_io < 1:
        fatal(f"leapp.start(max_cached_io=...) must be an int >= 1, got {max_cached_io!r}",
              ValueError)
    try:
        os.makedirs(directory, exist_ok=True)
    except PermissionError as exc:
        fatal(f"leapp.start(): cannot create the bundle directory {directory}: permission "
              f"denied (leapp.start(name, save_path=...) chooses another directory)",
              PermissionError, cause=exc)
    was_running = _core.is_tracing()
    if was_running:
        _teardown_session()
    _logging.configure(directory, verbose)
    if was_running:
        logger.warning("LEAPP graph interpretation is already enabled, calling start() again "
                       "will reset the graph")
        logger.warning("Resetting graph...")
    if dry_run:
        logger.info("Starting dry run mode")
    from .patching import Patcher
    patcher = Patcher(global_patching, patching or [])
    config = SessionConfig(graph, directory, verbose, dry_run, frozenset(non_traced or ()),
                           max_cached_io, global_patching, (patcher,), strict=bool(strict),
                           strict_guards=bool(strict_guards))
    _guards.Options.strict = bool(strict_guards)
    _core.release_traced()  # tensors left traced by a session never stopped
    _core.reset_nodes()
    _core.set_tracing(True)
    _escapes.install()  # nn.Module.__setattr__ probed for nodes' first passes
    try:
        SESSION.start(config)
    except BaseException:
        _core.set_tracing(False)
        raise


def _teardown_session() -> None:
    """Put back module buffers and patched functions; tracing off; traced tensors plain."""
    API.close_tails()  # states whose late update never came stay regular inputs
    _core.set_tracing(False)
    _escapes.reset()
    for node in _core.nodes().values():
        for tracker in info(node).trackers:
            tracker.restore()
    SESSION.stop()
    # The user's tensors promoted in place, and every traced value they hold,
    # become plain torch.Tensors again: compile_graph() reads the nodes' op
    # logs and ports, never the tensors' carriers.
    released = _core.release_traced()
    logger.debug("%d traced tensors made plain again", released)


def stop() -> None:
    """Stop tracing; restores module buffers and patched functions."""
    if not _core.is_tracing():
        fatal("leapp.stop() called with no active tracing session — did you call "
              "leapp.start()?")
    check_session_thread("leapp.stop()")
    _teardown_session()
