"""The pipeline's wiring rules: every edge and graph port names ports that exist,
with equal shapes and dtypes, and every output is routed; the run order
(producers before consumers along forward edges).  Used by the pipeline model
(``leapp.bundle.pipeline``) as it reads a bundle.
"""
from __future__ import annotations

import heapq
from typing import Any, Mapping

from .log import reject
from .safe_load import clip, quote


def join_key(node: str, port: str) -> str:
    """``"node/port"``."""
    return f"{node}/{port}"


def check_wiring(nodes: Mapping[str, Any], edges: tuple[Any, ...],
                  inputs: tuple[tuple[str, str], ...],
                  outputs: tuple[tuple[str, str], ...]) -> None:
    """Every edge and graph port names existing ports that agree; every output is routed."""
    for node, name in inputs:
        if node not in nodes or nodes[node].input(name) is None:
            reject(f"Pipeline input {quote(join_key(node, name))} does not match any node "
                   f"input. Available nodes: {quote(list(nodes))}")
    for node, name in outputs:
        if node not in nodes or nodes[node].output(name) is None:
            reject(f"Pipeline output {quote(join_key(node, name))} does not match any node "
                   f"output. Available nodes: {quote(list(nodes))}")
    routed = {(e.src_node, e.src_port) for e in edges} | set(outputs)
    for name, node in nodes.items():
        missing = [p.name for p in node.outputs if (name, p.name) not in routed]
        if missing:
            reject(f"Node {quote(name)} has unroutable outputs: {quote(missing)}. Every model "
                   "output must appear in pipeline data_flow, feedback_flow, or pipeline "
                   "outputs. This may indicate the YAML was edited manually and is "
                   "inconsistent with the exported model.")
    for edge in edges:
        source = nodes.get(edge.src_node)
        if source is None:
            reject(f"Source node {quote(edge.src_node)} not found in models")
        out = source.output(edge.src_port)
        if out is None:
            reject(f"Source output {quote(edge.src_port)} not found in node "
                   f"{quote(edge.src_node)}. Available outputs: {quote(source.output_names)}")
        target = nodes.get(edge.dst_node)
        if target is None:
            reject(f"Target node {quote(edge.dst_node)} not found in models")
        inp = target.input(edge.dst_port)
        if inp is None:
            reject(f"Target input {quote(edge.dst_port)} not found in node "
                   f"{quote(edge.dst_node)}. Available inputs: {quote(target.input_names)}")
        src_key, dst_key = clip(edge.source), clip(edge.target)
        if list(out.shape) != list(inp.shape):
            reject(f"Shape mismatch in pipeline connection: {src_key} "
                   f"{tuple(out.shape)} -> {dst_key} {tuple(inp.shape)}")
        if out.torch_dtype != inp.torch_dtype:
            reject(f"Dtype mismatch in pipeline connection: {src_key} {out.torch_dtype} "
                   f"-> {dst_key} {inp.torch_dtype}")


def run_order(nodes: Mapping[str, Any], edges: tuple[Any, ...]) -> tuple[str, ...]:
    """Producers before consumers along forward edges; ties keep YAML order."""
    names = list(nodes)
    rank = {name: i for i, name in enumerate(names)}
    successors: dict[str, set[str]] = {name: set() for name in names}
    pending = dict.fromkeys(names, 0)
    for edge in edges:
        src, dst = edge.src_node, edge.dst_node
        if edge.feedback or src == dst or src not in rank or dst not in rank:
            continue
        if dst not in successors[src]:
            successors[src].add(dst)
            pending[dst] += 1
    ready = [rank[name] for name in names if pending[name] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(name)
        for nxt in successors[name]:
            pending[nxt] -= 1
            if pending[nxt] == 0:
                heapq.heappush(ready, rank[nxt])
    if len(order) != len(names):
        cycle = [name for name in names if pending[name] > 0]
        reject(f"pipeline data_flow has a cycle through nodes {quote(cycle)}; loops must be "
               "listed under feedback_flow")
    return tuple(order)
