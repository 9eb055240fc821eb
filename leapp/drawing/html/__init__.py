"""The interactive view of a bundle: one self-contained HTML file (`<graph>.html`).

`leapp view BUNDLE.yaml` and `compile_graph(visualize=True)` write it; notebooks show it
inline (the compile result, `InferenceManager`).  It holds the pipeline drawn as SVG with
the PNG's layout (leapp.drawing.html.svg), the port catalogue (the graph inputs and outputs by
kind with their element names and periods, the feedback ports; leapp.bundle.ports) and,
per node, its ports and where each input comes from, its model file and checksums, the
validation analytics of the compile (``<graph>_analytics.json``, leapp.bundle.analytics), the
warnings it logged (leapp.drawing.html.log_warnings, read from log.txt) and the op graph of its
exported model
(leapp.drawing.html.opgraph).  Scripts and styles are inline (leapp.drawing.html.page): it needs no
network.
"""
from __future__ import annotations

import html
import json
import os
from typing import Any, Callable

from ...bundle import analytics
from ...bundle.log import logger
from ...bundle.pipeline import Pipeline, thawed
from ...bundle.ports import INPUT, OUTPUT, InferencePort, describe, port_record
from .log_warnings import read_warnings
from .opgraph import op_graph
from .page import render_page

__all__ = ["view_data", "render_html", "write_view", "iframe"]


def _sources(model: Pipeline) -> dict[str, list[str]]:
    """{"node/port": [where its value comes from, ...]} for every input port."""
    found: dict[str, list[str]] = {}
    for edge in model.edges:
        how = "feedback from previous call" if edge.feedback else "data"
        found.setdefault(edge.target, []).append(f"{edge.source} ({how})")
    for node, port in model.inputs:
        found.setdefault(f"{node}/{port}", []).append("graph input")
    return found


def _catalogued(record: InferencePort) -> dict[str, Any]:
    """What the page shows of a port record (leapp.bundle.ports): kind, the flattened
    element names, the time axis and its period, config 1.4's fields, the extra fields."""
    return {"kind": _jsonable(record.kind_name), "elements": list(record.element_names),
            "temporal_axis": record.temporal_axis, "period_ms": record.temporal_period_ms,
            "is_setpoint": record.is_setpoint, "reference": record.reference,
            "expressed_in": _jsonable(None if record.expressed_in is None
                                      else dict(record.expressed_in)),
            "extra": _jsonable(thawed(record.extra)), "text": describe(record)}


def _port(port: Any, side: str, sources: dict[str, list[str]] | None) -> dict[str, Any]:
    entry = port.description()
    out = {"name": port.name, "shape": list(port.shape), "dtype": port.dtype,
           "element_names": _jsonable(entry.get("element_names")),
           **_catalogued(port_record(port.entry, port.node, side, shape=port.shape,
                                     dtype=port.dtype))}
    if sources is not None:
        out["from"] = sources.get(port.key, ["(unconnected: fed by the caller)"])
    return out


def _catalogue(model: Pipeline) -> dict[str, Any]:
    """The port catalogue: the frequency, the graph inputs and outputs (YAML order) and the
    feedback ports with their sources."""
    def rows(ports: Any) -> list[dict[str, Any]]:
        return [{"key": key, "shape": list(p.shape), "dtype": p.dtype_name,
                 "source": p.source, **_catalogued(p)} for key, p in ports.items()]
    return {"frequency": model.frequency, "inputs": rows(model.input_ports),
            "outputs": rows(model.output_ports), "feedback": rows(model.feedback_ports)}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def view_data(model: Pipeline, graph: str, bundle_dir: str, log_text: str | None = None,
              with_ops: bool = True) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (log_text: the bundle's log.txt,
    read from bundle_dir when None; the analytics: the bundle's analytics file)."""
    if log_text is None:
        try:
            with open(os.path.join(bundle_dir, "log.txt"), encoding="utf-8",
                      errors="replace") as handle:
                log_text = handle.read()
        except OSError:
            log_text = ""
    warnings, general = read_warnings(log_text, list(model.nodes))
    try:
        entries = analytics.read(bundle_dir, graph)
    except ValueError as exc:  # a damaged file: the page says so, the rest still shows
        entries = None
        general = [f"[ERROR] {exc}"] + general
    validation = analytics.by_node(entries or [], list(model.nodes))
    sources = _sources(model)
    outputs = {f"{n}/{p}" for n, p in model.outputs}
    nodes = {}
    for name, node in model.nodes.items():
        params = dict(node.parameters)
        path = node.model_path
        ops = None
        if with_ops and path:
            full = path if os.path.isabs(path) else os.path.join(bundle_dir, path)
            ops = op_graph(str(node.backend or ""), full)
        nodes[name] = {
            "name": name, "backend": node.backend,
            "inputs": [_port(p, INPUT, sources) for p in node.inputs],
            "outputs": [dict(_port(p, OUTPUT, None), graph_output=p.key in outputs)
                        for p in node.outputs],
            "parameters": _jsonable(params),
            "validation": validation.get(name, []),
            "warnings": warnings.get(name, []),
            "ops": ops,
        }
    return {"graph": graph, "nodes": nodes, "general_warnings": general,
            "catalogue": _catalogue(model),
            "system": _jsonable(dict(model.system_information)),
            "has_log": bool(log_text), "has_analytics": entries is not None}


def render_html(model: Pipeline, graph: str, bundle_dir: str,
                log_text: str | None = None) -> str:
    """The whole page of `model` (a bundle in bundle_dir)."""
    # the drawing (and PIL) only for a page, not for view_data
    from .svg import svg_scene

    svg, _ = svg_scene(model, graph)
    return render_page(graph, svg, view_data(model, graph, bundle_dir, log_text))


def write_view(yaml_path: str, html_path: str | None = None) -> str:
    """Write the view of the bundle whose YAML is yaml_path (default: `<graph>.html`
    beside it); returns the path written.  Raises RuntimeError naming the cause."""
    graph = os.path.splitext(os.path.basename(yaml_path))[0]
    bundle_dir = os.path.dirname(os.path.abspath(yaml_path))
    target = html_path or os.path.join(bundle_dir, f"{graph}.html")
    try:
        page = render_html(Pipeline.load(yaml_path), graph, bundle_dir)
        _write(page, target)
    except Exception as exc:
        raise RuntimeError(f"cannot write the view of '{graph}' to {target}: {exc}") from exc
    return target


def _write(page: str, target: str) -> None:
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(page)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_staged(model: Pipeline, graph: str, staging: str, bundle: str,
                 finish: Callable[[str, str, list], None]) -> None:
    """compile_graph's step: `<graph>.html` into the staging directory, from the staged
    files and log.txt (finish: gives the file the bundle's modes); a failure is logged
    and the bundle kept."""
    target = os.path.join(staging, f"{graph}.html")
    try:
        _write(render_html(model, graph, staging), target)
        finish(staging, bundle, [f"{graph}.html"])
        logger.info("Graph view saved as: %s", os.path.join(bundle, f"{graph}.html"))
    except Exception as exc:  # the bundle is still useful without its view
        if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
            raise
        logger.error("Graph view failed for '%s': %s: %s", graph, type(exc).__name__, exc)


def iframe(page: str, height: int = 640) -> str:
    """The page inside an iframe (its scripts and styles kept apart from a notebook's)."""
    return (f'<iframe class="leapp-view" srcdoc="{html.escape(page, quote=True)}" '
            f'style="width:100%;height:{height}px;border:1px solid #ccd" '
            f'sandbox="allow-scripts"></iframe>')
