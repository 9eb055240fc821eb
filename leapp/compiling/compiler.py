"""leapp.compile_graph(): the traced nodes exported, wired, written, validated and
committed as one bundle.  (The session it compiles is begun and ended by leapp.start() and
leapp.stop(), leapp.tracing.session_lifecycle.)"""
from __future__ import annotations

import os
import platform
import shutil
import sys
import time
from typing import Any

import torch

from .. import _core
from . import incremental as _incremental, publish as _publish
from ..bundle import log as _logging
from ..bundle.digest import file_digests
from ..bundle.log import fatal, logger, section
from .progress import NO_MODEL, CompileProgress, third_party_to_log
from ..tracing.annotations import info
from ..tracing.session_state import SESSION, SessionConfig
from .threads import intra_op_threads, validation_threads
from .torch_caches import release_export_caches
from .._version import __version__
from ..bundle.pipeline import Pipeline
from ..bundle.semantics import GraphConfigs
from .validation import SavedModel, run_validation
from ..bundle.analytics import Analytics

__config_version__ = "1.3"

def _os_description() -> str:
    try:
        release = platform.freedesktop_os_release()
        pretty = f"{release.get('NAME', '')} {release.get('VERSION_ID', '')}".strip()
        if pretty:
            return pretty
    except OSError:
        pass
    return platform.system()


def system_information() -> dict:
    """The `system information` document, keys sorted."""
    info_ = {
        "cuda version": str(torch.version.cuda),
        "leapp config version": __config_version__,
        "leapp version": __version__,
        "os": _os_description(),
        "python version": f"{sys.version_info.major}.{sys.version_info.minor}."
                          f"{sys.version_info.micro}",
        "torch version": str(torch.__version__),
        "warp version": None,
    }
    return dict(sorted(info_.items()))


def _backend_label(export_with: str | None, result: Any) -> str:
    """The backend a progress line names: canonical, or what a bring-your-own file is."""
    from .backends import CANONICAL
    if export_with is not None:
        label = CANONICAL.get(export_with, str(export_with))
        fallback = getattr(result, "fallback", None)
        return f"{label} (torch's exporter: {fallback})" if fallback else label
    return f"own {result.yaml_backend} file" if result.path else NO_MODEL


def _export_nodes(nodes: list, work_dir: str, cache: _incremental.Cache,
                  progress: CompileProgress) -> dict:
    """Export every node into work_dir (or reuse its unchanged file); {node name: Exported}."""
    from .backends import ExportContext, export_node
    exported = {}
    section(f"Discovered {len(nodes)} nodes")
    cfg = SESSION.config
    non_traced = cfg.non_traced if cfg is not None else frozenset()
    context = ExportContext(cfg.save_dir if cfg is not None else os.path.dirname(work_dir),
                            bool(cfg is not None and cfg.verbose))
    for node in nodes:
        node_info = info(node)
        if node.name in non_traced:
            continue  # described and wired, never exported
        section(f"Compiling {node.name}")
        progress.exporting(node.name)
        inputs = [p.value for p in node.inputs]
        started = time.perf_counter()
        try:
            with third_party_to_log(f"exporting {node.name}"), \
                    _incremental.collect_notes() as notes:
                module = node_info.graph_module.module
                key = _incremental.key_of(node, node_info.export_with,
                                          node_info.backend_params, module)
                result = cache.reuse(node, key)
                if result is None:
                    result = export_node(node.name, node_info.export_with,
                                         node_info.backend_params, module, inputs,
                                         [p.name for p in node.inputs],
                                         [p.name for p in node.outputs], work_dir, context)
                    cache.remember(node, key, result, notes)
        except Exception as exc:  # one clear error, with the backends that do export it
            from .backend_survey import export_failed
            export_failed(node, exc)
        result.seconds = time.perf_counter() - started
        exported[node.name] = result
        progress.exported(node.name, _backend_label(node_info.export_with, result),
                          result.seconds, node.name in cache.reused)
        logger.info("Success\n")
    return exported


