"""The layered layout's items (cards, terminals, bend points), their layers and
their order within a layer.

Nodes take longest-path layers along the forward edges (a source sits just
left of its first consumer); an edge spanning several layers gets a bend
point in each layer it crosses, and a few barycenter sweeps order every
layer to reduce crossings.  Feedback edges and a node's edges to itself are
drawn as loops instead (see placement and geometry).
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ...bundle.pipeline import FORWARD, Edge, Node, Pipeline, Port
from .fonts import FontT, badge_w, clip, detail_text, port_kind, port_text_w, text_w
from .style import GRAPH_INPUT, GRAPH_OUTPUT, BODY_PAD_BOTTOM, BODY_PAD_TOP, CARD_MID_GAP, CARD_MIN_W, CARD_PAD_X, DETAIL_LINE, DUMMY_H, HEADER_H, NAME_LINE, ORDER_SWEEPS, PORT_PAD, TERMINAL_H, TERMINAL_TIP

logger = logging.getLogger("leapp")


@dataclass
class PortSlot:
    """A port as drawn on a card: its text lines and vertical anchor."""

    port: Port
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
    node: Node | None = None
    backend: str | None = None  # the badge's text (None: "no model")
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
    """An edge drawn back through a lane (feedback, or a node's data edge to itself)."""

    kind: str
    src: Item
    src_port: str
    dst: Item
    dst_port: str
    band: int = 0
    lane: int = 0
    xs: float = 0.0
    xt: float = 0.0


# --------------------------------------------------------------------------
# Items
# --------------------------------------------------------------------------


def _port_block_height(port: Port) -> float:
    return PORT_PAD + NAME_LINE + DETAIL_LINE + (DETAIL_LINE if port_kind(port) else 0) + PORT_PAD


def _stack_slots(ports: Sequence[Port]) -> tuple[dict[str, PortSlot], float]:
    """Place ports top to bottom below the header; return slots and total height."""
    slots: dict[str, PortSlot] = {}
    top = HEADER_H + BODY_PAD_TOP
    for port in ports:
        h = _port_block_height(port)
        slots[port.name] = PortSlot(port, top, h)
        top += h
    return slots, top - HEADER_H - BODY_PAD_TOP


def node_item(fonts: Mapping[str, FontT], node: Node, backend: str | None) -> Item:
    """A card sized to fit its header and both port columns without overlap."""
    in_slots, in_h = _stack_slots(node.inputs)
    out_slots, out_h = _stack_slots(node.outputs)
    in_w = max((port_text_w(fonts, p) for p in node.inputs), default=0.0)
    out_w = max((port_text_w(fonts, p) for p in node.outputs), default=0.0)
    mid = CARD_MID_GAP if in_w and out_w else 0
    header_w = CARD_PAD_X + text_w(fonts, "node", clip(node.name)) + 14 + badge_w(fonts, backend) + CARD_PAD_X
    width = math.ceil(max(CARD_MIN_W, header_w, CARD_PAD_X + in_w + mid + out_w + CARD_PAD_X))
    height = HEADER_H + BODY_PAD_TOP + max(in_h, out_h, 18) + BODY_PAD_BOTTOM
    return Item(("node", node.name), "node", width, height, node=node, backend=backend,
                in_slots=in_slots, out_slots=out_slots)


def terminal_item(fonts: Mapping[str, FontT], kind: str, node: Node, port: str) -> Item:
    """A graph input (`kind="in"`) or output (`kind="out"`) tag for `node/port`."""
    info = node.input(port) if kind == "in" else node.output(port)
    if info is None:
        raise ValueError(f"graph {'input' if kind == 'in' else 'output'} {node.name}/{port} "
                         "names no port of its node")
    label, sub = clip(port), detail_text(info)
    text_width = max(text_w(fonts, "terminal", label), text_w(fonts, "detail", sub))
    width = math.ceil(text_width + 2 * 10 + TERMINAL_TIP + (TERMINAL_TIP if kind == "out" else 0))
    return Item((kind, node.name, port), kind, width, TERMINAL_H, label=label, sublabel=sub, node=node)


# --------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------


def split_edges(model: Pipeline) -> tuple[list[Edge], list[Edge]]:
    """The forward edges between two nodes, laid out in layers, and the edges drawn
    as loops instead: feedback, and a node's data edge to itself.

    The model's forward edges between distinct nodes are acyclic (``Pipeline``
    refuses a cycle), so every one of them goes left to right.
    """
    kept: list[Edge] = []
    looped: list[Edge] = []
    for edge in model.edges:
        if edge.feedback:
            looped.append(edge)
        elif edge.src_node == edge.dst_node:
            logger.warning("data_flow edge %s -> %s closes a cycle; drawn as a loop",
                           edge.source, edge.target)
            looped.append(edge)
        else:
            kept.append(edge)
    return kept, looped


def assign_layers(model: Pipeline, forward: Sequence[Edge]) -> dict[str, int]:
    """Longest-path layers over forward edges; sources move right next to their first consumer."""
    preds: dict[str, set[str]] = {name: set() for name in model.nodes}
    succs: dict[str, set[str]] = {name: set() for name in model.nodes}
    for edge in forward:
        preds[edge.dst_node].add(edge.src_node)
        succs[edge.src_node].add(edge.dst_node)
    # run_order puts producers before consumers along these very edges; the
    # layers below do not depend on which such order is walked
    layer: dict[str, int] = {}
    for n in model.run_order:
        layer[n] = max((layer[p] + 1 for p in preds[n]), default=0)
    for n in reversed(model.run_order):
        if succs[n] and not preds[n]:
            layer[n] = min(layer[s] for s in succs[n]) - 1
    if any(layer[n] == 0 for n, _ in model.inputs):
        layer = {n: v + 1 for n, v in layer.items()}
    return layer


def build_items(fonts: Mapping[str, FontT], model: Pipeline, backends: Mapping[str, str | None],
                forward: Sequence[Edge], layer: Mapping[str, int]) -> tuple[list[Item], list[Chain]]:
    """Node, terminal and bend-point items, plus the chain of links for every drawn edge."""
    items: list[Item] = []
    node_items: dict[str, Item] = {}
    for node in model.nodes.values():
        item = node_item(fonts, node, backends[node.name])
        item.layer = layer[node.name]
        node_items[node.name] = item
        items.append(item)
    chains: list[Chain] = []
    for index, edge in enumerate(forward):
        links: list[Link] = []
        prev, prev_port = node_items[edge.src_node], edge.src_port
        for lay in range(layer[edge.src_node] + 1, layer[edge.dst_node]):
            dummy = Item(("dummy", index, lay), "dummy", 0, DUMMY_H, layer=lay)
            items.append(dummy)
            links.append(Link(prev, prev_port, dummy, ""))
            prev, prev_port = dummy, ""
        links.append(Link(prev, prev_port, node_items[edge.dst_node], edge.dst_port))
        chains.append(Chain(FORWARD, links))
    for node, port in model.inputs:
        term = terminal_item(fonts, "in", model.nodes[node], port)
        term.layer = layer[node] - 1
        items.append(term)
        chains.append(Chain(GRAPH_INPUT, [Link(term, "out", node_items[node], port)]))
    for node, port in model.outputs:
        term = terminal_item(fonts, "out", model.nodes[node], port)
        term.layer = layer[node] + 1
        items.append(term)
        chains.append(Chain(GRAPH_OUTPUT, [Link(node_items[node], port, term, "in")]))
    return items, chains


def group_layers(items: Iterable[Item]) -> list[list[Item]]:
    """Items grouped by layer, in creation order."""
    layers: dict[int, list[Item]] = {}
    for item in items:
        layers.setdefault(item.layer, []).append(item)
    grouped = [layers.get(i, []) for i in range(max(layers, default=-1) + 1)]
    for row in grouped:
        for pos, item in enumerate(row):
            item.order = pos
    return grouped


def links_by_layer(chains: Iterable[Chain], n_layers: int) -> list[list[Link]]:
    """Links grouped by the layer of their source item."""
    grouped: list[list[Link]] = [[] for _ in range(n_layers)]
    for chain in chains:
        for link in chain.links:
            grouped[link.src.layer].append(link)
    return grouped


# --------------------------------------------------------------------------
# Order within layers
# --------------------------------------------------------------------------


def _port_pos(item: Item, port: str, side: str) -> float:
    """Position of a port along its layer: the item's order plus a fraction for the port."""
    names = item.in_port_names() if side == "in" else item.out_port_names()
    rank = names.index(port) if port in names else 0
    return item.order + (rank + 1) / (len(names) + 1)


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


def order_layers(layers: list[list[Item]], links: list[list[Link]]) -> int:
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
