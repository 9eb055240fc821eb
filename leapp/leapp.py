"""``leapp.leapp``: leapp 0.7.2's module of the lifecycle functions, as aliases.

``start``, ``stop``, ``compile_graph`` and ``annotate`` are the objects the
``leapp`` package exports; ``_MANAGER`` is the shared ``ExportManager()``
(upstream's own tests reach the session through it).
"""
from __future__ import annotations

from . import annotate
from .export_manager import ExportManager
from .compiling.compiler import compile_graph
from .tracing.session_lifecycle import start, stop

_MANAGER: ExportManager = ExportManager()

__all__ = ["start", "stop", "compile_graph", "annotate"]