class Renames:
    """The exporters' port renames, applied to the compiled documents (the traced nodes
    keep their names): ONNX may rename a port or drop an input it does not use."""

    def __init__(self, nodes: list, exported: dict) -> None:
        #: "node/port" -> final name (None: the input was dropped), one mapping per side
        self.inputs: dict[str, str | None] = {}
        self.outputs: dict[str, str] = {}
        for node in nodes:
            result = exported.get(node.name)
            if result is None:
                continue
            dropped = set(result.dropped_inputs)
            for port, name in zip(node.inputs, result.input_names):
                if name in dropped or name != port.name:
                    self.inputs[f"{node.name}/{port.name}"] = None if name in dropped else name
            for port, name in zip(node.outputs, result.output_names):
                if name != port.name:
                    self.outputs[f"{node.name}/{port.name}"] = name

    def inputs_of(self, node: Any) -> list[tuple[Any, str]]:
        """(port, final name) of the node's inputs its model kept, in order."""
        named = [(p, self.inputs.get(f"{node.name}/{p.name}", p.name)) for p in node.inputs]
        return [(p, name) for p, name in named if name is not None]

    def outputs_of(self, node: Any) -> list[tuple[Any, str]]:
        """(port, final name) of the node's outputs, in order."""
        return [(p, self.outputs.get(f"{node.name}/{p.name}", p.name)) for p in node.outputs]


def _described(port: Any, name: str) -> dict:
    entry = port.describe()
    entry["name"] = name
    return entry


def model_entry(node: Any, result: Any, bundle_dir: str, work_dir: str,
                 renames: Renames | None = None) -> dict:
    """The YAML entry of one node (inputs, outputs, parameters), with the exporter's
    port names."""
    path = md5 = sha = backend = None
    extra: dict = {}
    if result is not None:
        backend, extra = result.yaml_backend, result.parameters
        if result.path is not None:
            md5, sha = file_digests(result.path, ("md5", "sha256"))
            written_here = os.path.dirname(os.path.abspath(result.path)) == work_dir
            path = os.path.basename(result.path) if written_here \
                else os.path.relpath(result.path, bundle_dir)
    parameters = {"model_path": path, "md5sum": md5, "sha256sum": sha, "backend": backend,
                  "warp_segments": 0}
    parameters.update(extra)
    if renames is None:
        return {"inputs": [p.describe() for p in node.inputs],
                "outputs": [p.describe() for p in node.outputs],
                "parameters": parameters}
    return {
        "inputs": [_described(p, name) for p, name in renames.inputs_of(node)],
        "outputs": [_described(p, name) for p, name in renames.outputs_of(node)],
        "parameters": parameters,
    }


def _save_initial_values(nodes: list, pipeline: dict, work_dir: str, bundle: str,
                         graph: str, renames: Renames) -> str | None:
    """Write <graph>_initial_values.safetensors into work_dir; its name, or None."""
    if not pipeline["feedback_flow"]:
        return None
    from safetensors.torch import save_file
    by_key = {f"{n.name}/{name}": p for n in nodes for p, name in renames.inputs_of(n)}
    tensors = {}
    for targets in pipeline["feedback_flow"].values():
        for key in targets:
            tensors[key] = by_key[key].value.contiguous()
    filename = f"{graph}_initial_values.safetensors"
    logger.info("Saving feedback initial values to %s", os.path.join(bundle, filename))
    save_file(tensors, os.path.join(work_dir, filename))
    return filename


def _checkpoint(phase: str) -> None:
    """A named point of compile_graph() (a no-op; tests interrupt compiles here).

    Phases, in order: "staged" (the staging directory exists), "exported" (every
    node written), "written" (YAML, initial values, PNG, carried files),
    "validated", "ready" (log.txt written: the next step is the commit) and
    "committed" (the new bundle is in place, the old one not yet removed).
    """


