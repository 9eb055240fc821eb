"""The one owner of a tracing session's Python-side state.

``SESSION`` (a :class:`Session`) holds what ``leapp.start()`` was given (the
:class:`SessionConfig`, its patches included), the NumPy switch the traced
array reads, the documents of the last ``compile_graph()`` and the staging
directories of compiles running in this process.  ``start`` and ``stop`` are
its writers; a compile records its result through :meth:`Session.record_compile`
and announces its staging directory through :meth:`Session.stage` /
:meth:`Session.unstage`; the
upstream ``ExportManager`` setters go through :meth:`Session.configure`.  Every
other module reads it, and the exporters read none of it: ``compile_graph``
passes them what they need.

Nothing here imports the rest of the package: it sits below every module
that reads it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class SessionConfig:
    """What leapp.start() was given (replaced, never changed in place)."""

    graph_name: str
    save_dir: str
    verbose: bool = False
    dry_run: bool = False
    non_traced: frozenset = frozenset()
    max_cached_io: int = 5
    global_patching: bool = True
    patches: tuple = ()
    strict: bool = False          # refuse inputs computed outside every node (docs/api.md)
    strict_guards: bool = False   # refuse values read into Python (docs/tracing.md)


class Session:
    """The session's state: configuration, patches, NumPy switch, last compile, staging."""

    __slots__ = ("config", "numpy_patching", "_last_compile", "_live_staging")

    def __init__(self) -> None:
        self.config: SessionConfig | None = None
        #: True while a session with global_patching has its patches installed.
        self.numpy_patching = False
        self._last_compile: dict[str, Any] = {}
        self._live_staging: set[str] = set()

    # ---- writers -------------------------------------------------------------

    def start(self, config: SessionConfig) -> None:
        """A new session: its configuration; the last compile forgotten; patches installed."""
        self.config = config
        self._last_compile.clear()
        for patcher in config.patches:
            patcher.install()
        self.numpy_patching = bool(config.global_patching and config.patches)

    def stop(self) -> None:
        """Patches put back (the configuration stays: compile_graph() reads it)."""
        self.numpy_patching = False
        if self.config is not None:
            for patcher in self.config.patches:
                patcher.uninstall()

    def configure(self, **fields: Any) -> SessionConfig:
        """The configuration with fields replaced (upstream's ExportManager setters);
        upstream's defaults when no session was started."""
        base = self.config if self.config is not None else SessionConfig("my_graph", None)  # type: ignore[arg-type]
        self.config = dataclasses.replace(base, **fields)
        return self.config

    def record_compile(self, **documents: Any) -> None:
        """The last compile's documents (models, pipeline, entries), replacing or updating
        the recorded ones (``ExportManager.set_detected_graph`` records two of them)."""
        self._last_compile.update(documents)

    def stage(self, path: str) -> None:
        """path is a live staging directory (never "stale") until unstage(path)."""
        self._live_staging.add(path)

    def unstage(self, path: str) -> None:
        """path is no longer a live staging directory."""
        self._live_staging.discard(path)

    # ---- readers -------------------------------------------------------------

    @property
    def last_compile(self) -> Mapping[str, Any]:
        """The last compile's documents: "models", "pipeline" and "entries" (the
        validation entries, only when it did not validate)."""
        return self._last_compile

    @property
    def live_staging(self) -> frozenset[str]:
        """Staging directories of compiles running in this process."""
        return frozenset(self._live_staging)


SESSION = Session()
