"""The op graph of a node's exported model, read from the file itself: ONNX graph nodes and
initializers, the TorchScript graph (inlined) or the exported program's FX graph.

Each op is {"op", "name", "inputs", "outputs", "attributes"}; each constant (an ONNX
initializer or Constant, a TorchScript tensor constant, an exported program's lifted
constant or buffer) is {"name", "shape", "dtype", "values"}, with its first values.
"""
from __future__ import annotations

import os
from typing import Any

#: How many values of a constant the view shows, and how many ops a node lists at most.
MAX_VALUES = 16
MAX_OPS = 5000


def _values(flat: list) -> list:
    out = []
    for value in flat[:MAX_VALUES]:
        out.append(value if isinstance(value, (int, float, bool)) else str(value))
    return out


def _tensor_summary(name: str, tensor: Any) -> dict[str, Any]:
    import torch
    values = tensor.detach().flatten()[:MAX_VALUES].cpu().tolist() if tensor.numel() else []
    return {"name": name, "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).replace("torch.", ""), "values": _values(values)}


def _onnx(path: str) -> dict[str, Any]:
    import onnx
    from onnx import numpy_helper
    model = onnx.load(path, load_external_data=False)
    constants = []
    for init in model.graph.initializer:
        constants.append(_array_summary(init.name, init, numpy_helper))
    ops = []
    for node in model.graph.node[:MAX_OPS]:
        attributes = {}
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                summary = _array_summary(node.output[0] if node.output else attr.name, attr.t,
                                         numpy_helper)
                attributes[attr.name] = f"tensor {summary['shape']} {summary['dtype']}"
                if node.op_type == "Constant":
                    constants.append(summary)
            elif attr.type == onnx.AttributeProto.GRAPH:
                attributes[attr.name] = f"subgraph ({len(attr.g.node)} ops)"
            else:
                value = onnx.helper.get_attribute_value(attr)
                if isinstance(value, bytes):
                    value = value.decode("utf-8", "replace")
                elif isinstance(value, (list, tuple)):
                    value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                             for v in value][:MAX_VALUES]
                attributes[attr.name] = value
        ops.append({"op": node.op_type, "name": node.name, "inputs": list(node.input),
                    "outputs": list(node.output), "attributes": attributes})
    return {"format": f"ONNX (opset {max((o.version for o in model.opset_import), default=0)})",
            "ops": ops, "constants": constants, "op_count": len(model.graph.node)}


def _array_summary(name: str, tensor: Any, numpy_helper: Any) -> dict[str, Any]:
    try:
        array = numpy_helper.to_array(tensor)
        values = _values(array.reshape(-1)[:MAX_VALUES].tolist())
        dtype = str(array.dtype)
    except Exception:  # noqa: BLE001  (external data not loaded, exotic types)
        values, dtype = [], str(tensor.data_type)
    return {"name": name, "shape": list(tensor.dims), "dtype": dtype, "values": values}


def _jit(path: str) -> dict[str, Any]:
    import torch
    module = torch.jit.load(path, map_location="cpu")
    graph = module.inlined_graph
    ops, constants = [], []
    nodes = list(graph.nodes())
    for node in nodes[:MAX_OPS]:
        outputs = [o.debugName() for o in node.outputs()]
        attributes: dict[str, Any] = {}
        if node.kind() == "prim::Constant" and node.hasAttribute("value"):
            value = node.output().toIValue()
            if isinstance(value, torch.Tensor):
                constants.append(_tensor_summary(outputs[0], value))
                attributes["value"] = f"tensor {list(value.shape)} " \
                    f"{str(value.dtype).replace('torch.', '')}"
            else:
                attributes["value"] = value if isinstance(value, (int, float, bool, str)) \
                    else str(value)
        elif node.kind() == "prim::GetAttr":
            attributes["name"] = node.s("name")
        ops.append({"op": node.kind(), "name": "", "outputs": outputs,
                    "inputs": [i.debugName() for i in node.inputs()],
                    "attributes": attributes})
    for name, tensor in list(module.named_buffers())[:MAX_OPS]:
        constants.append(dict(_tensor_summary(name, tensor), source="buffer"))
    return {"format": "TorchScript (inlined graph)", "ops": ops, "constants": constants,
            "op_count": len(nodes)}


def _pt2(path: str) -> dict[str, Any]:
    import torch

    from ...bundle.pt2_reader import load_pt2
    program = load_pt2(path)
    ops = []
    nodes = list(program.graph.nodes)
    for node in nodes[:MAX_OPS]:
        target = node.target if isinstance(node.target, str) else str(node.target)
        args = [str(a) for a in node.args] if node.op != "output" else [str(node.args[0])]
        attributes = {k: str(v) for k, v in node.kwargs.items()}
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor):
            attributes["shape"] = str(list(meta.shape))
        ops.append({"op": f"{node.op}: {target}" if node.op != "call_function" else target,
                    "name": node.name, "inputs": args, "outputs": [node.name],
                    "attributes": attributes})
    constants = [dict(_tensor_summary(name, value), source="constant")
                 for name, value in program.constants.items() if isinstance(value, torch.Tensor)]
    constants += [dict(_tensor_summary(name, value), source="state")
                  for name, value in program.state_dict.items()]
    return {"format": "torch.export program (FX graph)", "ops": ops, "constants": constants,
            "op_count": len(nodes)}


def op_graph(backend: str, path: str) -> dict[str, Any]:
    """The op graph of the model file at path; {"error": why} when it cannot be read."""
    kind = backend.lower()
    if kind not in ("onnx", "jit", "pt2"):
        kind = {".onnx": "onnx", ".pt": "jit", ".pt2": "pt2"}.get(
            os.path.splitext(path)[1].lower(), kind)
    try:
        if kind == "onnx":
            return _onnx(path)
        if kind == "jit":
            return _jit(path)
        if kind == "pt2":
            return _pt2(path)
        return {"error": f"no op graph reader for backend {backend!r}"}
    except Exception as exc:  # noqa: BLE001  (the view shows why instead)
        return {"error": f"{type(exc).__name__}: {exc}"}