def _stage(cfg: SessionConfig, nodes: list, staging: str, bundle: str, skip_export: bool,
           visualize: bool, graph_configs: GraphConfigs | None,
           progress: CompileProgress) -> tuple[dict, dict, Pipeline, set, Renames]:
    """Write the whole new bundle into staging; (exported, models, pipeline, reused nodes,
    the exporters' renames).  The nodes are read, never written."""
    cache = _incremental.Cache(bundle, staging, _incremental.enabled())
    exported = {} if skip_export else _export_nodes(nodes, staging, cache, progress)
    cache.write()
    progress.writing()
    _checkpoint("exported")
    section("Processing Node Connections Using Traced Output Ports")
    renames = Renames(nodes, exported)
    built = _core.build_pipeline(nodes, renames.inputs, renames.outputs)
    _logging.log_messages(built["messages"])
    pipeline: dict = {}
    if graph_configs is not None:
        pipeline["configs"] = graph_configs.to_dict()
    pipeline["data_flow"] = built["data_flow"]
    pipeline["feedback_flow"] = built["feedback_flow"]
    initial = None if skip_export else _save_initial_values(
        nodes, built, staging, bundle, cfg.graph_name, renames)
    if initial is not None:
        pipeline["initial_values"] = initial
    pipeline["inputs"] = built["inputs"]
    pipeline["outputs"] = built["outputs"]
    if not skip_export:  # each model carries its contract, written before its checksums
        from .contract_stamp import stamp_compiled
        ports = {n.name: {"inputs": [_described(p, name) for p, name in renames.inputs_of(n)],
                          "outputs": [_described(p, name) for p, name in renames.outputs_of(n)]}
                 for n in nodes}
        stamp_compiled(cfg.graph_name, nodes, exported, pipeline, staging, cache,
                       {"leapp config version": __config_version__, "leapp version": __version__},
                       ports)
        cache.write()
    section(f"Compiling graph parameters for {len(nodes)} nodes")
    models = {n.name: model_entry(n, exported.get(n.name), bundle, staging, renames)
              for n in nodes}
    stats = built["statistics"]
    section("Graph Statistics")
    logger.info("- Computation nodes: %d", stats["computation_nodes"])
    logger.info("- Dangling inputs: %d", stats["dangling_inputs"])
    logger.info("- Dangling outputs: %d", stats["dangling_outputs"])
    logger.info("- Internal connections: %d", stats["internal_connections"])
    logger.info("- Total edges: %d", stats["total_edges"])
    model = Pipeline.from_compile(models, pipeline, system_information())
    with open(os.path.join(staging, f"{cfg.graph_name}.yaml"), "w", encoding="utf-8") as handle:
        handle.write(model.to_yaml())
    from .deploy_check import log_compile
    log_compile(model, None if skip_export else staging, bundle)
    if visualize:
        _visualize(staging, bundle, cfg.graph_name, model)
    written = os.listdir(staging)
    in_place: set[str] = set()
    for entry in models.values():
        in_place |= _publish.inside(entry["parameters"]["model_path"])
    _publish.carry_foreign(bundle, staging, cfg.graph_name, in_place)
    _publish.finish_modes(staging, bundle, written + ["log.txt"])
    progress.written()
    return exported, models, model, cache.reused, renames


def compile_graph(visualize: bool = True, verbose: bool | None = None, validate: bool = True,
                  dry_run: bool = False, rtol: float = 1e-3, atol: float = 1e-5,
                  strict: bool = True, graph_configs: GraphConfigs | None = None,
                  fuse: bool = False) -> Any:
    """Export every node, write the YAML, the initial values, the PNG and validate.

    visualize=True also writes <graph>.html, the interactive view (leapp.drawing.html,
    docs/visualization.md), after validation.

    The new bundle is built beside the old one and validated there, each model
    loaded as InferenceManager loads it; then it replaces the old bundle in one
    step (leapp.compiling.publish).  An error before that leaves the old bundle as it was;
    a full disk raises BundleWriteError (an OSError) naming the bundle.  A node
    unchanged since the previous compile into the bundle reuses its checked file
    (leapp.compiling.incremental); every node is validated all the same.  Progress: a line
    per node and a bar (leapp.compiling.progress); verbose=False turns both off.

    fuse=True also writes <graph>_fused.onnx, the whole pipeline as one model
    (leapp.fuse, docs/fuse.md), validated against the bundle and recorded in
    the YAML, in the same commit.

    Returns {node: True | False | exception} when validating (a CompileResult: a
    dict that also displays inline in notebooks), else True.
    """
    cfg, nodes = _compilable(graph_configs, verbose)
    skip_export = cfg.dry_run or dry_run
    bundle = os.path.realpath(cfg.save_dir)
    graph = cfg.graph_name
    os.makedirs(os.path.dirname(bundle), exist_ok=True)
    _publish.check_same_filesystem(bundle)
    _logging.detach()
    _publish.clean_stale(bundle, graph, SESSION.live_staging)
    staging = _publish.make_staging(bundle, graph)
    SESSION.stage(staging)
    committed = False
    results: dict = {}
    failure = None
    closed = None
    analytics = None
    progress = CompileProgress(
        graph, [] if skip_export else [n.name for n in nodes if n.name not in cfg.non_traced],
        validate=validate, quiet=verbose is False,
        one_pass={n.name for n in nodes if info(n).passes == 1})
    try:
        _checkpoint("staged")
        try:
            with third_party_to_log(f"compiling {graph}"):
                with intra_op_threads(1):  # copies and compiling: see leapp.compiling.threads
                    exported, models, pipeline, reused, renames = _stage(
                        cfg, nodes, staging, bundle, skip_export, visualize, graph_configs,
                        progress)
                _checkpoint("written")
                entries = _saved_entries(nodes, exported, models, renames, staging)
                if validate and not skip_export:
                    analytics = Analytics()
                    results, failure, closed = _validate_staged(
                        nodes, entries, exported, staging, graph, rtol, atol, progress,
                        analytics)
                    if strict and failure is not None:
                        logger.log(_logging.FATAL, failure)
            _checkpoint("validated")
            _finish_staged(cfg, nodes, exported, models, pipeline, staging, bundle,
                           fuse and not skip_export, visualize, not skip_export, analytics)
            _publish.commit(staging, bundle, graph)
        except Exception as exc:
            if _publish.disk_full(exc):
                error = _publish.full_disk_error(bundle, exc)
                logger.log(_logging.FATAL, str(error))
                raise error from exc
            raise
        committed = True
        _checkpoint("committed")
    finally:
        _close_staging(progress, staging, bundle, committed, skip_export)
    for _, model, _, _ in entries:
        if isinstance(model, SavedModel):
            model.yaml_dir = bundle  # the committed files
            model.release()
    SESSION.record_compile(models=models, pipeline=pipeline.pipeline_section(),
                           entries=None if skip_export or validate else entries)
    if skip_export or not validate:
        return True
    if strict and failure is not None:
        raise Exception(failure)
    from .result import compile_result
    return compile_result(results, cfg.graph_name, cfg.save_dir, models,
                          {name: e.seconds for name, e in exported.items()}, visualize,
                          reused, closed.summary() if closed is not None else None)


