"""Turn a finished node's op log into a torch.fx.GraphModule (once per node).

The op log holds (func, args, kwargs, out) records whose traced arguments are
Refs to value ids; tensors from outside the node are constants registered on
the module.  Exporters consume the GraphModule.
"""
from __future__ import annotations

import builtins
import keyword
import operator
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from .. import _core
from .ops import BINARY_OPERATORS, reverse_dims
from ..bundle.log import logger
from .traced import clone_plain

_TENSOR_METHOD_OWNERS = (torch.Tensor, torch._C.TensorBase)
# Cast methods recorded as .to(dtype): TorchScript lacks some (e.g. .bool()).
_CAST_METHODS = {
    "bool": torch.bool, "half": torch.float16, "float": torch.float32, "double": torch.float64,
    "bfloat16": torch.bfloat16, "byte": torch.uint8, "char": torch.int8, "short": torch.int16,
    "int": torch.int32, "long": torch.int64,
}


def _is_tensor_method(func: Any) -> bool:
    """Methods of Tensor, including torch/_tensor.py's Python-level wrappers."""
    name = getattr(func, "__name__", None)
    if not name or not callable(getattr(torch.Tensor, name, None)):
        return False
    if any(getattr(owner, name, None) is func for owner in _TENSOR_METHOD_OWNERS):
        return True
    qualname = getattr(func, "__qualname__", "") or ""
    return getattr(func, "__module__", None) == "torch._tensor" or qualname.startswith(
        ("Tensor.", "TensorBase.", "_TensorBase."))


def _vector_norm(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict] | None:
    """Tensor.norm(p, dim, keepdim, dtype) as torch.linalg.vector_norm (scriptable)."""
    x = args[0]
    p = args[1] if len(args) > 1 else kwargs.get("p", "fro")
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    keepdim = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
    if p in ("fro", None):
        p = 2
    if not isinstance(p, (int, float)):
        return None
    if isinstance(dim, int):
        dim = [dim]
    return torch.linalg.vector_norm, (x, p), {"dim": dim, "keepdim": keepdim}


