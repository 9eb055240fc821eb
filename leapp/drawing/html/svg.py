"""The pipeline as SVG: the PNG's scene (leapp.drawing.png.layout) painted as vector
elements, each node card, terminal and edge a group the page's script can find and click."""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Mapping, Sequence

from ...bundle.pipeline import Pipeline
from ..png import painting
from ..png.fonts import FontT, load_fonts
from ..png.geometry import Point, chain_points, loop_points
from ..png.layers import Chain, Item, Loop
from ..png.layout import Scene, layout_pipeline
from ..png.style import ARROW_HALF, ARROW_LEN, BACKGROUND, BOLD_ROLES, DASH, FONT_SIZES

_ANCHORS = {"l": "start", "m": "middle", "r": "end"}
FONT_FAMILY = "'DejaVu Sans', Verdana, 'Bitstream Vera Sans', sans-serif"


def _colour(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return "#%02x%02x%02x" % tuple(value[:3])


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _points(pts: Iterable[Point]) -> str:
    return " ".join(f"{_num(x)},{_num(y)}" for x, y in pts)


class SvgPainter:
    """The PNG painter's drawing calls (leapp.drawing.png.painting.Painter), written as SVG."""

    def __init__(self, measure: Mapping[str, FontT]) -> None:
        self.scale = 1
        self.measure = measure
        self.fonts = measure
        self.parts: list[str] = []

    def open(self, tag: str, **attributes: str) -> None:
        attrs = "".join(f' {k.rstrip("_").replace("_", "-")}="{html.escape(v)}"'
                        for k, v in attributes.items())
        self.parts.append(f"<{tag}{attrs}>")

    def close(self, tag: str) -> None:
        self.parts.append(f"</{tag}>")

    def line(self, pts: Sequence[Point], color: Any, width: float, dashed: bool = False) -> None:
        if len(pts) < 2:
            return
        dash = f' stroke-dasharray="{_num(DASH[0])} {_num(DASH[1])}"' if dashed else ""
        self.parts.append(f'<polyline points="{_points(pts)}" fill="none" stroke="{_colour(color)}"'
                          f' stroke-width="{_num(width)}" stroke-linejoin="round"'
                          f' stroke-linecap="round"{dash}/>')

    def arrow(self, pts: Sequence[Point], color: Any) -> None:
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        d = math.dist((x0, y0), (x1, y1)) or 1.0
        ux, uy = (x1 - x0) / d, (y1 - y0) / d
        bx, by = x1 - ux * ARROW_LEN, y1 - uy * ARROW_LEN
        tri = [(x1, y1), (bx - uy * ARROW_HALF, by + ux * ARROW_HALF),
               (bx + uy * ARROW_HALF, by - ux * ARROW_HALF)]
        self.parts.append(f'<polygon points="{_points(tri)}" fill="{_colour(color)}"/>')

    def rect(self, box: Sequence[float], fill: Any, outline: Any = None, radius: float = 6,
             width: float = 1) -> None:
        x0, y0, x1, y1 = box
        stroke = "" if outline is None else \
            f' stroke="{_colour(outline)}" stroke-width="{_num(width)}"'
        self.parts.append(f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(x1 - x0)}"'
                          f' height="{_num(y1 - y0)}" rx="{_num(radius)}"'
                          f' fill="{_colour(fill)}"{stroke}/>')

    def polygon(self, pts: Sequence[Point], fill: Any, outline: Any, width: float = 1.5) -> None:
        self.parts.append(f'<polygon points="{_points(pts)}" fill="{_colour(fill)}"'
                          f' stroke="{_colour(outline)}" stroke-width="{_num(width)}"/>')

    def circle(self, center: Point, r: float, fill: Any, outline: Any = None) -> None:
        stroke = "" if outline is None else f' stroke="{_colour(outline)}"'
        self.parts.append(f'<circle cx="{_num(center[0])}" cy="{_num(center[1])}" r="{_num(r)}"'
                          f' fill="{_colour(fill)}"{stroke}/>')

    def text(self, xy: Point, text: str, role: str, color: Any, anchor: str = "lm") -> None:
        weight = ' font-weight="bold"' if role in BOLD_ROLES else ""
        self.parts.append(f'<text x="{_num(xy[0])}" y="{_num(xy[1])}"'
                          f' text-anchor="{_ANCHORS[anchor[0]]}" dominant-baseline="central"'
                          f' font-size="{FONT_SIZES[role]}"{weight} fill="{_colour(color)}">'
                          f"{html.escape(text)}</text>")


def _end(item: Item, port: str) -> str:
    """An edge end as the page names it: "node/port", or "input:node/port" for a terminal."""
    if item.kind == "node" and item.node is not None:
        return f"{item.node.name}/{port}"
    node = item.node.name if item.node is not None else ""
    return f"{'input' if item.kind == 'in' else 'output'}:{node}/{item.label}"


def _chain_ends(chain: Chain) -> tuple[str, str]:
    first, last = chain.links[0], chain.links[-1]
    return _end(first.src, first.src_port), _end(last.dst, last.dst_port)


def _edge(p: SvgPainter, pts: Sequence[Point], kind: str, src: str, dst: str) -> None:
    p.open("g", class_="edge", data_kind=kind, data_src=src, data_dst=dst)
    painting._draw_edge(p, pts, kind)  # type: ignore[arg-type]
    p.close("g")


def svg_scene(model: Pipeline, graph_name: str) -> tuple[str, Scene]:
    """(the SVG markup, the scene it draws) of `model`, laid out as the PNG is."""
    measure = load_fonts(1)
    scene = layout_pipeline(model, None, measure)
    p = SvgPainter(measure)
    p.open("svg", id="pipeline",
           viewBox=f"0 0 {scene.width} {scene.height}", width=str(scene.width),
           height=str(scene.height), font_family=FONT_FAMILY)
    p.rect((0, 0, scene.width, scene.height), fill=BACKGROUND, radius=0)
    painting._draw_header(p, graph_name, model)  # type: ignore[arg-type]
    for chain in scene.chains:
        src, dst = _chain_ends(chain)
        _edge(p, chain_points(chain, scene.wraps, scene.grid), chain.kind, src, dst)
    dots = painting._port_dots(model)
    for item in scene.items:
        if item.kind == "node" and item.node is not None:
            p.open("g", class_="node", data_node=item.node.name,
                   data_backend=str(item.backend or ""))
            painting._draw_card(p, item, dots)  # type: ignore[arg-type]
            colour = painting._badge_color(item.backend)
            p.rect((item.x, item.y, item.x + item.width, item.y + item.height), fill=None,
                   outline=colour, radius=8, width=2)
            p.close("g")
        elif item.kind in ("in", "out"):
            p.open("g", class_="terminal", data_kind=item.kind,
                   data_port=_end(item, "").split(":", 1)[1])
            painting._draw_terminal(p, item)  # type: ignore[arg-type]
            p.close("g")
    for loop in scene.loops:
        _loop_edge(p, scene, loop)
    p.close("svg")
    return "".join(p.parts), scene


def _loop_edge(p: SvgPainter, scene: Scene, loop: Loop) -> None:
    _edge(p, loop_points(loop, scene.grid), loop.kind, _end(loop.src, loop.src_port),
          _end(loop.dst, loop.dst_port))
