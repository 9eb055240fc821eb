"""``leapp.ExportManager``: leapp 0.7.2's session manager object, over this leapp.

Upstream code reaches the session through one shared ``ExportManager()``
(``ExportManager.is_interpret_graph_enabled()`` in teardown code,
``ExportManager().get_nodes()`` after a compile, its annotation methods).
Here the session lives in the C core, ``leapp.tracing.session_lifecycle`` and ``leapp.compiling.compiler``; this class is a
stateless view of it, so every ``ExportManager()`` is the same object and
reads and writes the current session.

Differences from 0.7.2, by design:

* ``get_nodes()`` returns this leapp's node objects (``leapp._core.Node``:
  ``name``, ``inputs``, ``outputs``, ``is_tracing``, ``node_index``), keyed by
  node name as upstream's are.
* There is no tracing lock (no ``sys.settrace`` tracing), so
  ``reset_tracing_lock()`` has nothing to reset.
* Models are exported and moved into the bundle atomically by
  ``leapp.compile_graph()``: ``compile_models()`` only logs, and
  ``save_models()`` runs that compile (no PNG, no validation).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from . import _core, annotate
from .bundle.log import fatal, logger
from .tracing.annotations import info
from .tracing.session_state import SESSION, SessionConfig


def _as_lists(value: Any) -> Any:
    """A copy of a YAML document with its flow-style tuples as lists (as the YAML loads)."""
    if isinstance(value, dict):
        return {key: _as_lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_lists(item) for item in value]
    return value


def _config() -> SessionConfig:
    """The current session's configuration, created with upstream's defaults if absent."""
    return SESSION.config if SESSION.config is not None else SESSION.configure()


class ExportManager:
    """The session manager of leapp 0.7.2: one shared instance over the current session."""

    _instance: ExportManager | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> ExportManager:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __init__(self) -> None:
        """Nothing to initialise: the state is the session's."""

    # ---- session settings ----------------------------------------------------

    @property
    def GRAPH_NAME(self) -> str:  # noqa: N802 (upstream's attribute name)
        """The graph name (``leapp.start``'s name, without its directory)."""
        return self.get_graph_name()

    @GRAPH_NAME.setter
    def GRAPH_NAME(self, name: str) -> None:  # noqa: N802
        self.set_graph_name(name)

    @property
    def SAVE_PATH(self) -> str | None:  # noqa: N802
        """The bundle directory."""
        return self.get_save_path()

    @SAVE_PATH.setter
    def SAVE_PATH(self, path: str | None) -> None:  # noqa: N802
        self.set_save_path(path)

    @property
    def config_path(self) -> str:
        """Where compile_graph writes the pipeline YAML."""
        return os.path.join(self.get_save_path() or ".", f"{self.get_graph_name()}.yaml")

    @property
    def dry_run(self) -> bool:
        """Whether the session was started with ``dry_run=True``."""
        return bool(_config().dry_run)

    @property
    def non_traced(self) -> set[str]:
        """Nodes kept in the YAML but not exported."""
        return set(_config().non_traced)

    @property
    def patcher(self) -> Any:
        """The session's patcher (``install()`` / ``uninstall()``), None before a session."""
        cfg = SESSION.config
        return cfg.patches[0] if cfg is not None and cfg.patches else None

    def set_graph_name(self, name: str) -> None:
        """Rename the graph (the YAML, PNG and initial-values file names)."""
        SESSION.configure(graph_name=name)

    def get_graph_name(self) -> str:
        """The graph name; ``"my_graph"`` before any session, as upstream."""
        cfg = SESSION.config
        return cfg.graph_name if cfg is not None else "my_graph"

    def set_save_path(self, save_path: str | None) -> None:
        """Set the bundle directory."""
        SESSION.configure(save_dir=save_path)

    def get_save_path(self) -> str | None:
        """The bundle directory, None before any session."""
        cfg = SESSION.config
        return cfg.save_dir if cfg is not None else None

    def ensure_save_path_exists(self) -> None:
        """Create the bundle directory if there is one to create."""
        path = self.get_save_path()
        if path is not None:
            os.makedirs(path, exist_ok=True)

    def configure_logger(self, verbose: bool = False) -> None:
        """Send the ``leapp`` logger to ``<bundle>/log.txt`` and the console."""
        from .bundle import log as _logging
        self.ensure_save_path_exists()
        _logging.configure(self.get_save_path() or ".", verbose)

    def set_dry_run_and_non_traced(self, dry_run: bool, non_traced: Any) -> None:
        """Set dry-run mode and the nodes that are described but not exported."""
        if isinstance(non_traced, str):
            non_traced = [non_traced]
        SESSION.configure(dry_run=bool(dry_run), non_traced=frozenset(non_traced or ()))

    def is_dry_run(self, name: str | None = None) -> bool:
        """Dry run for the session, or (with ``name``) for that node."""
        cfg = SESSION.config
        if cfg is None:
            return False
        return bool(cfg.dry_run) or (name is not None and name in cfg.non_traced)

    def set_max_cached_io(self, max_cached_io: int) -> None:
        """Samples kept per node for validation (the first pass included)."""
        SESSION.configure(max_cached_io=int(max_cached_io))

    # ---- nodes and the session flag -----------------------------------------

    def reset_nodes(self) -> None:
        """Forget every node (and the completion order)."""
        _core.reset_nodes()

    def get_nodes(self) -> dict[str, Any]:
        """The session's nodes, by name (this leapp's ``Node`` objects)."""
        return dict(_core.nodes())

    @classmethod
    def set_interpret_graph(cls, is_enabled: bool) -> None:
        """Turn tracing on or off without starting or stopping the session.

        Turning it off does not put module buffers or patches back; use
        ``leapp.stop()`` for that.  Turning it on needs a started session.
        """
        if is_enabled and SESSION.config is None:
            fatal("ExportManager.set_interpret_graph(True) needs a session: call "
                  "leapp.start() first.")
        _core.set_tracing(bool(is_enabled))

    @classmethod
    def is_interpret_graph_enabled(cls) -> bool:
        """Whether a session is tracing (between ``leapp.start()`` and ``leapp.stop()``)."""
        return bool(_core.is_tracing())

    def reset_tracing_lock(self) -> None:
        """No-op: this leapp has no tracing lock to reset."""
        logger.debug("ExportManager.reset_tracing_lock(): nothing to reset.")

    def restore_pending_buffer_trackers(self) -> None:
        """Put back the buffers of every module tracked with ``annotate.module``."""
        for node in _core.nodes().values():
            for tracker in info(node).trackers:
                tracker.restore()

    def validate_nodes_ready_for_compile(self) -> None:
        """Raise if a node was opened but never finished."""
        unfinished = sorted(n.name for n in _core.nodes().values() if n.is_tracing)
        if unfinished:
            fatal(f"The following nodes were created but never completed: "
                  f"{', '.join(unfinished)}. Did you forget to call output_tensors() or finish "
                  f"the annotated function?", Exception)

    # ---- annotations ---------------------------------------------------------

    def input_tensors(self, node_name: str, tensors: Any) -> Any:
        """``annotate.input_tensors``."""
        return annotate.input_tensors(node_name, tensors)

    def output_tensors(self, node_name: str, tensors: Any, static_outputs: Any = None,
                       **kwargs: Any) -> Any:
        """``annotate.output_tensors``."""
        return annotate.output_tensors(node_name, tensors, static_outputs, **kwargs)

    def register_buffer(self, node_name: str, tensors: Any) -> Any:
        """``annotate.register_buffer``."""
        return annotate.register_buffer(node_name, tensors)

    def state_tensors(self, node_name: str, tensors: Any) -> Any:
        """``annotate.state_tensors``."""
        return annotate.state_tensors(node_name, tensors)

    def update_state(self, node_name: str, tensors: Any) -> Any:
        """``annotate.update_state``."""
        return annotate.update_state(node_name, tensors)

    def module(self, node_name: str, model: Any, buffer_names: list[str] | None = None) -> None:
        """``annotate.module``."""
        return annotate.module(node_name, model, buffer_names)

    def method(self, **params: Any) -> Callable[[Callable], Any]:
        """``annotate.method(**params)`` (keywords only, as upstream's)."""
        return annotate.method(**params)

    def warp_op(self, node_name: str, inputs: list[str] | None = None,
                outputs: list[str] | None = None, **params: Any) -> Any:
        """``annotate.warp_op``."""
        return annotate.warp_op(node_name, inputs, outputs, **params)

    def mirror_leapp_tags(self, source: Any, target: Any) -> Any:
        """``annotate.mirror_leapp_tags``."""
        return annotate.mirror_leapp_tags(source, target)

    # ---- compile steps -------------------------------------------------------

    def _last_compile(self) -> Any:
        return SESSION.last_compile

    def set_detected_graph(self, models: dict, pipeline: dict) -> None:
        """Record the YAML documents of a compiled graph (``detected_nodes`` / ``_pipeline``)."""
        SESSION.record_compile(models=dict(models["models"]),
                               pipeline=dict(pipeline["pipeline"]))

    @property
    def detected_nodes(self) -> dict:
        """The ``models`` document of the last ``compile_graph()``."""
        last = self._last_compile()
        if "models" not in last:
            raise AttributeError("detected_nodes: no graph has been compiled in this session")
        return _as_lists(last["models"])

    @property
    def detected_pipeline(self) -> dict:
        """The ``pipeline`` document of the last ``compile_graph()``."""
        last = self._last_compile()
        if "pipeline" not in last:
            raise AttributeError("detected_pipeline: no graph has been compiled in this session")
        return _as_lists(last["pipeline"])

    def get_io_descriptions(self) -> dict:
        """``{"models": {node: {inputs, outputs, parameters}}}``.

        After ``compile_graph()`` it is the YAML's ``models`` document; before,
        the nodes' descriptions without model files.
        """
        last = self._last_compile()
        if "models" in last:
            return {"models": _as_lists(last["models"])}
        from .compiling.compiler import model_entry
        save = self.get_save_path() or "."
        nodes = sorted(_core.nodes().values(), key=lambda n: n.node_index)
        return {"models": _as_lists({n.name: model_entry(n, None, save, save) for n in nodes})}

    def compile_models(self) -> None:
        """No-op: ``save_models()`` / ``leapp.compile_graph()`` export and save in one step."""
        logger.info("ExportManager.compile_models(): models are exported by save_models() / "
                    "leapp.compile_graph().")

    def save_models(self) -> None:
        """Export every node and write the bundle (``compile_graph`` without PNG or validation)."""
        if self.get_save_path() is None:
            fatal("Error: No save path provided, please provide a save path to export the graph",
                  Exception)
        from .compiling.compiler import compile_graph
        compile_graph(visualize=False, validate=False)

    def validate_all_models(self, rtol: float = 1e-3, atol: float = 1e-5,
                            strict: bool = True) -> dict:
        """Validate the models of the last ``compile_graph(validate=False)`` / ``save_models()``.

        Returns ``{node: True | False | exception}``; ``strict`` raises when one fails.
        A ``compile_graph()`` that validated already released its models.
        """
        if not _core.nodes():
            logger.error("No nodes to validate")
            return {}
        entries = self._last_compile().get("entries")
        if entries is None:
            fatal("validate_all_models(): no exported models to validate. Call "
                  "leapp.compile_graph(validate=False) (or ExportManager().save_models()) "
                  "first; a compile_graph() that validated already released its models.",
                  Exception)
        from .compiling.validation import validate_models
        return validate_models(entries, rtol=rtol, atol=atol, strict=strict)