def _getter_name(func: Any) -> str | None:
    """'T' for Tensor.T.__get__ and the like (property reads that give tensors)."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", None) == "__get__" and owner is not None:
        return getattr(owner, "__name__", None)
    return None


class _Builder:
    def __init__(self, node: _core.Node) -> None:
        self.node = node
        self.root = torch.nn.Module()
        self.graph = fx.Graph()
        self.env: dict[int, fx.Node] = {}
        self.const_nodes: dict[int, fx.Node] = {}

    def constant(self, tensor: torch.Tensor) -> fx.Node:
        key = id(tensor)
        found = self.const_nodes.get(key)
        if found is None:
            name = f"_const_{len(self.const_nodes)}"
            self.root.register_buffer(name, clone_plain(tensor).contiguous())
            found = self.graph.get_attr(name)
            self.const_nodes[key] = found
        return found

    def arg(self, obj: Any) -> Any:
        if isinstance(obj, _core.Ref):
            if obj.kind == _core.REF_CONST:
                return self.constant(self.node.consts[obj.index])
            return self.env[obj.index]
        if isinstance(obj, torch.Tensor):
            return self.constant(obj)
        if isinstance(obj, torch.Size):
            return tuple(int(s) for s in obj)
        if isinstance(obj, np.generic) and obj.ndim == 0 and obj.dtype.kind in "biuf":
            # a NumPy scalar operand (0.5 * np.log(2 * np.pi) * t): torch treats
            # it as the Python number, which every exporter can write
            return obj.item()
        if isinstance(obj, tuple):
            return tuple(self.arg(o) for o in obj)
        if isinstance(obj, list):
            return [self.arg(o) for o in obj]
        if isinstance(obj, dict):
            return {k: self.arg(v) for k, v in obj.items()}
        if isinstance(obj, slice):
            return slice(self.arg(obj.start), self.arg(obj.stop), self.arg(obj.step))
        return obj

    def call(self, func: Any, args: tuple, kwargs: dict) -> fx.Node:
        if kwargs.get("inplace") is True:
            kwargs = dict(kwargs, inplace=False)
        if isinstance(func, torch._ops.OpOverload):
            # TorchScript resolves torch.ops.aten.X by its schemas but cannot
            # read an overload attribute (aten.add.Tensor); the exporters
            # resolve the packet to the same overload.
            func = func.overloadpacket
        name = getattr(func, "__name__", "") or ""
        if name.startswith("__") and name.endswith("__") and name != "__get__":
            core = {"and": "and_", "or": "or_", "div": "truediv", "rdiv": "rtruediv",
                    "rand": "rand_", "ror": "ror_"}.get(name[2:-2], name[2:-2])
            reflected = core.startswith("r") and core[1:] in BINARY_OPERATORS
            key = core[1:] if reflected else core
            if key in BINARY_OPERATORS:
                if reflected:
                    args = (args[1], args[0]) + tuple(args[2:])
                return self.graph.call_function(BINARY_OPERATORS[key], args, kwargs)
        getter = _getter_name(func)
        if getter is not None:
            if getter == "T":
                return self.graph.call_function(reverse_dims, args)
            if getter == "mT":
                return self.graph.call_method("transpose", (args[0], -2, -1))
            if getter in ("data",):
                return args[0]
            if getter in ("real",):
                return self.graph.call_function(torch.real, args)
            raise NotImplementedError(
                f"node '{self.node.name}': reading tensor property '{getter}' inside a traced "
                f"node cannot be exported; compute it with a torch function instead.")
        if name == "norm" and (_is_tensor_method(func) or func is torch.norm):
            rewritten = _vector_norm(args, kwargs)
            if rewritten is not None:
                return self.graph.call_function(rewritten[0], rewritten[1], rewritten[2])
        if _is_tensor_method(func):
            if name in _CAST_METHODS and len(args) == 1 and not kwargs:
                return self.graph.call_method("to", (args[0], _CAST_METHODS[name]))
            return self.graph.call_method(name, args, kwargs)
        return self.graph.call_function(func, args, kwargs)

    def build(self, live_ops: list[int], inputs: list, output_vids: list[int]) -> fx.GraphModule:
        used_names: set[str] = set()
        for port in inputs:
            placeholder = self.graph.placeholder(_safe_name(port.name, used_names))
            self.env[port.vid] = placeholder
        # Values defined as constants of the node first: they depend on nothing
        # and a module buffer may become one after ops that read it.
        ordered = sorted(live_ops, key=lambda i: self.node.ops[i][0] is not None)
        for index in ordered:
            func, args, kwargs, out = self.node.ops[index]
            if func is None:
                result = self.arg(args[0])
            else:
                result = self.call(func, self.arg(args), self.arg(kwargs or {}))
            if isinstance(out, int):
                self.env[out] = result
            else:
                for i, vid in enumerate(out):
                    if vid is not None:
                        self.env[vid] = self.graph.call_function(operator.getitem, (result, i))
        results = [self.env[v] for v in output_vids]
        self.graph.output(results[0] if len(results) == 1 else tuple(results))
        self.graph.lint()
        # The class name is fixed: TorchScript names the saved class after it and
        # torch.jit.load accepts ASCII identifiers only, while a node may be named
        # anything the YAML can hold ('ü', 'class', 'node-é').
        return NodeGraphModule(self.root, self.graph, class_name=GRAPH_CLASS_NAME)


GRAPH_CLASS_NAME = "GraphModule"


class NodeGraphModule(fx.GraphModule):
    """fx.GraphModule with a short __init__ of its own.

    torch.jit.script reads, tokenizes and walks the source of the scripted
    module's __init__ on every call (its check for empty-container
    attributes), and fx.GraphModule's runs to a hundred lines: about 40 % of
    scripting a small node.  This one is two lines.  The instance's class is
    still fx's per-instance GraphModuleImpl, defined in torch.fx.graph_module
    and named GRAPH_CLASS_NAME, so TorchScript names and saves it exactly as
    before.
    """

    # fx's own list plus `code` (the generated Python source, a str), whose
    # getter TorchScript would otherwise parse on every script call.
    __jit_unused_properties__ = list(getattr(fx.GraphModule, "__jit_unused_properties__", [])) \
        + ["code"]

    def __init__(self, root: Any, graph: fx.Graph, class_name: str = GRAPH_CLASS_NAME) -> None:
        super().__init__(root, graph, class_name)

# Names the generated forward() already uses: its `self`, the globals of fx's
# generated code (a port called `torch` would shadow the module) and builtins.
_RESERVED = frozenset({"self", "torch", "operator", "builtins", "math", "inf", "nan", "device",
                       "fx_pytree", "pytree"}) | frozenset(dir(builtins))


def _safe_name(name: str, used: set[str]) -> str:
    """An ASCII Python identifier for name (not a keyword), unique within used.

    Placeholder names become argument names of the generated forward() and of
    TorchScript code, which accept neither keywords nor non-ASCII letters.
    """
    text = "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in name) \
        or "x"
    if text[0].isdigit():
        text = "_" + text
    if keyword.iskeyword(text) or keyword.issoftkeyword(text) or text in _RESERVED:
        text += "_"
    candidate, k = text, 1
    while candidate in used:
        candidate, k = f"{text}_{k}", k + 1
    used.add(candidate)
    return candidate


class LazyGraphModule:
    """A finished node's graph, generated on first use (once).

    Building the fx.Graph and generating the GraphModule's Python code is most
    of a node's tracing cost and only compile_graph needs it, so the trace pass
    only records; the graph is built from the pruned op log when asked for.
    """

    # Module attributes TorchScript need not type (typing the fx.Graph costs
    # tens of milliseconds per node and is then ignored anyway).
    _JIT_IGNORED = ["_graph", "_code", "_lineno_map", "_prologue_start", "_tracer_cls",
                    "_tracer_extras", "meta", "shape_env"]

    def __init__(self, node: _core.Node, live_ops: list[int], inputs: list,
                 output_vids: list[int]) -> None:
        self._args = (node, list(live_ops), list(inputs), list(output_vids))
        self._module: fx.GraphModule | None = None

    @property
    def module(self) -> fx.GraphModule:
        if self._module is None:
            node = self._args[0]
            module = _Builder(node).build(*self._args[1:])
            type(module).__jit_ignored_attributes__ = list(self._JIT_IGNORED)
            self._module = module.eval()
            logger.debug("Compiled graph module for %s:\n%s", node.name, module.graph)
        return self._module

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph


def build_graph_module(node: _core.Node, live_ops: list[int], inputs: list,
                       output_vids: list[int]) -> LazyGraphModule:
    """The graph computing the node's outputs from its (unpruned) inputs."""
    return LazyGraphModule(node, live_ops, inputs, output_vids)
