"""Where annotations are called from: call sites, and telling code run again.

A node re-enters only from where its first trace declared inputs (a call
site, or the code of an @annotate.method function); when the origins differ
only as re-executed code would (a notebook cell run again), the error says so.
"""
from __future__ import annotations

from typing import Any

from .. import _core
from ..bundle.log import fatal
from . import frames
from .node_info import info


RERUN_HINT = (
    "\nThis looks like edited code run again (e.g. a notebook cell): the node keeps the "
    "call site of its first trace. Call leapp.start() again to reset the session and rerun.")


def call_site() -> tuple:
    """(file, line) of the nearest frame outside the leapp package."""
    return frames.user_site(1, torch_too=False)


def check_origin(node: _core.Node, origin: Any) -> None:
    """A node re-enters only from where its first trace declared inputs."""
    origins = info(node).origins
    if node.is_tracing:
        origins.add(origin)
    elif origin not in origins:
        where = ", ".join(sorted(_origin_text(o) for o in origins))
        fatal(f"Error: node '{node.name}' is being called from a different annotation "
              f"origin than the first trace ({_origin_text(origin)}; first traced from "
              f"{where}). Cannot reuse a node name from a different call site. Give the "
              f"node at this call site its own name."
              + (RERUN_HINT if _rerun_like(origin, origins) else ""))


def _cell_file(filename: Any) -> bool:
    """Whether filename names code compiled from a notebook cell or a string."""
    name = str(filename)
    return name.startswith("<") or "ipykernel_" in name or "<ipython-input-" in name


def _rerun_like(origin: Any, origins: set) -> bool:
    """Whether origin differs from the first trace's only as re-executed code would."""
    for first in origins:
        if origin[0] == "method" and first[0] == "method":
            new, old = origin[1], first[1]
            if getattr(new, "co_name", None) == getattr(old, "co_name", 0) and (
                    getattr(new, "co_filename", None) == getattr(old, "co_filename", 0)
                    or (_cell_file(getattr(new, "co_filename", ""))
                        and _cell_file(getattr(old, "co_filename", "")))):
                return True
        elif origin[0] != "method" and first[0] != "method":
            if _cell_file(origin[0]) and _cell_file(first[0]):
                return True
    return False


def _origin_text(origin: Any) -> str:
    if origin[0] == "method":
        code = origin[1]
        return f"@annotate.method {getattr(code, 'co_name', code)}"
    return f"{origin[0]}:{origin[1]}"
