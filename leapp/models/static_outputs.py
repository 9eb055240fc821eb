"""Which outputs of a loaded model depend on none of its inputs (static outputs).

A bundle's YAML does not say which outputs are ``static_outputs`` (gains, limits:
constants of the node); the model says it.  Each backend's graph is walked
forward once from its inputs: an output no input reaches is static.  The walk
is conservative: an op counts as reached when any value it reads, in its
nested blocks or subgraphs too, is reached, so a static answer is always right
(a constant whatever the inputs), and an output that reads an input and
ignores it is reported as not static.

``InferenceManager`` asks for it when its port catalogue is first read, on the
models it already loaded (an ONNX model's graph is read from its file with
``onnx``, its weights left on disk).
"""
from __future__ import annotations

from typing import Any, Iterable

__all__ = ["static_outputs"]


def static_outputs(backend: str, model: Any, path: str, count: int) -> tuple[bool, ...] | None:
    """Per output of the model, in its order, whether no input reaches it; None when the
    model's graph cannot be read or does not give ``count`` outputs."""
    try:
        if backend == "jit":
            flags = _torchscript(model)
        elif backend == "onnx":
            flags = _onnx(path)
        elif backend == "pt2":
            flags = _fx(model)
        else:
            return None
    except Exception:  # noqa: BLE001  (a graph this walk does not know: unknown, not wrong)
        return None
    if flags is None or len(flags) != count:
        return None
    return tuple(flags)


# ---- TorchScript -------------------------------------------------------------------------

def _block_reads(block: Any) -> Iterable[int]:
    """The values every node of a block (and of its nested blocks) reads."""
    for node in block.nodes():
        for value in node.inputs():
            yield value.unique()
        for inner in node.blocks():
            yield from _block_reads(inner)
    for value in block.returnNode().inputs():
        yield value.unique()


def _torchscript(model: Any) -> list[bool] | None:
    graph = model.graph
    inputs = list(graph.inputs())[1:]  # the first is the module itself: its attributes are constants
    reached = {value.unique() for value in inputs}
    for node in graph.nodes():
        reads = {value.unique() for value in node.inputs()}
        for block in node.blocks():
            reads.update(_block_reads(block))
        if reads & reached:
            reached.update(value.unique() for value in node.outputs())
    returned = list(graph.return_node().inputs())
    if len(returned) != 1:
        return None
    value = returned[0]
    producer = value.node()
    values = list(producer.inputs()) if producer.kind() in (
        "prim::TupleConstruct", "prim::ListConstruct") else [value]
    return [v.unique() not in reached for v in values]


# ---- ONNX ----------------------------------------------------------------------------------

def _subgraph_reads(graph: Any) -> Iterable[str]:
    for node in graph.node:
        yield from node.input
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _subgraph_reads(sub)


def _onnx(path: str) -> list[bool]:
    import onnx

    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    reached = {value.name for value in graph.input if value.name not in constants}
    for node in graph.node:  # ONNX keeps nodes in topological order
        reads = set(node.input)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                reads.update(_subgraph_reads(sub))
        if reads & reached:
            reached.update(node.output)
    return [output.name not in reached for output in graph.output]


# ---- torch.export (an fx GraphModule) ---------------------------------------------------------

def _fx(model: Any) -> list[bool] | None:
    from torch.utils._pytree import tree_leaves

    reached: set[Any] = set()
    output = None
    for node in model.graph.nodes:
        if node.op == "placeholder":
            reached.add(node)
        elif node.op == "output":
            output = node
        elif any(source in reached for source in node.all_input_nodes):
            reached.add(node)
    if output is None:
        return None
    leaves = tree_leaves(output.args[0])
    return [leaf not in reached for leaf in leaves]
