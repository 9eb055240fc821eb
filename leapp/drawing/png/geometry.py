"""Edge geometry in logical pixels: S-curves between columns, rounded orthogonal
routes for wrapped links and loops, and dashes."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .layers import Chain, Loop
from .placement import Grid, Wrap
from .style import BAND_PAD, CORNER, CURVE_STEPS, LANE, LANE_PAD

Point = tuple[float, float]


def bezier(p0: Point, p1: Point) -> list[Point]:
    """A smooth S-curve from p0 to p1 with horizontal tangents at both ends."""
    dx = max((p1[0] - p0[0]) / 2, 20.0)
    c0, c1 = (p0[0] + dx, p0[1]), (p1[0] - dx, p1[1])
    if abs(p0[1] - p1[1]) < 0.5:
        return [p0, p1]
    pts = []
    for i in range(CURVE_STEPS + 1):
        t = i / CURVE_STEPS
        u = 1 - t
        pts.append((
            u ** 3 * p0[0] + 3 * u * u * t * c0[0] + 3 * u * t * t * c1[0] + t ** 3 * p1[0],
            u ** 3 * p0[1] + 3 * u * u * t * c0[1] + 3 * u * t * t * c1[1] + t ** 3 * p1[1],
        ))
    return pts


def rounded(points: Sequence[Point], radius: float = CORNER) -> list[Point]:
    """An orthogonal polyline with its corners replaced by quarter circles."""
    pts = [p for i, p in enumerate(points) if i == 0 or p != points[i - 1]]
    if len(pts) < 3:
        return list(pts)
    out: list[Point] = [pts[0]]
    for prev, cur, nxt in zip(pts, pts[1:], pts[2:]):
        d_in = math.dist(prev, cur)
        d_out = math.dist(cur, nxt)
        r = min(radius, d_in / 2, d_out / 2)
        if r < 1:
            out.append(cur)
            continue
        a = (cur[0] + (prev[0] - cur[0]) * r / d_in, cur[1] + (prev[1] - cur[1]) * r / d_in)
        b = (cur[0] + (nxt[0] - cur[0]) * r / d_out, cur[1] + (nxt[1] - cur[1]) * r / d_out)
        for i in range(9):
            t = i / 8
            u = 1 - t
            out.append((u * u * a[0] + 2 * u * t * cur[0] + t * t * b[0], u * u * a[1] + 2 * u * t * cur[1] + t * t * b[1]))
    out.append(pts[-1])
    return out


def wrap_points(wrap: Wrap, grid: Grid) -> list[Point]:
    """Out of the right gutter, back along a lane below the band, into the left gutter."""
    link = wrap.link
    x1, y1 = link.src.out_anchor(link.src_port)
    x2, y2 = link.dst.in_anchor(link.dst_port)
    lane_y = grid.content_top[wrap.band] + grid.content_h[wrap.band] + BAND_PAD + LANE * wrap.lane
    return rounded([(x1, y1), (wrap.xr, y1), (wrap.xr, lane_y), (wrap.xl, lane_y), (wrap.xl, y2), (x2, y2)])


def chain_points(chain: Chain, wraps: Mapping[int, Wrap], grid: Grid) -> list[Point]:
    """The full polyline of one drawn edge, through its bend points."""
    pts: list[Point] = []
    for link in chain.links:
        start = link.src.out_anchor(link.src_port)
        end = link.dst.in_anchor(link.dst_port)
        if id(link) in wraps:
            seg = wrap_points(wraps[id(link)], grid)
        else:
            # leave a card narrower than its column straight, so the curve stays in the gap
            stub = [start] if start[0] >= link.src.col_right else [start, (link.src.col_right, start[1])]
            seg = stub[:-1] + bezier(stub[-1], end)
        pts.extend(seg if not pts else seg[1:])
        if link.dst.kind == "dummy":
            pts.append(link.dst.out_anchor(""))
    return pts


def loop_points(loop: Loop, grid: Grid) -> list[Point]:
    """Right out of the source, up to the loop's lane, across, and down into the target."""
    x1, y1 = loop.src.out_anchor(loop.src_port)
    x2, y2 = loop.dst.in_anchor(loop.dst_port)
    lane_y = grid.band_top[loop.band] + LANE_PAD / 2 + LANE * loop.lane
    return rounded([(x1, y1), (loop.xs, y1), (loop.xs, lane_y), (loop.xt, lane_y), (loop.xt, y2), (x2, y2)])


def dash(pts: Sequence[Point], on: float, off: float) -> list[list[Point]]:
    """Split a polyline into dash pieces of length `on` separated by `off`."""
    pieces: list[list[Point]] = []
    cur: list[Point] = [pts[0]]
    drawing, left = True, on
    for a, b in zip(pts, pts[1:]):
        seg = math.dist(a, b)
        pos = 0.0
        while seg - pos > left:
            pos += left
            t = pos / seg
            p = (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t)
            if drawing:
                cur.append(p)
                pieces.append(cur)
            cur = [p]
            drawing = not drawing
            left = on if drawing else off
        left -= seg - pos
        if drawing:
            cur.append(b)
        else:
            cur = [b]
    if drawing and len(cur) > 1:
        pieces.append(cur)
    return pieces
