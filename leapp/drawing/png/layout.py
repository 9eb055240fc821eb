"""The whole layout of one picture: the scene that painting draws."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ...bundle.pipeline import FEEDBACK, FORWARD, Pipeline
from .fonts import FontT, badge_w, load_fonts, text_w
from .geometry import Point, loop_points
from .layers import Chain, Item, Loop, assign_layers, build_items, group_layers, links_by_layer, order_layers, split_edges
from .placement import Grid, Wrap, build_grid, choose_columns, collect_wraps, gap_verticals, loop_bands_and_lanes, place_x, place_y
from .style import HEADER_BLOCK_H, LEGEND_BACKENDS, LEGEND_ENTRIES, MARGIN


@dataclass
class Scene:
    """Everything needed to paint: the placed items, edges and canvas size."""

    items: list[Item]
    chains: list[Chain]
    loops: list[Loop]
    wraps: dict[int, Wrap]
    grid: Grid
    width: int
    height: int
    crossings: int

    def loop_route(self, loop: Loop) -> list[Point]:
        """The points of a loop's route (feedback, or a node's data edge to itself)."""
        return loop_points(loop, self.grid)


def badge_labels(model: Pipeline, backends: Mapping[str, str | None] | None) -> dict[str, str | None]:
    """Each node's badge text: its backend, or the override in `backends` (None: "no model")."""
    labels = {name: node.backend for name, node in model.nodes.items()}
    if backends is not None:
        unknown = sorted(set(map(str, backends)) - set(labels))
        if unknown:
            raise ValueError(f"'backends' names unknown node(s): {', '.join(unknown)}")
        labels.update(backends)
    return {name: None if label is None else str(label) for name, label in labels.items()}


def legend_width(fonts: Mapping[str, FontT]) -> float:
    """Width of the legend line of the header."""
    entries = sum(48 + text_w(fonts, "legend", text) + 22 for _, text in LEGEND_ENTRIES)
    badges = text_w(fonts, "legend", "backend:") + 8 + sum(badge_w(fonts, b) + 6 for b in LEGEND_BACKENDS)
    return entries + badges


def layout_pipeline(model: Pipeline, backends: Mapping[str, str | None] | None = None,
                    fonts: Mapping[str, FontT] | None = None) -> Scene:
    """Where the picture of `model` places every card, terminal and edge, in logical
    pixels: the layout `draw` paints (`fonts`: the logical-size fonts, loaded if None)."""
    if fonts is None:
        fonts = load_fonts(1)
    forward, looped = split_edges(model)
    layer = assign_layers(model, forward)
    items, chains = build_items(fonts, model, badge_labels(model, backends), forward, layer)
    node_items = {i.key[1]: i for i in items if i.kind == "node"}
    layers = group_layers(items)
    links = links_by_layer(chains, len(layers))
    crossings = order_layers(layers, links)
    cols = choose_columns(layers)
    n_bands = (len(layers) + cols - 1) // cols
    loops = [Loop(FEEDBACK if e.feedback else FORWARD, node_items[e.src_node], e.src_port,
                  node_items[e.dst_node], e.dst_port) for e in looped]
    loop_counts = loop_bands_and_lanes(loops, cols, n_bands)
    wraps, wrap_counts = collect_wraps(chains, cols, n_bands)
    src_v, tgt_v = gap_verticals(loops, wraps, cols)
    grid = build_grid(layers, cols, src_v, tgt_v)
    place_x(layers, grid)
    place_y(layers, links, grid, loop_counts, wrap_counts, top=HEADER_BLOCK_H + 8)
    width = math.ceil(max(grid.width, MARGIN * 2 + legend_width(fonts), MARGIN * 2 + 200))
    return Scene(items, chains, loops, wraps, grid, width, math.ceil(grid.height), crossings)
