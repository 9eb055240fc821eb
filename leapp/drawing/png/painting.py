"""Painting a scene: cards, terminals, edges, the header with its legend, and the PNG file."""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Iterable, Mapping, Sequence

from PIL import Image, ImageDraw

from ...bundle.pipeline import Pipeline
from .fonts import FontT, badge_text, badge_w, clip, detail_text, port_kind, text_w
from .geometry import Point, chain_points, dash, loop_points
from .layers import Item, PortSlot
from .layout import Scene
from .style import ARROW_HALF, ARROW_LEN, BACKGROUND, BADGE_COLORS, BADGE_NONE, BADGE_OTHER, CARD_BORDER, CARD_FILL, CARD_PAD_X, CARD_SHADOW, DASH, DETAIL_LINE, EDGE_STYLE, FEEDBACK_COLOR, FORWARD_COLOR, GRAPH_INPUT, GRAPH_OUTPUT, HEADER_FILL, HEADER_H, INPUT_COLOR, INPUT_FILL, KIND_TEXT, LEGEND_BACKENDS, LEGEND_ENTRIES, MARGIN, MAX_SIDE, NAME_LINE, OUTPUT_COLOR, OUTPUT_FILL, PORT_DOT, PORT_PAD, TERMINAL_TIP, TEXT, TEXT_MUTED

logger = logging.getLogger("leapp")


class Painter:
    """Draws logical-pixel geometry onto a canvas `scale` times larger."""

    def __init__(self, width: int, height: int, scale: int, fonts: Mapping[str, FontT],
                 measure: Mapping[str, FontT]) -> None:
        self.scale = scale
        self.fonts = fonts  # drawing fonts, `scale` times the logical size
        self.measure = measure  # logical-size fonts, for layout arithmetic
        self.image = Image.new("RGB", (width * scale, height * scale), BACKGROUND)
        self.draw = ImageDraw.Draw(self.image)

    def _p(self, pts: Iterable[Point]) -> list[tuple[float, float]]:
        s = self.scale
        return [(x * s, y * s) for x, y in pts]

    def line(self, pts: Sequence[Point], color: tuple[int, int, int], width: float, dashed: bool = False) -> None:
        if len(pts) < 2:
            return
        w = max(1, round(width * self.scale))
        if not dashed:
            self.draw.line(self._p(pts), fill=color, width=w, joint="curve")
            return
        for piece in dash(pts, *DASH):
            self.draw.line(self._p(piece), fill=color, width=w, joint="curve")

    def arrow(self, pts: Sequence[Point], color: tuple[int, int, int]) -> None:
        """A filled arrowhead at the end of `pts`, pointing along its last segment."""
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        d = math.dist((x0, y0), (x1, y1)) or 1.0
        ux, uy = (x1 - x0) / d, (y1 - y0) / d
        bx, by = x1 - ux * ARROW_LEN, y1 - uy * ARROW_LEN
        tri = [(x1, y1), (bx - uy * ARROW_HALF, by + ux * ARROW_HALF), (bx + uy * ARROW_HALF, by - ux * ARROW_HALF)]
        self.draw.polygon(self._p(tri), fill=color)

    def rect(self, box: Sequence[float], fill: Any, outline: Any = None, radius: float = 6, width: float = 1) -> None:
        s = self.scale
        self.draw.rounded_rectangle([v * s for v in box], radius=radius * s, fill=fill, outline=outline,
                                    width=max(1, round(width * s)))

    def polygon(self, pts: Sequence[Point], fill: Any, outline: Any, width: float = 1.5) -> None:
        self.draw.polygon(self._p(pts), fill=fill, outline=outline, width=max(1, round(width * self.scale)))

    def circle(self, center: Point, r: float, fill: Any, outline: Any = None) -> None:
        s = self.scale
        x, y = center
        self.draw.ellipse([(x - r) * s, (y - r) * s, (x + r) * s, (y + r) * s], fill=fill, outline=outline,
                          width=max(1, s))

    def text(self, xy: Point, text: str, role: str, color: Any, anchor: str = "lm") -> None:
        self.draw.text((xy[0] * self.scale, xy[1] * self.scale), text, font=self.fonts[role], fill=color, anchor=anchor)


def _badge_color(backend: str | None) -> tuple[int, int, int]:
    if backend is None:
        return BADGE_NONE
    return BADGE_COLORS.get(backend.lower(), BADGE_OTHER)


