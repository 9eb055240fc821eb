"""Placement: layers go into columns, long pipelines wrap into rows (bands) of
columns; loops get lanes above their band, wrapped links lanes below it, and
the vertical runs of both get slots in the gaps between columns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .layers import Chain, Item, Link, Loop
from .style import ALIGN_SWEEPS, BAND_PAD, BASE_GAP, GUTTER, LANE, LANE_PAD, MARGIN, MIN_COL_W, ROW_GAP, TARGET_ASPECT, V_SLOT, WRAP_MAX_COLS, WRAP_MIN_COLS, WRAP_MIN_LAYERS


@dataclass
class Grid:
    """Column and gap geometry shared by all bands, plus per-band vertical extents."""

    cols: int
    col_w: list[float]
    col_x: list[float]
    gap_x: list[float]
    gap_w: list[float]
    band_top: list[float] = field(default_factory=list)
    content_top: list[float] = field(default_factory=list)
    content_h: list[float] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0

    def band(self, layer: int) -> int:
        return layer // self.cols

    def col(self, layer: int) -> int:
        return layer % self.cols


@dataclass
class Wrap:
    """A link that leaves the last column of one band and enters the first of the next."""

    link: Link
    band: int
    lane: int = 0
    xr: float = 0.0
    xl: float = 0.0


@dataclass
class Vertical:
    """A vertical run in a column gap, spanning bands lo..hi, sorted by `rank` (inner first)."""

    owner: Any
    attr: str
    lo: int
    hi: int
    rank: tuple
    slot: int = 0


def _column_height(row: Sequence[Item]) -> float:
    return sum(i.height for i in row) + ROW_GAP * max(len(row) - 1, 0)


def choose_columns(layers: Sequence[Sequence[Item]]) -> int:
    """How many layers go in one row: all of them for short pipelines, else aim at a wide page."""
    n = len(layers)
    if n < WRAP_MIN_LAYERS:
        return max(n, 1)
    pitch = sum(max((i.width for i in row if i.kind != "dummy"), default=MIN_COL_W) for row in layers) / n + BASE_GAP
    band_h = max(_column_height(row) for row in layers) + 2 * BAND_PAD
    cols = round(math.sqrt(n * TARGET_ASPECT * band_h / pitch))
    return max(WRAP_MIN_COLS, min(WRAP_MAX_COLS, cols, n))


def loop_bands_and_lanes(loops: list[Loop], grid_cols: int, n_bands: int) -> list[int]:
    """Give each loop a band (the upper one of its ends) and a lane there; longest spans outermost."""
    for loop in loops:
        loop.band = min(loop.src.layer, loop.dst.layer) // grid_cols
    per_band: list[list[Loop]] = [[] for _ in range(n_bands)]
    for loop in loops:
        per_band[loop.band].append(loop)
    for group in per_band:
        group.sort(key=lambda lp: (-abs(lp.src.layer - lp.dst.layer), lp.src.layer, lp.src.order, lp.dst.order))
        for lane, loop in enumerate(group):
            loop.lane = lane
    return [len(group) for group in per_band]


def collect_wraps(chains: Iterable[Chain], grid_cols: int, n_bands: int) -> tuple[dict[int, Wrap], list[int]]:
    """Find band-crossing links and give each a lane in the gap below its band."""
    wraps: dict[int, Wrap] = {}
    counts = [0] * n_bands
    for chain in chains:
        for link in chain.links:
            band = link.src.layer // grid_cols
            if link.dst.layer // grid_cols != band:
                wraps[id(link)] = Wrap(link, band, counts[band])
                counts[band] += 1
    return wraps, counts


def _allocate_slots(verticals: list[Vertical]) -> int:
    """Give each vertical the lowest slot free over its band range; return the slots used."""
    taken: list[list[tuple[int, int]]] = []
    verticals.sort(key=lambda v: v.rank)
    for v in verticals:
        slot = 0
        while slot < len(taken) and any(not (v.hi < lo or v.lo > hi) for lo, hi in taken[slot]):
            slot += 1
        if slot == len(taken):
            taken.append([])
        taken[slot].append((v.lo, v.hi))
        v.slot = slot
    return len(taken)


def gap_verticals(loops: Sequence[Loop], wraps: Mapping[int, Wrap], cols: int) -> tuple[list[list[Vertical]], list[list[Vertical]]]:
    """Verticals per gap: those leaving a card (source zone) and those entering one (target zone)."""
    src: list[list[Vertical]] = [[] for _ in range(cols + 1)]
    tgt: list[list[Vertical]] = [[] for _ in range(cols + 1)]
    for loop in loops:
        bs, bt = loop.src.layer // cols, loop.dst.layer // cols
        rank = (-loop.lane, loop.src.layer, loop.src.order)
        src[loop.src.layer % cols + 1].append(Vertical(loop, "xs", loop.band, bs, rank))
        tgt[loop.dst.layer % cols].append(Vertical(loop, "xt", loop.band, bt, rank))
    for wrap in wraps.values():
        rank = (wrap.lane - 10_000, wrap.band)
        src[cols].append(Vertical(wrap, "xr", wrap.band, wrap.band, rank))
        tgt[0].append(Vertical(wrap, "xl", wrap.band, wrap.band + 1, rank))
    return src, tgt


def build_grid(layers: Sequence[Sequence[Item]], cols: int, src_v: list[list[Vertical]], tgt_v: list[list[Vertical]]) -> Grid:
    """Column widths (shared by all bands) and gap widths that fit their vertical runs."""
    col_w = [float(MIN_COL_W)] * cols
    for index, row in enumerate(layers):
        for item in row:
            if item.kind != "dummy":
                col_w[index % cols] = max(col_w[index % cols], item.width)
    gap_w: list[float] = []
    src_slots = [_allocate_slots(v) for v in src_v]
    tgt_slots = [_allocate_slots(v) for v in tgt_v]
    for g in range(cols + 1):
        base = GUTTER if g in (0, cols) else BASE_GAP
        gap_w.append(base + V_SLOT * (src_slots[g] + tgt_slots[g]) + (V_SLOT if src_slots[g] or tgt_slots[g] else 0))
    col_x: list[float] = []
    gap_x: list[float] = []
    x = float(MARGIN)
    for g in range(cols + 1):
        gap_x.append(x)
        x += gap_w[g]
        if g < cols:
            col_x.append(x)
            x += col_w[g]
    grid = Grid(cols, col_w, col_x, gap_x, gap_w, width=x + MARGIN)
    for g in range(cols + 1):
        for v in src_v[g]:
            setattr(v.owner, v.attr, gap_x[g] + V_SLOT * (v.slot + 1))
        for v in tgt_v[g]:
            setattr(v.owner, v.attr, gap_x[g] + gap_w[g] - V_SLOT * (v.slot + 1))
    return grid


def place_x(layers: Sequence[Sequence[Item]], grid: Grid) -> None:
    """Cards and output tags align left in their column, input tags right, bend points span it."""
    for index, row in enumerate(layers):
        c = grid.col(index)
        for item in row:
            if item.kind == "in":
                item.x = grid.col_x[c] + grid.col_w[c] - item.width
            else:
                item.x = grid.col_x[c]
            if item.kind == "dummy":
                item.width = grid.col_w[c]
            item.col_right = grid.col_x[c] + grid.col_w[c]


def _spread(row: Sequence[Item], desired: Sequence[float]) -> None:
    """Place a column's items near their desired tops, in order, without overlap."""
    n = len(row)
    down = [0.0] * n
    up = [0.0] * n
    for i in range(n):
        down[i] = desired[i] if i == 0 else max(desired[i], down[i - 1] + row[i - 1].height + ROW_GAP)
    for i in range(n - 1, -1, -1):
        up[i] = desired[i] if i == n - 1 else min(desired[i], up[i + 1] - row[i].height - ROW_GAP)
    for i in range(n):
        row[i].y = math.floor((down[i] + up[i]) / 2)  # integral, so aligned ports stay aligned


