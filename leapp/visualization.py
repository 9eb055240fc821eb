"""Headless PNG picture of an exported LEAPP pipeline.

`render_pipeline` reads the same two mappings that the exported YAML holds
(`models` and `pipeline`) and draws them as a layered, left-to-right diagram:

* every node is a card with its name, a backend badge and its ports (inputs on
  the left edge, outputs on the right, each with shape, dtype and semantic kind);
* graph inputs and outputs are tag-shaped terminals wired to their ports;
* forward (`data_flow`) edges are smooth curves from port to port;
* feedback (`feedback_flow`) edges are dashed, in their own colour, and run back
  through lanes above the content, so a loop is obvious at a glance.

Long pipelines wrap into rows like text.  The result is deterministic: the same
graph gives a byte-identical file.  The layout is computed in logical pixels and
drawn at 2x before a high-quality downsample (1x for very large canvases).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import networkx as nx
from PIL import Image, ImageDraw, ImageFont

logger = logging.getLogger("leapp")

__all__ = ["render_pipeline"]

# --------------------------------------------------------------------------
# Style
# --------------------------------------------------------------------------

FORWARD = "forward"
FEEDBACK = "feedback"
GRAPH_INPUT = "graph_input"
GRAPH_OUTPUT = "graph_output"

BACKGROUND = (247, 248, 250)
CARD_FILL = (255, 255, 255)
CARD_BORDER = (190, 199, 211)
CARD_SHADOW = (227, 231, 237)
HEADER_FILL = (234, 239, 246)
TEXT = (27, 35, 48)
TEXT_MUTED = (92, 103, 118)
KIND_TEXT = (13, 116, 108)
FORWARD_COLOR = (71, 85, 105)
FEEDBACK_COLOR = (214, 36, 110)
INPUT_COLOR = (34, 134, 74)
INPUT_FILL = (226, 244, 233)
OUTPUT_COLOR = (204, 88, 10)
OUTPUT_FILL = (253, 236, 222)
PORT_DOT = (148, 160, 176)

BADGE_COLORS: dict[str, tuple[int, int, int]] = {
    "jit": (180, 83, 9),
    "onnx": (29, 78, 216),
    "pt2": (124, 58, 237),
    "trt": (21, 128, 61),
}
BADGE_OTHER = (71, 85, 105)
BADGE_NONE = (148, 160, 176)
NO_MODEL_LABEL = "no model"

# Geometry, in logical pixels.
MARGIN = 40
HEADER_H = 30
CARD_PAD_X = 12
CARD_MID_GAP = 28
CARD_MIN_W = 170
PORT_PAD = 6
NAME_LINE = 16
DETAIL_LINE = 14
BODY_PAD_TOP = 4
BODY_PAD_BOTTOM = 6
TERMINAL_H = 38
TERMINAL_TIP = 12
ROW_GAP = 26
DUMMY_H = 10
MIN_COL_W = 24
BASE_GAP = 72
GUTTER = 14
V_SLOT = 10
LANE = 12
LANE_PAD = 18
BAND_PAD = 34
MAX_NAME_CHARS = 40
ARROW_LEN = 9
ARROW_HALF = 4.5
FORWARD_W = 2
FEEDBACK_W = 3
IO_W = 2
DASH = (11, 6)
CORNER = 9
CURVE_STEPS = 28
ORDER_SWEEPS = 8
ALIGN_SWEEPS = 6
WRAP_MIN_LAYERS = 11
WRAP_MIN_COLS = 4
WRAP_MAX_COLS = 14
TARGET_ASPECT = 1.6
SUPERSAMPLE_MAX_PIXELS = 8_000_000
MAX_SIDE = 16000

FONT_SIZES = {
    "title": 18,
    "subtitle": 12,
    "node": 14,
    "badge": 10,
    "port": 12,
    "detail": 11,
    "terminal": 12,
    "legend": 11,
}
BOLD_ROLES = {"title", "node", "badge", "port", "terminal"}


# --------------------------------------------------------------------------
# The pipeline as read from the YAML mappings
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PortInfo:
    """One tensor port of a node."""

    name: str
    shape: str
    dtype: str
    kind: str | None


@dataclass
class NodeInfo:
    """One computation node: its backend label and its ports in YAML order."""

    name: str
    index: int
    backend: str | None
    inputs: list[PortInfo]
    outputs: list[PortInfo]


@dataclass(frozen=True)
class Connection:
    """One edge of the pipeline: `src_node/src_port` feeds `dst_node/dst_port`."""

    src_node: str
    src_port: str
    dst_node: str
    dst_port: str
    kind: str


@dataclass
class PipelineView:
    """The parts of `models` and `pipeline` that the picture shows."""

    nodes: dict[str, NodeInfo]
    connections: list[Connection]
    graph_inputs: list[tuple[str, str]]
    graph_outputs: list[tuple[str, str]]


def _format_shape(shape: Any) -> str:
    """Return a shape as `[d0, d1]`; a JSON string is accepted like the runtime does."""
    if shape is None:
        return "[?]"
    if isinstance(shape, str):
        try:
            shape = json.loads(shape)
        except ValueError:
            return shape
    if isinstance(shape, (list, tuple)):
        return "[" + ", ".join(str(d) for d in shape) + "]"
    return str(shape)


def _clip(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """Shorten `text` to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_ports(node: str, side: str, entries: Any) -> list[PortInfo]:
    """Read a node's `inputs` or `outputs` list into PortInfo records."""
    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"node '{node}': '{side}' must be a list of tensor entries, got {type(entries).__name__}")
    ports: list[PortInfo] = []
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise ValueError(f"node '{node}': every entry of '{side}' needs a 'name', got {entry!r}")
        name = str(entry["name"])
        if name in seen:
            raise ValueError(f"node '{node}': port '{name}' appears twice in '{side}'")
        seen.add(name)
        kind = entry.get("kind")
        ports.append(
            PortInfo(
                name=name,
                shape=_format_shape(entry.get("shape")),
                dtype=str(entry.get("dtype", "?")),
                kind=None if kind is None else str(kind),
            )
        )
    return ports