def _draw_badge(p: Painter, right: float, cy: float, backend: str | None) -> float:
    """A pill with the backend name, right-aligned at `right`; returns its width."""
    w = badge_w(p.measure, backend)
    color = _badge_color(backend)
    box = (right - w, cy - 9, right, cy + 9)
    if backend is None:
        p.rect(box, fill=CARD_FILL, outline=color, radius=9, width=1.2)
    else:
        p.rect(box, fill=color, outline=color, radius=9)
    p.text((right - w / 2, cy + 0.5), badge_text(backend), "badge", color if backend is None else (255, 255, 255), "mm")
    return w


def _draw_port(p: Painter, item: Item, slot: PortSlot, side: str, dot: tuple[int, int, int]) -> None:
    """A port's three text lines and its anchor dot on the card edge."""
    port = slot.port
    kind = port_kind(port)
    left = side == "in"
    x = item.x + CARD_PAD_X if left else item.x + item.width - CARD_PAD_X
    anchor = "lm" if left else "rm"
    y = item.y + slot.top + PORT_PAD
    p.text((x, y + NAME_LINE / 2), clip(port.name), "port", TEXT, anchor)
    p.text((x, y + NAME_LINE + DETAIL_LINE / 2), detail_text(port), "detail", TEXT_MUTED, anchor)
    if kind:
        p.text((x, y + NAME_LINE + DETAIL_LINE * 1.5), clip(kind), "detail", KIND_TEXT, anchor)
    edge_x = item.x if left else item.x + item.width
    p.circle((edge_x, item.y + slot.anchor), 4, fill=dot, outline=CARD_FILL)


def _draw_card(p: Painter, item: Item, dots: Mapping[tuple[str, str, str], tuple[int, int, int]]) -> None:
    """A node card: shadow, header with name and backend badge, port columns."""
    node = item.node
    assert node is not None
    x0, y0, x1, y1 = item.x, item.y, item.x + item.width, item.y + item.height
    p.rect((x0 + 2, y0 + 3, x1 + 2, y1 + 3), fill=CARD_SHADOW, radius=8)
    p.rect((x0, y0, x1, y1), fill=CARD_FILL, outline=CARD_BORDER, radius=8)
    p.rect((x0, y0, x1, y0 + HEADER_H), fill=HEADER_FILL, outline=CARD_BORDER, radius=8)
    p.rect((x0 + 1, y0 + HEADER_H - 8, x1 - 1, y0 + HEADER_H), fill=HEADER_FILL, outline=None, radius=0)
    p.line([(x0, y0 + HEADER_H), (x1, y0 + HEADER_H)], CARD_BORDER, 1)
    p.text((x0 + CARD_PAD_X, y0 + HEADER_H / 2), clip(node.name), "node", TEXT)
    _draw_badge(p, x1 - CARD_PAD_X, y0 + HEADER_H / 2, item.backend)
    for name, slot in item.in_slots.items():
        _draw_port(p, item, slot, "in", dots.get((node.name, "in", name), PORT_DOT))
    for name, slot in item.out_slots.items():
        _draw_port(p, item, slot, "out", dots.get((node.name, "out", name), PORT_DOT))


def _terminal_outline(item: Item) -> list[Point]:
    """An arrow-shaped tag; output tags also have a notch on their left side."""
    x0, y0, x1, y1 = item.x, item.y, item.x + item.width, item.y + item.height
    cy = (y0 + y1) / 2
    if item.kind == "in":
        return [(x0, y0), (x1 - TERMINAL_TIP, y0), (x1, cy), (x1 - TERMINAL_TIP, y1), (x0, y1)]
    return [(x0, y0), (x1 - TERMINAL_TIP, y0), (x1, cy), (x1 - TERMINAL_TIP, y1), (x0, y1), (x0 + TERMINAL_TIP, cy)]


def _draw_terminal(p: Painter, item: Item) -> None:
    """A graph input (green) or graph output (orange) tag with port name and shape."""
    color, fill = (INPUT_COLOR, INPUT_FILL) if item.kind == "in" else (OUTPUT_COLOR, OUTPUT_FILL)
    p.polygon(_terminal_outline(item), fill=fill, outline=color)
    left = item.x + 10 + (TERMINAL_TIP if item.kind == "out" else 0)
    cy = item.y + item.height / 2
    p.text((left, cy - 7), item.label, "terminal", color)
    p.text((left, cy + 8), item.sublabel, "detail", TEXT_MUTED)


def _draw_edge(p: Painter, pts: Sequence[Point], kind: str) -> None:
    color, width, dashed = EDGE_STYLE[kind]
    body = list(pts)
    if len(body) >= 2:  # stop the line under the arrowhead so the tip stays sharp
        (xa, ya), (xb, yb) = body[-2], body[-1]
        d = math.dist((xa, ya), (xb, yb)) or 1.0
        cut = min(ARROW_LEN * 0.6, d)
        body[-1] = (xb - (xb - xa) * cut / d, yb - (yb - ya) * cut / d)
    p.line(body, color, width, dashed)
    p.arrow(pts, color)