def _closed_loop(staging: str, graph: str, entries: list, nodes: list, random_ops: dict,
                 rtol: float, atol: float, exported: dict, analytics: Analytics) -> Any:
    """The staged bundle replayed over the traced steps.  Running is a later stage: the
    closed loop (leapp.running.closed_loop) is its one door for compiling."""
    from ..running.closed_loop import run_closed_loop
    return run_closed_loop(os.path.join(staging, f"{graph}.yaml"), entries,
                           {n.name: info(n).passes for n in nodes if n.name in exported},
                           random_ops, rtol, atol,
                           any(e.external for e in exported.values()), analytics,
                           {n.name: dict(info(n).changed_feedback) for n in nodes
                            if info(n).changed_feedback})


def _draws(node: Any) -> bool:
    """Whether a node's exported graph holds a random op: one whose draws never reach
    an output (an action sampled and discarded, rl_games' player) was pruned away."""
    from .onnx_writer.emit import may_draw_random
    module = info(node).graph_module
    if module is None:
        return True
    return any(n.op == "call_function" and may_draw_random(n.target)
               for n in module.module.graph.nodes)


def _compilable(graph_configs: GraphConfigs | None,
                verbose: bool | None) -> tuple[SessionConfig, list]:
    """compile_graph's preconditions checked: (the session's config, its nodes in trace
    order); applies ``verbose``."""
    if _core.is_tracing():
        fatal("LEAPP graph interpretation is enabled. Call leapp.stop() before "
              "leapp.compile_graph().")
    cfg = SESSION.config
    if cfg is None:
        fatal("leapp.compile_graph() called before leapp.start(): nothing was traced.")
    if graph_configs is not None and not isinstance(graph_configs, GraphConfigs):
        fatal("compile_graph(graph_configs=...) expects a GraphConfigs instance", TypeError)
    if verbose is not None:
        _logging.set_verbose(verbose)
    all_nodes = list(_core.nodes().values())
    unfinished = [n.name for n in all_nodes if n.is_tracing]
    if unfinished:
        fatal(f"The following nodes were created but never completed: {set(unfinished)}. Did "
              f"you forget to call output_tensors() or finish the annotated function?")
    return cfg, sorted(all_nodes, key=lambda n: n.node_index)


def _saved_entries(nodes: list, exported: dict, models: dict, renames: Any,
                   staging: str) -> list:
    """Per node (name, its staged SavedModel or None, input names, output names)."""
    return [(n.name, SavedModel(n.name, models[n.name], staging,
                                allow_external=exported[n.name].external)
             if n.name in exported and exported[n.name].path else None,
             [p for p, _ in renames.inputs_of(n)], list(n.outputs))
            for n in nodes]