def _parse_nodes(models: Mapping[str, Any], backends: Mapping[str, str | None] | None) -> dict[str, NodeInfo]:
    """Read the `models` mapping, keeping its order."""
    if not isinstance(models, Mapping):
        raise ValueError(f"'models' must be a mapping of node name to description, got {type(models).__name__}")
    nodes: dict[str, NodeInfo] = {}
    for index, (name, spec) in enumerate(models.items()):
        name = str(name)
        if not isinstance(spec, Mapping):
            raise ValueError(f"node '{name}': description must be a mapping, got {type(spec).__name__}")
        params = spec.get("parameters") or {}
        backend = params.get("backend") if isinstance(params, Mapping) else None
        if backends is not None and name in backends:
            backend = backends[name]
        nodes[name] = NodeInfo(
            name=name,
            index=index,
            backend=None if backend is None else str(backend),
            inputs=_parse_ports(name, "inputs", spec.get("inputs")),
            outputs=_parse_ports(name, "outputs", spec.get("outputs")),
        )
    if backends is not None:
        unknown = sorted(set(map(str, backends)) - set(nodes))
        if unknown:
            raise ValueError(f"'backends' names unknown node(s): {', '.join(unknown)}")
    return nodes


def _split_endpoint(ref: Any, nodes: Mapping[str, NodeInfo], flow: str) -> tuple[str, str]:
    """Split `"node/port"` into its parts, matching the longest known node name."""
    text = str(ref)
    matches = [n for n in nodes if text.startswith(n + "/")]
    if not matches:
        head = text.split("/", 1)[0] if "/" in text else text
        known = ", ".join(nodes) or "(none)"
        raise ValueError(f"{flow} endpoint '{text}' names unknown node '{head}' (known nodes: {known})")
    node = max(matches, key=len)
    return node, text[len(node) + 1 :]


def _check_port(nodes: Mapping[str, NodeInfo], node: str, port: str, side: str, where: str) -> None:
    """Raise if `port` is not one of the node's `side` ports."""
    ports = nodes[node].inputs if side == "inputs" else nodes[node].outputs
    if not any(p.name == port for p in ports):
        names = ", ".join(p.name for p in ports) or "(none)"
        raise ValueError(f"{where} names '{node}/{port}', but node '{node}' has no {side[:-1]} '{port}' ({side}: {names})")


def _parse_flow(flow: Any, kind: str, nodes: Mapping[str, NodeInfo]) -> list[Connection]:
    """Read a `data_flow` or `feedback_flow` mapping into connections."""
    label = "data_flow" if kind == FORWARD else "feedback_flow"
    if flow is None:
        return []
    if not isinstance(flow, Mapping):
        raise ValueError(f"pipeline '{label}' must be a mapping, got {type(flow).__name__}")
    connections: list[Connection] = []
    for src, targets in flow.items():
        src_node, src_port = _split_endpoint(src, nodes, label)
        _check_port(nodes, src_node, src_port, "outputs", label)
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, (list, tuple)):
            raise ValueError(f"{label} entry '{src}' must list its targets, got {type(targets).__name__}")
        for dst in targets:
            dst_node, dst_port = _split_endpoint(dst, nodes, label)
            _check_port(nodes, dst_node, dst_port, "inputs", label)
            connections.append(Connection(src_node, src_port, dst_node, dst_port, kind))
    return connections