def _stats_text(model: Pipeline) -> str:
    n_fb = sum(1 for _ in model.feedback_edges())
    n_fwd = len(model.edges) - n_fb

    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    return " · ".join([
        plural(len(model.nodes), "node"), plural(n_fwd, "data edge"), plural(n_fb, "feedback edge"),
        plural(len(model.inputs), "graph input"), plural(len(model.outputs), "graph output"),
    ])


def _draw_header(p: Painter, graph_name: str, model: Pipeline) -> None:
    """Title, statistics and the legend."""
    p.text((MARGIN, 26), graph_name, "title", TEXT)
    p.text((MARGIN, 48), _stats_text(model), "subtitle", TEXT_MUTED)
    x, y = float(MARGIN), 76.0
    for kind, text in LEGEND_ENTRIES:
        if kind in (GRAPH_INPUT, GRAPH_OUTPUT):
            sample = Item(("legend",), "in" if kind == GRAPH_INPUT else "out", 36, 18, x=x, y=y - 9)
            color, fill = (INPUT_COLOR, INPUT_FILL) if kind == GRAPH_INPUT else (OUTPUT_COLOR, OUTPUT_FILL)
            p.polygon(_terminal_outline(sample), fill=fill, outline=color)
        else:
            _draw_edge(p, [(x, y), (x + 36, y)], kind)
        p.text((x + 46, y), text, "legend", TEXT)
        x += 48 + text_w(p.measure, "legend", text) + 22
    p.text((x, y), "backend:", "legend", TEXT)
    x += text_w(p.measure, "legend", "backend:") + 8
    for backend in LEGEND_BACKENDS:
        w = badge_w(p.measure, backend)
        _draw_badge(p, x + w, y, backend)
        x += w + 6


def _port_dots(model: Pipeline) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    """Anchor dot colours: graph I/O ports in their terminal colour, feedback ends in feedback colour."""
    dots: dict[tuple[str, str, str], tuple[int, int, int]] = {}
    for edge in model.edges:
        color = FEEDBACK_COLOR if edge.feedback else FORWARD_COLOR
        dots[(edge.src_node, "out", edge.src_port)] = dots.get((edge.src_node, "out", edge.src_port), color)
        dots[(edge.dst_node, "in", edge.dst_port)] = color
    for node, port in model.inputs:
        dots[(node, "in", port)] = INPUT_COLOR
    for node, port in model.outputs:
        dots.setdefault((node, "out", port), OUTPUT_COLOR)
    return dots


def paint(scene: Scene, model: Pipeline, graph_name: str, scale: int, fonts: Mapping[str, FontT],
          measure: Mapping[str, FontT]) -> Image.Image:
    """Draw the scene; edges first, then cards and terminals, then feedback on top."""
    painter = Painter(scene.width, scene.height, scale, fonts, measure)
    _draw_header(painter, graph_name, model)
    for chain in scene.chains:
        _draw_edge(painter, chain_points(chain, scene.wraps, scene.grid), chain.kind)
    dots = _port_dots(model)
    for item in scene.items:
        if item.kind == "node":
            _draw_card(painter, item, dots)
        elif item.kind in ("in", "out"):
            _draw_terminal(painter, item)
    for loop in scene.loops:
        _draw_edge(painter, loop_points(loop, scene.grid), loop.kind)
    return painter.image


def finish(image: Image.Image, width: int, height: int) -> Image.Image:
    """Downsample a supersampled canvas, and shrink anything beyond MAX_SIDE."""
    factor = min(1.0, MAX_SIDE / max(width, height))
    if factor < 1.0:
        logger.warning("graph picture %dx%d exceeds %d px; scaled by %.2f", width, height, MAX_SIDE, factor)
    if image.size != (width, height):
        image = image.reduce(image.width // width)  # box-average the supersampled pixels
    if factor < 1.0:
        size = (max(1, round(width * factor)), max(1, round(height * factor)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    return image


def write_png(image: Image.Image, png_path: str) -> None:
    """Write atomically, with no metadata chunks, so equal pictures are equal files."""
    directory = os.path.dirname(os.path.abspath(png_path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{png_path}.tmp-{os.getpid()}"
    try:
        image.save(tmp, format="PNG", optimize=False, compress_level=6)
        os.replace(tmp, png_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
