"""What compile_graph() returns: the validation dict, displayed inline in notebooks."""
from __future__ import annotations

import base64
import html
import os
from typing import Any


def verdict(result: Any) -> str:
    """A node's validation result in words (the compile result's table, the progress lines)."""
    if result is True:
        return "passed"
    if result is False:
        return "FAILED"
    if isinstance(result, BaseException):
        return f"error: {type(result).__name__}: {result}"
    return str(result)


class CompileResult(dict):
    """``{node: True | False | exception}``, the dict upstream's compile_graph() returns.

    It compares equal to a plain dict, prints like one and serialises like one
    (``json.dumps``, ``pickle``).  In Jupyter it shows the pipeline picture and
    one row per node (backend, model file, export seconds, whether the file was
    reused from the previous compile, validation) through
    ``_repr_html_`` and ``_repr_png_``.  Extra attributes: ``graph`` (the graph
    name), ``bundle`` (the bundle directory), ``nodes`` (the rows, as dicts)
    ``png`` (the picture's bytes, or None) and ``view`` (the interactive view's
    page, ``<graph>.html``, shown inline in place of the picture; or None) and
    ``closed_loop`` (the whole bundle replayed over the traced steps: a dict with
    ``steps``, ``passed``, ``difference``, ``breaks`` and ``skipped``; or None).
    """

    def __init__(self, results: dict, graph: str = "", bundle: str = "",
                 nodes: list | None = None, png: bytes | None = None,
                 view: str | None = None, closed_loop: dict | None = None) -> None:
        super().__init__(results)
        self.closed_loop = closed_loop
        self.graph = graph
        self.bundle = bundle
        self.nodes = list(nodes or [])
        self.png = png
        self.view = view

    def __reduce__(self):  # pickles as the plain dict (attributes are display data)
        return (dict, (dict(self),))

    @property
    def passed(self) -> bool:
        """Whether every node validated."""
        return all(value is True for value in self.values())

    def _repr_png_(self) -> bytes | None:
        return self.png

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = []
        for row in self.nodes:
            seconds = row.get("seconds")
            verdict_text = verdict(row.get("validation"))
            colour = "#2e7d32" if verdict_text == "passed" else "#c62828"
            rows.append(
                "<tr>"
                f"<td>{esc(str(row.get('node')))}</td>"
                f"<td>{esc(str(row.get('backend') or '-'))}</td>"
                f"<td>{esc(str(row.get('file') or '-'))}</td>"
                f"<td>{'-' if seconds is None else f'{seconds:.2f}'}"
                f"{' (reused)' if row.get('reused') else ''}</td>"
                f"<td style=\"color:{colour}\">{esc(verdict_text)}</td>"
                "</tr>")
        picture = ""
        if self.view:
            from ..drawing.html import iframe
            picture = iframe(self.view)
        elif self.png:
            data = base64.b64encode(self.png).decode("ascii")
            picture = (f'<img src="data:image/png;base64,{data}" '
                       f'alt="{esc(self.graph)} pipeline" style="max-width:100%"/>')
        status = "all nodes passed validation" if self.passed else "validation failed"
        loop = self.closed_loop
        if loop and loop.get("skipped"):
            status += f" &middot; closed loop not run: {esc(loop['skipped'])}"
        elif loop and loop.get("passed"):
            status += f" &middot; closed loop: {loop['steps']} step(s) reproduced"
        elif loop:
            status += f" &middot; <b>{esc(str(loop.get('difference')))}</b>"
        return (f'<div class="leapp-compile-result"><p><b>{esc(self.graph)}</b>: '
                f"{len(self)} node(s), {status} &middot; <code>{esc(self.bundle)}</code></p>"
                f"{picture}"
                '<table class="leapp-nodes"><thead><tr><th>node</th><th>backend</th>'
                "<th>file</th><th>seconds</th><th>validation</th></tr></thead><tbody>"
                + "".join(rows) + "</tbody></table></div>")


def compile_result(results: dict, graph: str, bundle: str, models: dict, seconds: dict,
                   picture: bool = True, reused: set | None = None,
                   closed_loop: dict | None = None) -> CompileResult:
    """The CompileResult of one compile: rows from the YAML models, the bundle's PNG.

    reused: the nodes whose file came unchanged from the previous compile.
    """
    rows = []
    for name, entry in models.items():
        parameters = (entry or {}).get("parameters") or {}
        rows.append({"node": name, "backend": parameters.get("backend"),
                     "file": parameters.get("model_path"), "seconds": seconds.get(name),
                     "reused": name in (reused or ()), "validation": results.get(name)})
    png = view = None
    try:
        if not picture:
            raise FileNotFoundError(graph)
        with open(os.path.join(bundle, f"{graph}.png"), "rb") as handle:
            png = handle.read()
        with open(os.path.join(bundle, f"{graph}.html"), encoding="utf-8") as text:
            view = text.read()
    except OSError:
        pass  # visualize=False, or the drawing failed (already logged)
    return CompileResult(results, graph=graph, bundle=os.path.abspath(bundle), nodes=rows,
                         png=png, view=view, closed_loop=closed_loop)