def _parse_terminals(mapping: Any, side: str, nodes: Mapping[str, NodeInfo]) -> list[tuple[str, str]]:
    """Read `pipeline.inputs` or `pipeline.outputs` into (node, port) pairs."""
    if mapping is None:
        return []
    if not isinstance(mapping, Mapping):
        raise ValueError(f"pipeline '{side}' must be a mapping of node to port names, got {type(mapping).__name__}")
    pairs: list[tuple[str, str]] = []
    for node, ports in mapping.items():
        node = str(node)
        if node not in nodes:
            raise ValueError(f"pipeline '{side}' names unknown node '{node}' (known nodes: {', '.join(nodes) or '(none)'})")
        for port in [ports] if isinstance(ports, str) else list(ports or []):
            _check_port(nodes, node, str(port), side, f"pipeline '{side}'")
            pairs.append((node, str(port)))
    return pairs


def parse_pipeline(
    models: Mapping[str, Any], pipeline: Mapping[str, Any], backends: Mapping[str, str | None] | None = None
) -> PipelineView:
    """Check and read the YAML `models` / `pipeline` mappings; raise ValueError on bad input."""
    nodes = _parse_nodes(models, backends)
    if pipeline is None:
        pipeline = {}
    if not isinstance(pipeline, Mapping):
        raise ValueError(f"'pipeline' must be a mapping, got {type(pipeline).__name__}")
    connections = _parse_flow(pipeline.get("data_flow"), FORWARD, nodes)
    connections += _parse_flow(pipeline.get("feedback_flow"), FEEDBACK, nodes)
    return PipelineView(
        nodes=nodes,
        connections=connections,
        graph_inputs=_parse_terminals(pipeline.get("inputs"), "inputs", nodes),
        graph_outputs=_parse_terminals(pipeline.get("outputs"), "outputs", nodes),
    )


# --------------------------------------------------------------------------
# Fonts and text measurement
# --------------------------------------------------------------------------

FontT = Any  # ImageFont.FreeTypeFont, or ImageFont.ImageFont without FreeType


def _load_font(bold: bool, size: int) -> FontT:
    """DejaVu Sans (bold or regular) at `size`, else Pillow's bundled font at `size`."""
    for name in (["DejaVuSans-Bold.ttf"] if bold else []) + ["DejaVuSans.ttf"]:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no sized default font
        return ImageFont.load_default()


def _load_fonts(scale: int) -> dict[str, FontT]:
    """Every font role at `scale` times its logical size."""
    return {role: _load_font(role in BOLD_ROLES, size * scale) for role, size in FONT_SIZES.items()}


def _is_scalable(fonts: Mapping[str, FontT]) -> bool:
    """Whether the fonts honour their requested size (FreeType fonts do)."""
    return all(isinstance(f, ImageFont.FreeTypeFont) for f in fonts.values())


def _text_w(fonts: Mapping[str, FontT], role: str, text: str) -> float:
    """Width of `text` in logical pixels."""
    return float(fonts[role].getlength(text))


# --------------------------------------------------------------------------
# Layout items
# --------------------------------------------------------------------------


@dataclass
class PortSlot:
    """A port as drawn on a card: its text lines and vertical anchor."""

    port: PortInfo
    top: float
    height: float

    @property
    def anchor(self) -> float:
        return self.top + PORT_PAD + NAME_LINE / 2


@dataclass
class Item:
    """A box in the layered layout: a node card, a terminal, or an edge bend point."""

    key: tuple
    kind: str  # "node", "in", "out", "dummy"
    width: float
    height: float
    label: str = ""
    sublabel: str = ""
    node: NodeInfo | None = None
    in_slots: dict[str, PortSlot] = field(default_factory=dict)
    out_slots: dict[str, PortSlot] = field(default_factory=dict)
    layer: int = 0
    order: int = 0
    x: float = 0.0
    y: float = 0.0
    col_right: float = 0.0  # right edge of the item's column

    def in_port_names(self) -> list[str]:
        if self.kind == "node":
            return list(self.in_slots)
        return ["in"] if self.kind == "out" else ([] if self.kind == "in" else [""])

    def out_port_names(self) -> list[str]:
        if self.kind == "node":
            return list(self.out_slots)
        return ["out"] if self.kind == "in" else ([] if self.kind == "out" else [""])

    def in_anchor(self, port: str) -> tuple[float, float]:
        """Where an edge enters this item."""
        if self.kind == "node":
            return self.x, self.y + self.in_slots[port].anchor
        if self.kind == "out":
            return self.x + TERMINAL_TIP, self.y + self.height / 2
        return self.x, self.y + self.height / 2

    def out_anchor(self, port: str) -> tuple[float, float]:
        """Where an edge leaves this item."""
        if self.kind == "node":
            return self.x + self.width, self.y + self.out_slots[port].anchor
        return self.x + self.width, self.y + self.height / 2


@dataclass
class Link:
    """A layout edge between items of adjacent layers."""

    src: Item
    src_port: str
    dst: Item
    dst_port: str


@dataclass
class Chain:
    """One drawn edge: the links it follows from source port to target port."""

    kind: str
    links: list[Link]


@dataclass
class Loop:
    """An edge drawn back through a lane (feedback, or a data edge that closes a cycle)."""

    kind: str
    src: Item
    src_port: str
    dst: Item
    dst_port: str
    band: int = 0
    lane: int = 0
    xs: float = 0.0
    xt: float = 0.0


