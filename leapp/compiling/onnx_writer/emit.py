"""The writer's building blocks: the emitter that collects ONNX nodes and
initialisers, the values rules work on (an ONNX name with eager's example), the
call a rule receives, and the rule registry (rule_key -> rule)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx

from ...bundle.dtypes import onnx_type
from ...tracing import ops as _tracing_ops


class NoRule(Exception):
    """A call the writer has no rule for (or a form of it a rule refuses)."""

    def __init__(self, op: str, detail: str = "") -> None:
        self.op = op
        self.detail = detail
        super().__init__(f"no ONNX rule for {op}" + (f" ({detail})" if detail else ""))


class WriterError(Exception):
    """The writer produced a model that disagrees with eager (a rule's bug)."""


def may_draw_random(func: Any) -> bool:
    """Whether func is one of torch's random functions (dropout included, whatever its
    training flag): a call of one is never folded into a constant, and a node holding
    one is not checked on fresh inputs."""
    return _tracing_ops.random_name(func) is not None


def op_label(node: fx.Node) -> str:
    """How messages name an fx call: torch.add, Tensor.view, operator.getitem, ..."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or str(target)
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module.startswith("torch._C._nn") or module == "torch.nn.functional":
        return f"torch.nn.functional.{name}"
    if module.startswith("torch._C._linalg"):
        return f"torch.linalg.{name.replace('linalg_', '')}"
    if module.startswith("torch"):
        return f"torch.{name}"
    if module.startswith("leapp"):
        return f"leapp.{name}"
    return f"{module}.{name}" if module else name


def rule_key(node: fx.Node) -> str:
    """The registry key of a call: methods by name, functions by their __name__."""
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or str(target)
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if name.startswith("linalg_"):
        name = name[len("linalg_"):]
    return name


class Emitter:
    """Collects ONNX nodes and initialisers with unique value names."""

    def __init__(self, opset: int, reserved: set[str]) -> None:
        import onnx.helper as helper
        self.helper = helper
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.used: set[str] = set(reserved)
        self.counter = 0
        self._consts: dict[tuple, str] = {}

    def fresh(self, hint: str = "v") -> str:
        hint = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        while True:
            self.counter += 1
            name = f"{hint}_{self.counter}"
            if name not in self.used:
                self.used.add(name)
                return name

    def op(self, op_type: str, inputs: list, outputs: int = 1, **attrs: Any) -> Any:
        """Append one node; its output name (a list when outputs > 1)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(self.helper.make_node(op_type, [i or "" for i in inputs], names,
                                                **attrs))
        return names[0] if outputs == 1 else names

    def tensor_const(self, tensor: torch.Tensor, hint: str = "c") -> str:
        """An initialiser holding tensor (bytes copied; dtype kept)."""
        t = tensor.detach().contiguous().cpu()
        small = t.numel() <= 16
        key = None
        if small:
            key = (t.dtype, tuple(t.shape), tensor_proto(t, "").raw_data)
            found = self._consts.get(key)
            if found is not None:
                return found
        name = self.fresh(hint)
        self.initializers.append(tensor_proto(t, name))
        if key is not None:
            self._consts[key] = name
        return name

    def const(self, value: Any, dtype: torch.dtype, shape: tuple | None = None) -> str:
        """A constant of dtype from a Python number or sequence (shape: reshaped to it)."""
        t = torch.tensor(value, dtype=torch.float64 if dtype.is_floating_point else None)
        t = t.to(dtype)
        if shape is not None:
            t = t.reshape(shape)
        return self.tensor_const(t)

    def ints(self, values: Any) -> str:
        """A 1-D int64 constant (axes, shapes, starts, ...)."""
        return self.tensor_const(torch.tensor([int(v) for v in values], dtype=torch.int64))

    def scalar_int(self, value: int) -> str:
        return self.tensor_const(torch.tensor(int(value), dtype=torch.int64))

    # shared compositions -------------------------------------------------------------

    def cast(self, name: str, src: torch.dtype, dst: torch.dtype) -> str:
        if src == dst:
            return name
        return self.op("Cast", [name], to=onnx_type(dst))

    def reshape(self, name: str, shape: tuple, source: tuple | None = None) -> str:
        """Reshape name (of shape source, when known) to shape.  The dimensions source
        leads with and shape keeps are written as 0 (copied at run time): the same
        model for the traced shapes, and one that steps a batch stacked on any of
        those axes (a batched fused model's robots, first, or second as a
        sequence-first GRU's batch)."""
        shape = tuple(shape)
        if source is not None:
            kept = 0
            while kept < min(len(shape), len(source)) and shape[kept] == source[kept]:
                kept += 1
            shape = (0,) * kept + shape[kept:]
        return self.op("Reshape", [name, self.ints(shape)])

    def shape_of(self, name: str) -> str:
        """name's shape at run time (an Expand to it follows a stacked batch)."""
        return self.op("Shape", [name])

    def reduce(self, op_type: str, name: str, axes: list[int] | None, keepdims: bool) -> str:
        """Reduce* over axes (None: all), axes as an input or attribute per opset."""
        as_input = self.opset >= 18 or (op_type == "ReduceSum" and self.opset >= 13)
        if axes is None:
            return self.op(op_type, [name], keepdims=int(keepdims))
        if as_input:
            return self.op(op_type, [name, self.ints(axes)], keepdims=int(keepdims))
        return self.op(op_type, [name], axes=list(axes), keepdims=int(keepdims))

    def squeeze(self, name: str, axes: list[int]) -> str:
        return self.op("Squeeze", [name, self.ints(axes)])

    def unsqueeze(self, name: str, axes: list[int]) -> str:
        return self.op("Unsqueeze", [name, self.ints(axes)])

    def slice(self, name: str, starts: list[int], ends: list[int], axes: list[int],
              steps: list[int] | None = None) -> str:
        inputs = [name, self.ints(starts), self.ints(ends), self.ints(axes)]
        if steps is not None:
            inputs.append(self.ints(steps))
        return self.op("Slice", inputs)


def tensor_proto(t: torch.Tensor, name: str) -> Any:
    """onnx.TensorProto of a CPU tensor (raw little-endian bytes, any dtype in the table)."""
    from onnx import helper
    t = t.detach().contiguous().cpu()
    dims = list(t.shape)
    if t.dtype == torch.bool:
        raw = t.numpy().astype(np.bool_).tobytes()
    elif t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    return helper.make_tensor(name, onnx_type(t.dtype), dims, raw, raw=True)


class Value:
    """An ONNX value of the graph with its eager example (dtype and shape)."""

    __slots__ = ("name", "example", "const")

    def __init__(self, name: str, example: torch.Tensor, const: bool = False) -> None:
        self.name = name
        self.example = example
        self.const = const  # an initialiser: no part of it comes from the node's inputs

    @property
    def dtype(self) -> torch.dtype:
        return self.example.dtype

    @property
    def shape(self) -> tuple:
        return tuple(self.example.shape)

    @property
    def rank(self) -> int:
        return self.example.dim()

    def __repr__(self) -> str:
        return f"Value({self.name}, {self.dtype}, {self.shape})"


class Call:
    """What a rule receives: the emitter, the call's arguments (fx values as Value,
    lists and tuples of them, Python objects as they are) and eager's result."""

    def __init__(self, emitter: Emitter, node: fx.Node, args: tuple, kwargs: dict,
                 example_args: tuple, example_kwargs: dict, out: Any) -> None:
        self.e = emitter
        self.node = node
        self.args = args
        self.kwargs = kwargs
        self.example_args = example_args
        self.example_kwargs = example_kwargs
        self.out = out
        self.label = op_label(node)

    @property
    def opset(self) -> int:
        return self.e.opset

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """Argument by position or keyword (the rule's view of torch's signature)."""
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)

    def refuse(self, detail: str) -> NoRule:
        return NoRule(self.label, detail)


Rule = Callable[[Call], Any]
RULES: dict[str, Rule] = {}


def rule(*keys: str) -> Callable[[Rule], Rule]:
    """Register fn for the calls named keys (rule_key's spelling)."""
    def register(fn: Rule) -> Rule:
        for key in keys:
            RULES[key] = fn
        return fn
    return register