def _validate_staged(nodes: list, entries: list, exported: dict, staging: str, graph: str,
                     rtol: float, atol: float,
                     progress: CompileProgress, analytics: Analytics) -> tuple[dict, Any, Any]:
    """Every staged model run on its node's traced examples, then (when all pass) the
    whole bundle closed-loop, each recorded in analytics: (results, failure or None, the
    closed-loop report or None)."""
    random_ops = {n.name: info(n).random_ops for n in nodes
                  if n.name in exported and info(n).random_ops and _draws(n)}
    closed = None
    with intra_op_threads(validation_threads(staging, [
            r.path for r in exported.values() if r.external and r.path])):
        writers = {name: e.writer for name, e in exported.items() if e.writer is not None}
        results, failure = run_validation(entries, rtol, atol, observer=progress,
                                          random_ops=random_ops, writers=writers,
                                          analytics=analytics)
        if failure is None:
            closed = _closed_loop(staging, graph, entries, nodes, random_ops, rtol, atol,
                                  exported, analytics)
            if not closed.passed:
                results[closed.node] = False
                failure = f"Closed-loop validation failed: {closed.difference}"
    return results, failure, closed


def _finish_staged(cfg: SessionConfig, nodes: list, exported: dict, models: dict,
                   pipeline: Any, staging: str, bundle: str, fuse: bool,
                   visualize: bool, record_artifacts: bool,
                   analytics: Analytics | None) -> None:
    """What the staged bundle gets after validation: its analytics file (when it was
    validated), the fused model, the artifacts' log lines (none in a dry run, as
    upstream), log.txt and the view; then it is ready to commit."""
    graph = cfg.graph_name
    if analytics is not None:  # <graph>_analytics.json: what the view and inspect read
        _publish.finish_modes(staging, bundle, [analytics.write(staging, graph)])
    if fuse:
        _fuse_staged(staging, bundle, graph, any(e.external for e in exported.values()))
    if record_artifacts:
        _log_artifacts(cfg, bundle, nodes, exported, models)
    _logging.snapshot(os.path.join(staging, "log.txt"))
    if visualize:  # <graph>.html, from the staged files and log.txt (leapp.drawing.html)
        from ..drawing.html import write_staged
        write_staged(pipeline, graph, staging, bundle, _publish.finish_modes)
    _checkpoint("ready")


def _close_staging(progress: CompileProgress, staging: str, bundle: str, committed: bool,
                   skip_export: bool) -> None:
    """After a compile, committed or not: the staging directory goes, the log follows the
    bundle, the export caches are released."""
    progress.close()
    shutil.rmtree(staging, ignore_errors=True)
    SESSION.unstage(staging)
    log_file = os.path.join(bundle, "log.txt")
    if committed:
        _logging.attach(log_file)
    elif os.path.isdir(bundle) and not _logging.holds_bundle(bundle):
        _logging.attach(log_file, copy=True)  # no bundle there to protect
    if not skip_export:
        release_export_caches()  # repeated compiles keep memory flat


def _visualize(work_dir: str, bundle: str, graph: str, model: Pipeline) -> None:
    path = os.path.join(work_dir, f"{graph}.png")
    try:
        from ..drawing.png import draw
        draw(model, path, graph)
        logger.info("Graph visualization saved as: %s", os.path.join(bundle, f"{graph}.png"))
    except Exception as exc:  # the bundle is still useful without its picture
        if _publish.disk_full(exc):
            raise
        logger.error("Graph visualization failed for '%s': %s: %s", graph,
                     type(exc).__name__, exc)


def _log_artifacts(cfg: SessionConfig, bundle: str, nodes: list, exported: dict,
                   models: dict) -> None:
    """Log where the bundle's files will be once committed (final paths)."""
    directory = os.path.abspath(cfg.save_dir)
    lines = ["LEAPP export artifacts saved:", f"Export directory: {directory}",
             f"Graph YAML: {directory}/{cfg.graph_name}.yaml"]
    saved = [(n.name, models[n.name]["parameters"]["model_path"]) for n in nodes
             if n.name in exported and exported[n.name].path]
    if saved:
        lines.append("Models:")
        for name, path in saved:  # relative to the bundle, or a BYOM file's own path
            lines.append(f"- {name}: {os.path.normpath(os.path.join(directory, path))}")
    else:
        lines.append("Models: none")
    missing = [n.name for n in nodes if n.name not in dict(saved)]
    if missing:
        lines.append(f"Nodes without saved model artifacts: {', '.join(missing)}")
    _logging.system("\n".join(lines))


def _fuse_staged(staging: str, bundle: str, graph: str, allow_external_paths: bool) -> None:
    """compile_graph(fuse=True): fuse the bundle being staged, before its commit.  Serving
    is a later stage: fusion (leapp.serving.fusion) is its one door for compiling."""
    from ..serving.fusion import fuse
    _logging.section("Fusing the pipeline into one ONNX model")
    fuse(os.path.join(staging, f"{graph}.yaml"), format="onnx",
         allow_external_paths=allow_external_paths, _shown_dir=bundle)