def _port_block_height(port: PortInfo) -> float:
    return PORT_PAD + NAME_LINE + DETAIL_LINE + (DETAIL_LINE if port.kind else 0) + PORT_PAD


def _port_text_w(fonts: Mapping[str, FontT], port: PortInfo) -> float:
    widths = [_text_w(fonts, "port", _clip(port.name)), _text_w(fonts, "detail", _detail_text(port))]
    if port.kind:
        widths.append(_text_w(fonts, "detail", _clip(port.kind)))
    return max(widths)


def _detail_text(port: PortInfo) -> str:
    return f"{port.shape}  {port.dtype}"


def _badge_text(backend: str | None) -> str:
    return NO_MODEL_LABEL if backend is None else backend


def _badge_w(fonts: Mapping[str, FontT], backend: str | None) -> float:
    return _text_w(fonts, "badge", _badge_text(backend)) + 14


def _stack_slots(ports: Sequence[PortInfo]) -> tuple[dict[str, PortSlot], float]:
    """Place ports top to bottom below the header; return slots and total height."""
    slots: dict[str, PortSlot] = {}
    top = HEADER_H + BODY_PAD_TOP
    for port in ports:
        h = _port_block_height(port)
        slots[port.name] = PortSlot(port, top, h)
        top += h
    return slots, top - HEADER_H - BODY_PAD_TOP


def _node_item(fonts: Mapping[str, FontT], node: NodeInfo) -> Item:
    """A card sized to fit its header and both port columns without overlap."""
    in_slots, in_h = _stack_slots(node.inputs)
    out_slots, out_h = _stack_slots(node.outputs)
    in_w = max((_port_text_w(fonts, p) for p in node.inputs), default=0.0)
    out_w = max((_port_text_w(fonts, p) for p in node.outputs), default=0.0)
    mid = CARD_MID_GAP if in_w and out_w else 0
    header_w = CARD_PAD_X + _text_w(fonts, "node", _clip(node.name)) + 14 + _badge_w(fonts, node.backend) + CARD_PAD_X
    width = math.ceil(max(CARD_MIN_W, header_w, CARD_PAD_X + in_w + mid + out_w + CARD_PAD_X))
    height = HEADER_H + BODY_PAD_TOP + max(in_h, out_h, 18) + BODY_PAD_BOTTOM
    return Item(("node", node.name), "node", width, height, node=node, in_slots=in_slots, out_slots=out_slots)


def _terminal_item(fonts: Mapping[str, FontT], kind: str, node: NodeInfo, port: str) -> Item:
    """A graph input (`kind="in"`) or output (`kind="out"`) tag for `node/port`."""
    info = next(p for p in (node.inputs if kind == "in" else node.outputs) if p.name == port)
    label, sub = _clip(port), _detail_text(info)
    text_w = max(_text_w(fonts, "terminal", label), _text_w(fonts, "detail", sub))
    width = math.ceil(text_w + 2 * 10 + TERMINAL_TIP + (TERMINAL_TIP if kind == "out" else 0))
    return Item((kind, node.name, port), kind, width, TERMINAL_H, label=label, sublabel=sub, node=node)


# --------------------------------------------------------------------------
# Layering and ordering
# --------------------------------------------------------------------------


def _split_forward(view: PipelineView) -> tuple[list[Connection], list[Connection]]:
    """Forward edges that keep the data flow acyclic, and those drawn as loops instead."""
    graph = nx.DiGraph()
    graph.add_nodes_from(view.nodes)
    kept: list[Connection] = []
    looped: list[Connection] = []
    for conn in view.connections:
        if conn.kind != FORWARD:
            looped.append(conn)
        elif conn.src_node == conn.dst_node or nx.has_path(graph, conn.dst_node, conn.src_node):
            logger.warning("data_flow edge %s/%s -> %s/%s closes a cycle; drawn as a loop",
                           conn.src_node, conn.src_port, conn.dst_node, conn.dst_port)
            looped.append(conn)
        else:
            graph.add_edge(conn.src_node, conn.dst_node)
            kept.append(conn)
    return kept, looped


def _assign_layers(view: PipelineView, forward: Sequence[Connection]) -> dict[str, int]:
    """Longest-path layers over forward edges; sources move right next to their first consumer."""
    graph = nx.DiGraph()
    graph.add_nodes_from(view.nodes)
    graph.add_edges_from((c.src_node, c.dst_node) for c in forward)
    order = list(nx.lexicographical_topological_sort(graph, key=lambda n: f"{view.nodes[n].index:09d}"))
    layer: dict[str, int] = {}
    for n in order:
        layer[n] = max((layer[p] + 1 for p in graph.predecessors(n)), default=0)
    for n in reversed(order):
        succ = [layer[s] for s in graph.successors(n)]
        if succ and graph.in_degree(n) == 0:
            layer[n] = min(succ) - 1
    if any(layer[n] == 0 for n, _ in view.graph_inputs):
        layer = {n: v + 1 for n, v in layer.items()}
    return layer


