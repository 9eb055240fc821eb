"""TorchScript backends: jit-script (torch.jit.script) and jit-trace (torch.jit.trace).

TorchScript's interpreter compiles a graph into instructions recursively: a
value used once, by the node right after the one producing it, is emitted
inline from its consumer (`can_emit_inline.h`), one C++ stack frame group per
link of such a chain.  A long dependent chain (a 10,000-step `x = x + 1;
x = x * 0.999` loop is a 20,000-link one) overflows the stack of whoever runs
the model: a segmentation fault, not an exception.  With an 8 MiB stack the
overflow comes at about 11,000 links.  export() measures the frozen graph's
deepest chain the same way the interpreter does and refuses a node above
MAX_INTERPRETER_DEPTH, naming the node and the backend, before any file is
written (for jit-trace before torch.jit.trace's own check runs the graph);
onnx and pt2 run such graphs without recursion.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch

from ...bundle.log import logger
from ...bundle.modes import save_via_memory
from ..export_errors import exporter_call
from . import ExportContext, Exported, prepare_inputs

# Deepest inline chain accepted: well under the ~11,000 at which an 8 MiB stack
# overflows, leaving room for smaller thread stacks and the caller's frames.
MAX_INTERPRETER_DEPTH = 4000

# Node kinds the interpreter never emits inline (from can_emit_inline.h).
_NOT_INLINED = frozenset({
    "prim::Param", "prim::TensorExprGroup", "prim::TensorExprDynamicGroup",
    "prim::StaticSubgraph", "prim::CudaFusionGroup", "prim::FusionGroup", "prim::BailOut"})


@contextlib.contextmanager
def torchscript_enabled() -> Iterator[None]:
    """TorchScript switched on while the node is scripted, then put back as it was.

    A client may run with TorchScript disabled (Isaac Lab's export entry point
    calls torch.jit._state.disable()), and then torch.jit.script / trace return
    the module unchanged, which cannot be frozen or saved.
    """
    state = torch.jit._state._enabled
    was_enabled = bool(state.enabled)
    if not was_enabled:
        logger.info("TorchScript is disabled; enabling it while the node is scripted.")
        torch.jit._state.enable()
    try:
        yield
    finally:
        if not was_enabled:
            torch.jit._state.disable()


def export(node: str, name: str, params: dict, module: torch.fx.GraphModule,
           example_inputs: list[torch.Tensor], input_names: list[str],
           output_names: list[str], out_dir: str, context: ExportContext) -> Exported:
    """Script or trace the node's GraphModule and save <node>.pt (frozen)."""
    inputs = prepare_inputs(example_inputs)
    module = module.eval()
    with torchscript_enabled(), exporter_call(node, name, module):
        if name == "jit-trace":
            # The module is the node's straight-line op log, so a second trace cannot
            # diverge and validation compares the model with the traced values:
            # torch's own check_trace (whose comparison imports torch.distributed's
            # DTensor, a second of a cold process) runs only when backend_params
            # ask for it, and after the depth check, since it runs the graph.
            scripted = torch.jit.trace(module, tuple(inputs), **dict(params, check_trace=False))
            check_interpreter_depth(node, name, scripted.graph)
            if params.get("check_trace", False):
                scripted = torch.jit.trace(module, tuple(inputs), **params)
        else:
            scripted = torch.jit.script(module)
        frozen = torch.jit.freeze(scripted.eval())
        check_interpreter_depth(node, name, frozen.graph)
        path = os.path.join(out_dir, f"{node}.pt")
        save_via_memory(lambda handle: torch.jit.save(frozen, handle), path)
    return Exported(model=frozen, path=path, yaml_backend="jit", input_names=input_names,
                    output_names=output_names)


def check_interpreter_depth(node: str, backend: str, graph: Any) -> None:
    """Raise when the TorchScript interpreter would overflow its stack on graph."""
    total = sum(1 for _ in graph.nodes())
    if total <= MAX_INTERPRETER_DEPTH:  # a chain is never longer than the graph
        return
    depth = interpreter_depth(graph)
    if depth > MAX_INTERPRETER_DEPTH:
        raise RuntimeError(
            f"node '{node}' cannot be exported with backend '{backend}': its graph holds a "
            f"chain of {depth} dependent operations, and the TorchScript interpreter recurses "
            f"once per link of such a chain, overflowing its stack (a crash of the process "
            f"that runs the model) beyond about {MAX_INTERPRETER_DEPTH}. Export this node "
            f"with export_with='onnx' or 'pt2', or split it into several nodes.")


def interpreter_depth(graph: Any) -> int:
    """The deepest recursion of TorchScript's interpreter emitting graph.

    First the same scan as torch's CanEmitInline (which nodes are emitted inline
    from their single consumer), done with an explicit stack, then the longest
    chain of inline nodes.
    """
    inline: set = set()

    def can_inline(value: Any) -> bool:
        producer = value.node()
        return (producer.kind() not in _NOT_INLINED and len(value.uses()) == 1
                and producer.outputsSize() == 1)

    def previous(node: Any) -> Any:
        node = node.prev()
        while node.kind() == "prim::Constant":
            node = node.prev()
        return node

    def enter(node: Any) -> list:
        for block in node.blocks():
            scan_block(block)
        return [node, list(node.inputs())[::-1], 0, previous(node)]

    def scan_node(root: Any) -> None:
        if root in inline:
            return
        stack = [enter(root)]
        while stack:
            frame = stack[-1]
            node, values, index, point = frame
            if index == len(values):
                stack.pop()
                if stack:  # back in the consumer: the producer is inline
                    inline.add(node)
                    stack[-1][3] = point
                    stack[-1][2] += 1
                continue
            producer = values[index].node()
            if point is not None and producer == point and can_inline(values[index]):
                if producer in inline:
                    frame[3] = None
                    frame[2] += 1
                else:
                    stack.append(enter(producer))
            else:
                frame[2] += 1

    def scan_block(block: Any) -> None:
        scan_node(block.returnNode())
        for node in reversed(list(block.nodes())):
            scan_node(node)

    scan_block(graph.block())
    depth: dict = {}
    deepest = 0

    def measure(block: Any, base: int) -> None:
        nonlocal deepest
        for node in block.nodes():
            here = 1 + max((depth.get(v.node(), 0) for v in node.inputs()
                            if v.node() in inline), default=0)
            depth[node] = here
            deepest = max(deepest, base + here)
            for sub in node.blocks():
                measure(sub, base + here)

    measure(graph.block(), 0)
    return deepest
