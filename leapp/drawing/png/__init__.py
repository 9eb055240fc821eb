"""Headless PNG picture of an exported LEAPP pipeline.

`draw` paints a :class:`leapp.bundle.pipeline.Pipeline` as a layered, left-to-right
diagram; `render_pipeline` does the same from the YAML's `models` and
`pipeline` mappings (read by ``Pipeline.from_document``, the one parser):

* every node is a card with its name, a backend badge and its ports (inputs on
  the left edge, outputs on the right, each with shape, dtype and semantic kind);
* graph inputs and outputs are tag-shaped terminals wired to their ports;
* forward (`data_flow`) edges are smooth curves from port to port;
* feedback (`feedback_flow`) edges are dashed, in their own colour, and run back
  through lanes above the content, so a loop is obvious at a glance.

Long pipelines wrap into rows like text.  The result is deterministic: the same
graph gives a byte-identical file.  The layout is computed in logical pixels and
drawn at 2x before a high-quality downsample (1x for very large canvases).

The modules, one concern each: `style` (colours, sizes), `fonts` (fonts and
text measurement), `layers` (items, layers, crossing reduction), `placement`
(bands, columns, lanes), `geometry` (curves and routes), `layout` (the scene)
and `painting` (drawing and the PNG file).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from ...bundle.pipeline import Pipeline
from .fonts import is_scalable, load_fonts
from .layout import Scene, layout_pipeline
from .painting import finish, paint, write_png
from .style import SUPERSAMPLE_MAX_PIXELS

logger = logging.getLogger("leapp")

__all__ = ["Scene", "draw", "layout_pipeline", "render_pipeline"]


def draw(model: Pipeline, png_path: str, graph_name: str,
         backends: Mapping[str, str | None] | None = None) -> str:
    """Draw `model` to `png_path` and return `png_path`.

    `backends` overrides the badge text per node (None draws "no model").
    Raises RuntimeError naming the graph and the cause when drawing fails.
    """
    started = time.perf_counter()
    try:
        fonts_1x = load_fonts(1)
        scene = layout_pipeline(model, backends, fonts_1x)
        scale = 2 if is_scalable(fonts_1x) and scene.width * scene.height <= SUPERSAMPLE_MAX_PIXELS else 1
        image = paint(scene, model, graph_name, scale, load_fonts(scale) if scale != 1 else fonts_1x, fonts_1x)
        image = finish(image, scene.width, scene.height)
        write_png(image, png_path)
    except Exception as exc:
        raise RuntimeError(f"cannot render the graph '{graph_name}' to {png_path}: {exc}") from exc
    logger.debug("graph '%s': %d nodes, %d crossings, %dx%d px, rendered in %.3f s",
                 graph_name, len(model.nodes), scene.crossings, image.width, image.height,
                 time.perf_counter() - started)
    return png_path


def render_pipeline(png_path: str, graph_name: str, models: dict, pipeline: dict,
                    backends: dict[str, str | None] | None = None) -> str:
    """Draw the pipeline described by the YAML `models` and `pipeline` mappings to `png_path`.

    The mappings are read and checked as a bundle's are (``Pipeline.from_document``
    with its wiring checks).  `backends` overrides the badge text per node (None
    draws "no model").  Returns `png_path`.  Raises RuntimeError naming the graph
    and the cause when the input is inconsistent (an edge naming an unknown node
    or port, ...) or drawing fails.
    """
    document: dict[str, Any] = {"models": models, "pipeline": {} if pipeline is None else pipeline,
                                "system information": {}}
    try:
        model = Pipeline.from_document(document, check_wiring=True)
    except Exception as exc:
        raise RuntimeError(f"cannot render the graph '{graph_name}' to {png_path}: {exc}") from exc
    return draw(model, png_path, graph_name, backends)