def _build_items(
    fonts: Mapping[str, FontT], view: PipelineView, forward: Sequence[Connection], layer: Mapping[str, int]
) -> tuple[list[Item], list[Chain]]:
    """Node, terminal and bend-point items, plus the chain of links for every drawn edge."""
    items: list[Item] = []
    node_items: dict[str, Item] = {}
    for node in view.nodes.values():
        item = _node_item(fonts, node)
        item.layer = layer[node.name]
        node_items[node.name] = item
        items.append(item)
    chains: list[Chain] = []
    for index, conn in enumerate(forward):
        links: list[Link] = []
        prev, prev_port = node_items[conn.src_node], conn.src_port
        for lay in range(layer[conn.src_node] + 1, layer[conn.dst_node]):
            dummy = Item(("dummy", index, lay), "dummy", 0, DUMMY_H, layer=lay)
            items.append(dummy)
            links.append(Link(prev, prev_port, dummy, ""))
            prev, prev_port = dummy, ""
        links.append(Link(prev, prev_port, node_items[conn.dst_node], conn.dst_port))
        chains.append(Chain(FORWARD, links))
    for node, port in view.graph_inputs:
        term = _terminal_item(fonts, "in", view.nodes[node], port)
        term.layer = layer[node] - 1
        items.append(term)
        chains.append(Chain(GRAPH_INPUT, [Link(term, "out", node_items[node], port)]))
    for node, port in view.graph_outputs:
        term = _terminal_item(fonts, "out", view.nodes[node], port)
        term.layer = layer[node] + 1
        items.append(term)
        chains.append(Chain(GRAPH_OUTPUT, [Link(node_items[node], port, term, "in")]))
    return items, chains


def _group_layers(items: Iterable[Item]) -> list[list[Item]]:
    """Items grouped by layer, in creation order."""
    layers: dict[int, list[Item]] = {}
    for item in items:
        layers.setdefault(item.layer, []).append(item)
    grouped = [layers.get(i, []) for i in range(max(layers, default=-1) + 1)]
    for row in grouped:
        for pos, item in enumerate(row):
            item.order = pos
    return grouped


def _port_pos(item: Item, port: str, side: str) -> float:
    """Position of a port along its layer: the item's order plus a fraction for the port."""
    names = item.in_port_names() if side == "in" else item.out_port_names()
    rank = names.index(port) if port in names else 0
    return item.order + (rank + 1) / (len(names) + 1)


def _links_by_layer(chains: Iterable[Chain], n_layers: int) -> list[list[Link]]:
    """Links grouped by the layer of their source item."""
    grouped: list[list[Link]] = [[] for _ in range(n_layers)]
    for chain in chains:
        for link in chain.links:
            grouped[link.src.layer].append(link)
    return grouped


def _crossings(links: Sequence[Link]) -> int:
    """Number of crossing pairs among links between two adjacent layers."""
    pairs = sorted((_port_pos(l.src, l.src_port, "out"), _port_pos(l.dst, l.dst_port, "in")) for l in links)
    seen: list[float] = []
    count = 0
    for _, dst in pairs:
        count += len(seen) - bisect.bisect_right(seen, dst)
        bisect.insort(seen, dst)
    return count


def _sort_by_barycenter(row: list[Item], links: Sequence[Link], side: str) -> None:
    """Reorder one layer by the mean position of its neighbours in the adjacent layer."""
    sums: dict[int, list[float]] = {}
    for link in links:
        if side == "in":
            sums.setdefault(id(link.dst), []).append(_port_pos(link.src, link.src_port, "out"))
        else:
            sums.setdefault(id(link.src), []).append(_port_pos(link.dst, link.dst_port, "in"))
    def key(item: Item) -> tuple[float, int]:
        vals = sums.get(id(item))
        return (sum(vals) / len(vals) if vals else item.order + 0.5, item.order)
    row.sort(key=key)
    for pos, item in enumerate(row):
        item.order = pos


def _order_layers(layers: list[list[Item]], links: list[list[Link]]) -> int:
    """A few barycenter sweeps; keep the ordering with the fewest crossings. Returns that count."""
    def total() -> int:
        return sum(_crossings(group) for group in links)

    best = total()
    best_orders = [list(row) for row in layers]
    for sweep in range(ORDER_SWEEPS):
        if best == 0:
            break
        if sweep % 2 == 0:
            for i in range(1, len(layers)):
                _sort_by_barycenter(layers[i], links[i - 1], "in")
        else:
            for i in range(len(layers) - 2, -1, -1):
                _sort_by_barycenter(layers[i], links[i], "out")
        count = total()
        if count < best:
            best, best_orders = count, [list(row) for row in layers]
    for i, row in enumerate(best_orders):
        layers[i] = row
        for pos, item in enumerate(row):
            item.order = pos
    return best