def _desired_tops(row: Sequence[Item], links: Sequence[Link], side: str) -> list[float]:
    """Tops that would make each item's links horizontal, from the neighbours on `side`."""
    wanted: dict[int, list[float]] = {}
    for link in links:
        if side == "in":
            own, other = link.dst, link.src
            offset = link.dst.in_anchor(link.dst_port)[1] - own.y
            wanted.setdefault(id(own), []).append(other.out_anchor(link.src_port)[1] - offset)
        else:
            own, other = link.src, link.dst
            offset = link.src.out_anchor(link.src_port)[1] - own.y
            wanted.setdefault(id(own), []).append(other.in_anchor(link.dst_port)[1] - offset)
    return [round(sum(wanted[id(i)]) / len(wanted[id(i)])) if id(i) in wanted else i.y for i in row]


def _place_band_y(band_layers: Sequence[Sequence[Item]], links: Sequence[Sequence[Link]]) -> float:
    """Vertical positions within one band (top at 0); returns the band's content height."""
    for row in band_layers:
        y = 0.0
        for item in row:
            item.y = y
            y += item.height + ROW_GAP
    for sweep in range(ALIGN_SWEEPS):
        if sweep % 2 == 0:
            for i in range(1, len(band_layers)):
                _spread(band_layers[i], _desired_tops(band_layers[i], links[i - 1], "in"))
        else:
            for i in range(len(band_layers) - 2, -1, -1):
                _spread(band_layers[i], _desired_tops(band_layers[i], links[i], "out"))
    every = [item for row in band_layers for item in row]
    if not every:
        return 0.0
    top = min(i.y for i in every)
    for item in every:
        item.y = round(item.y - top)
    return max(i.y + i.height for i in every)


def place_y(layers: Sequence[Sequence[Item]], links: Sequence[Sequence[Link]], grid: Grid,
            loop_counts: Sequence[int], wrap_counts: Sequence[int], top: float) -> None:
    """Stack the bands: feedback lanes above each band, wrap lanes below it."""
    cols = grid.cols
    n_bands = (len(layers) + cols - 1) // cols
    y = top
    for b in range(n_bands):
        lo, hi = b * cols, min((b + 1) * cols, len(layers))
        inner_links = [[l for l in links[i] if l.dst.layer < hi] for i in range(lo, hi)]
        height = _place_band_y(layers[lo:hi], inner_links)
        grid.band_top.append(y)
        lanes_h = LANE * loop_counts[b] + (LANE_PAD if loop_counts[b] else 0)
        grid.content_top.append(y + lanes_h)
        grid.content_h.append(height)
        for row in layers[lo:hi]:
            for item in row:
                item.y += y + lanes_h
        y += lanes_h + height + BAND_PAD + LANE * wrap_counts[b] + (BAND_PAD if b < n_bands - 1 else 0)
    grid.height = y + MARGIN - BAND_PAD