# --------------------------------------------------------------------------
# Placement: rows (bands) of columns, lanes, slots
# --------------------------------------------------------------------------


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


def _column_height(row: Sequence[Item]) -> float:
    return sum(i.height for i in row) + ROW_GAP * max(len(row) - 1, 0)


def _choose_columns(layers: Sequence[Sequence[Item]]) -> int:
    """How many layers go in one row: all of them for short pipelines, else aim at a wide page."""
    n = len(layers)
    if n < WRAP_MIN_LAYERS:
        return max(n, 1)
    pitch = sum(max((i.width for i in row if i.kind != "dummy"), default=MIN_COL_W) for row in layers) / n + BASE_GAP
    band_h = max(_column_height(row) for row in layers) + 2 * BAND_PAD
    cols = round(math.sqrt(n * TARGET_ASPECT * band_h / pitch))
    return max(WRAP_MIN_COLS, min(WRAP_MAX_COLS, cols, n))


def _loop_bands_and_lanes(loops: list[Loop], grid_cols: int, n_bands: int) -> list[int]:
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


@dataclass
class Wrap:
    """A link that leaves the last column of one band and enters the first of the next."""

    link: Link
    band: int
    lane: int = 0
    xr: float = 0.0
    xl: float = 0.0


def _collect_wraps(chains: Iterable[Chain], grid_cols: int, n_bands: int) -> tuple[dict[int, Wrap], list[int]]:
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


@dataclass
class Vertical:
    """A vertical run in a column gap, spanning bands lo..hi, sorted by `rank` (inner first)."""

    owner: Any
    attr: str
    lo: int
    hi: int
    rank: tuple
    slot: int = 0


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


def _gap_verticals(loops: Sequence[Loop], wraps: Mapping[int, Wrap], cols: int) -> tuple[list[list[Vertical]], list[list[Vertical]]]:
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


def _build_grid(layers: Sequence[Sequence[Item]], cols: int, src_v: list[list[Vertical]], tgt_v: list[list[Vertical]]) -> Grid:
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


def _place_x(layers: Sequence[Sequence[Item]], grid: Grid) -> None:
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


def _place_y(layers: Sequence[Sequence[Item]], links: Sequence[Sequence[Link]], grid: Grid,
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


# --------------------------------------------------------------------------
# Edge geometry
# --------------------------------------------------------------------------

Point = tuple[float, float]


def _bezier(p0: Point, p1: Point) -> list[Point]:
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


def _rounded(points: Sequence[Point], radius: float = CORNER) -> list[Point]:
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


def _wrap_points(wrap: Wrap, grid: Grid) -> list[Point]:
    """Out of the right gutter, back along a lane below the band, into the left gutter."""
    link = wrap.link
    x1, y1 = link.src.out_anchor(link.src_port)
    x2, y2 = link.dst.in_anchor(link.dst_port)
    lane_y = grid.content_top[wrap.band] + grid.content_h[wrap.band] + BAND_PAD + LANE * wrap.lane
    return _rounded([(x1, y1), (wrap.xr, y1), (wrap.xr, lane_y), (wrap.xl, lane_y), (wrap.xl, y2), (x2, y2)])


def _chain_points(chain: Chain, wraps: Mapping[int, Wrap], grid: Grid) -> list[Point]:
    """The full polyline of one drawn edge, through its bend points."""
    pts: list[Point] = []
    for link in chain.links:
        start = link.src.out_anchor(link.src_port)
        end = link.dst.in_anchor(link.dst_port)
        if id(link) in wraps:
            seg = _wrap_points(wraps[id(link)], grid)
        else:
            # leave a card narrower than its column straight, so the curve stays in the gap
            stub = [start] if start[0] >= link.src.col_right else [start, (link.src.col_right, start[1])]
            seg = stub[:-1] + _bezier(stub[-1], end)
        pts.extend(seg if not pts else seg[1:])
        if link.dst.kind == "dummy":
            pts.append(link.dst.out_anchor(""))
    return pts


def _loop_points(loop: Loop, grid: Grid) -> list[Point]:
    """Right out of the source, up to the loop's lane, across, and down into the target."""
    x1, y1 = loop.src.out_anchor(loop.src_port)
    x2, y2 = loop.dst.in_anchor(loop.dst_port)
    lane_y = grid.band_top[loop.band] + LANE_PAD / 2 + LANE * loop.lane
    return _rounded([(x1, y1), (loop.xs, y1), (loop.xs, lane_y), (loop.xt, lane_y), (loop.xt, y2), (x2, y2)])


# --------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------


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
        for piece in _dash(pts, *DASH):
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


def _dash(pts: Sequence[Point], on: float, off: float) -> list[list[Point]]:
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


def _badge_color(backend: str | None) -> tuple[int, int, int]:
    if backend is None:
        return BADGE_NONE
    return BADGE_COLORS.get(backend.lower(), BADGE_OTHER)


def _draw_badge(p: Painter, right: float, cy: float, backend: str | None) -> float:
    """A pill with the backend name, right-aligned at `right`; returns its width."""
    w = _badge_w(p.measure, backend)
    color = _badge_color(backend)
    box = (right - w, cy - 9, right, cy + 9)
    if backend is None:
        p.rect(box, fill=CARD_FILL, outline=color, radius=9, width=1.2)
    else:
        p.rect(box, fill=color, outline=color, radius=9)
    p.text((right - w / 2, cy + 0.5), _badge_text(backend), "badge", color if backend is None else (255, 255, 255), "mm")
    return w


def _draw_port(p: Painter, item: Item, slot: PortSlot, side: str, dot: tuple[int, int, int]) -> None:
    """A port's three text lines and its anchor dot on the card edge."""
    port = slot.port
    left = side == "in"
    x = item.x + CARD_PAD_X if left else item.x + item.width - CARD_PAD_X
    anchor = "lm" if left else "rm"
    y = item.y + slot.top + PORT_PAD
    p.text((x, y + NAME_LINE / 2), _clip(port.name), "port", TEXT, anchor)
    p.text((x, y + NAME_LINE + DETAIL_LINE / 2), _detail_text(port), "detail", TEXT_MUTED, anchor)
    if port.kind:
        p.text((x, y + NAME_LINE + DETAIL_LINE * 1.5), _clip(port.kind), "detail", KIND_TEXT, anchor)
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
    p.text((x0 + CARD_PAD_X, y0 + HEADER_H / 2), _clip(node.name), "node", TEXT)
    _draw_badge(p, x1 - CARD_PAD_X, y0 + HEADER_H / 2, node.backend)
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


EDGE_STYLE = {
    FORWARD: (FORWARD_COLOR, FORWARD_W, False),
    GRAPH_INPUT: (INPUT_COLOR, IO_W, False),
    GRAPH_OUTPUT: (OUTPUT_COLOR, IO_W, False),
    FEEDBACK: (FEEDBACK_COLOR, FEEDBACK_W, True),
}


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


def _legend_entries() -> list[tuple[str, str]]:
    return [
        (FORWARD, "data flow"),
        (FEEDBACK, "feedback (read on the next call)"),
        (GRAPH_INPUT, "graph input"),
        (GRAPH_OUTPUT, "graph output"),
    ]


def _legend_width(fonts: Mapping[str, FontT]) -> float:
    entries = sum(48 + _text_w(fonts, "legend", text) + 22 for _, text in _legend_entries())
    badges = _text_w(fonts, "legend", "backend:") + 8 + sum(
        _badge_w(fonts, b) + 6 for b in ("jit", "onnx", "pt2", None))
    return entries + badges


def _stats_text(view: PipelineView) -> str:
    n_fwd = sum(c.kind == FORWARD for c in view.connections)
    n_fb = len(view.connections) - n_fwd
    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"
    return " · ".join([
        plural(len(view.nodes), "node"), plural(n_fwd, "data edge"), plural(n_fb, "feedback edge"),
        plural(len(view.graph_inputs), "graph input"), plural(len(view.graph_outputs), "graph output"),
    ])


HEADER_BLOCK_H = 96


def _draw_header(p: Painter, graph_name: str, view: PipelineView) -> None:
    """Title, statistics and the legend."""
    p.text((MARGIN, 26), graph_name, "title", TEXT)
    p.text((MARGIN, 48), _stats_text(view), "subtitle", TEXT_MUTED)
    x, y = float(MARGIN), 76.0
    for kind, text in _legend_entries():
        if kind in (GRAPH_INPUT, GRAPH_OUTPUT):
            sample = Item(("legend",), "in" if kind == GRAPH_INPUT else "out", 36, 18, x=x, y=y - 9)
            color, fill = (INPUT_COLOR, INPUT_FILL) if kind == GRAPH_INPUT else (OUTPUT_COLOR, OUTPUT_FILL)
            p.polygon(_terminal_outline(sample), fill=fill, outline=color)
        else:
            _draw_edge(p, [(x, y), (x + 36, y)], kind)
        p.text((x + 46, y), text, "legend", TEXT)
        x += 48 + _text_w(p.measure, "legend", text) + 22
    p.text((x, y), "backend:", "legend", TEXT)
    x += _text_w(p.measure, "legend", "backend:") + 8
    for backend in ("jit", "onnx", "pt2", None):
        w = _badge_w(p.measure, backend)
        _draw_badge(p, x + w, y, backend)
        x += w + 6


def _port_dots(view: PipelineView) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    """Anchor dot colours: graph I/O ports in their terminal colour, feedback ends in feedback colour."""
    dots: dict[tuple[str, str, str], tuple[int, int, int]] = {}
    for conn in view.connections:
        color = FEEDBACK_COLOR if conn.kind == FEEDBACK else FORWARD_COLOR
        dots[(conn.src_node, "out", conn.src_port)] = dots.get((conn.src_node, "out", conn.src_port), color)
        dots[(conn.dst_node, "in", conn.dst_port)] = color
    for node, port in view.graph_inputs:
        dots[(node, "in", port)] = INPUT_COLOR
    for node, port in view.graph_outputs:
        dots.setdefault((node, "out", port), OUTPUT_COLOR)
    return dots


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


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
        """The points of a loop's route (feedback, or an edge to an earlier layer)."""
        return _loop_points(loop, self.grid)


def layout_pipeline(view: PipelineView) -> Scene:
    """Where the picture of `view` places every card, terminal and edge, in logical
    pixels: the layout render_pipeline paints (tests read it to check placement)."""
    return _layout(view, _load_fonts(1))


def _layout(view: PipelineView, fonts: Mapping[str, FontT]) -> Scene:
    """Compute positions of every card, terminal and edge route, in logical pixels."""
    forward, looped = _split_forward(view)
    layer = _assign_layers(view, forward)
    items, chains = _build_items(fonts, view, forward, layer)
    node_items = {i.key[1]: i for i in items if i.kind == "node"}
    layers = _group_layers(items)
    links = _links_by_layer(chains, len(layers))
    crossings = _order_layers(layers, links)
    cols = _choose_columns(layers)
    n_bands = (len(layers) + cols - 1) // cols
    loops = [Loop(FEEDBACK if c.kind == FEEDBACK else FORWARD, node_items[c.src_node], c.src_port,
                  node_items[c.dst_node], c.dst_port) for c in looped]
    loop_counts = _loop_bands_and_lanes(loops, cols, n_bands)
    wraps, wrap_counts = _collect_wraps(chains, cols, n_bands)
    src_v, tgt_v = _gap_verticals(loops, wraps, cols)
    grid = _build_grid(layers, cols, src_v, tgt_v)
    _place_x(layers, grid)
    _place_y(layers, links, grid, loop_counts, wrap_counts, top=HEADER_BLOCK_H + 8)
    width = math.ceil(max(grid.width, MARGIN * 2 + _legend_width(fonts), MARGIN * 2 + 200))
    return Scene(items, chains, loops, wraps, grid, width, math.ceil(grid.height), crossings)


def _paint(scene: Scene, view: PipelineView, graph_name: str, scale: int, fonts: Mapping[str, FontT],
           measure: Mapping[str, FontT]) -> Image.Image:
    """Draw the scene; edges first, then cards and terminals, then feedback on top."""
    painter = Painter(scene.width, scene.height, scale, fonts, measure)
    _draw_header(painter, graph_name, view)
    for chain in scene.chains:
        _draw_edge(painter, _chain_points(chain, scene.wraps, scene.grid), chain.kind)
    dots = _port_dots(view)
    for item in scene.items:
        if item.kind == "node":
            _draw_card(painter, item, dots)
        elif item.kind in ("in", "out"):
            _draw_terminal(painter, item)
    for loop in scene.loops:
        _draw_edge(painter, _loop_points(loop, scene.grid), loop.kind)
    return painter.image


def _finish(image: Image.Image, width: int, height: int) -> Image.Image:
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


def _write_png(image: Image.Image, png_path: str) -> None:
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


def render_pipeline(
    png_path: str,
    graph_name: str,
    models: dict,
    pipeline: dict,
    backends: dict[str, str | None] | None = None,
) -> str:
    """Draw the pipeline described by the YAML `models` and `pipeline` mappings to `png_path`.

    `backends` overrides the badge text per node (None draws "no model").
    Returns `png_path`. Raises RuntimeError naming the graph and the cause when the
    input is inconsistent (an edge naming an unknown node or port, ...) or drawing fails.
    """
    started = time.perf_counter()
    try:
        view = parse_pipeline(models, pipeline, backends)
        fonts_1x = _load_fonts(1)
        scene = _layout(view, fonts_1x)
        scalable = _is_scalable(fonts_1x)
        scale = 2 if scalable and scene.width * scene.height <= SUPERSAMPLE_MAX_PIXELS else 1
        image = _paint(scene, view, graph_name, scale, _load_fonts(scale) if scale != 1 else fonts_1x, fonts_1x)
        image = _finish(image, scene.width, scene.height)
        _write_png(image, png_path)
    except Exception as exc:
        raise RuntimeError(f"cannot render the graph '{graph_name}' to {png_path}: {exc}") from exc
    logger.debug("graph '%s': %d nodes, %d crossings, %dx%d px, rendered in %.3f s",
                 graph_name, len(view.nodes), scene.crossings, image.width, image.height,
                 time.perf_counter() - started)
    return png_path


def draw(model: Any, png_path: str, graph_name: str) -> str:
    """Draw a :class:`leapp.pipeline.Pipeline` to `png_path`."""
    documents = model.to_documents()
    return render_pipeline(png_path, graph_name, documents[0]["models"], documents[1]["pipeline"])
