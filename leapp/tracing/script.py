"""TorchScript callables inside a node: traced through, op by op.

A ``torch.jit.script``-ed or ``torch.jit.trace``-d module or function runs in
TorchScript's interpreter, where the tracer cannot see its ops: recorded as
one call it would be a ScriptMethod in the node's graph, which no exporter
takes.  Instead the callable's own TorchScript graph (calls inlined) is run
here node by node on the traced arguments, so each ``aten`` op goes through
the core's handler like any torch op and the exported node computes what the
compiled code computed.  Control flow follows the values: a ``prim::If`` or
``prim::Loop`` whose condition or trip count comes from a traced value reads
that value into Python (``aten::Bool``, ``aten::Int``, ...), which is a guard
exactly as in Python code (leapp.tracing.guards), recorded at the callable's
own source line and the user's call site (:func:`script_site`); module
attributes are read from the scripted module; in-place ``aten`` ops are
recorded functionally.

A ScriptMethod call with a traced argument reaches the core's handler (torch
dispatches ``__torch_function__`` for it), whose op kind ``OP_SCRIPTED``
calls :func:`trace_through`.  A ScriptFunction call does not dispatch, so
while a session runs ``ScriptFunction.__call__`` is patched
(:func:`patches`, installed by ``leapp.tracing.patching``).  A graph instruction
this interpreter does not know is refused at the call, naming the callable,
the user's file and line, and the fix.
"""
from __future__ import annotations

import linecache
import re
from typing import Any, Callable, Iterator

import torch

from . import frames
from .numpy_array import holds_active


SCRIPT_TYPES = (torch._C.ScriptMethod, torch._C.ScriptFunction)


def _as_dtype(value: Any) -> torch.dtype | None:
    """A TorchScript graph's dtype argument (a ScalarType number, e.g. 7) as a torch.dtype;
    torch.tensor takes no number.  The aten op converts it."""
    if value is None or isinstance(value, torch.dtype):
        return value
    return torch.ops.aten.empty.memory_format([0], dtype=value).dtype


class UnsupportedScript(NotImplementedError):
    """A TorchScript instruction the interpreter cannot trace through."""


# The interpreters running now, innermost last (a TorchScript callable called
# on traced values inside another one's trace-through).
_RUNNING: list["_Interpreter"] = []
_SOURCE_AT = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def script_site() -> tuple | None:
    """The guard site of a conversion made by the running interpreter, else None.

    (file, line, where): the TorchScript source line of the graph instruction
    that reads a traced value into Python (the ``bool(...)`` of an ``if``, the
    ``int(...)`` of a ``range``), and a note naming the callable, that line's
    text and the user's call of it.  One site per instruction and call site, so
    a later pass compares occurrence by occurrence, as for Python code.
    """
    if not _RUNNING:
        return None
    interpreter = _RUNNING[-1]
    node = interpreter.node
    file, line, text = "<TorchScript>", 0, ""
    if node is not None:
        found = _SOURCE_AT.search(str(node.sourceRange() or ""))
        if found is not None:
            file, line = found.group("file"), int(found.group("line"))
            text = linecache.getline(file, line).split(" #")[0].strip()
    call_file, call_line = interpreter.call_site
    quoted = f"`{text}` " if text else ""
    return (file, line, f"{quoted}in {describe(interpreter.func)}, called at "
                        f"{call_file}:{call_line}")


def user_site() -> tuple[str, int]:
    """(file, line) of the nearest frame outside leapp and torch."""
    return frames.user_site(1)


def describe(func: Any) -> str:
    """'torch.jit.script-ed function foo' and the like, for messages."""
    if isinstance(func, torch._C.ScriptMethod):
        owner = func.owner
        qual = owner._type().qualified_name() if hasattr(owner, "_type") else "module"
        return f"TorchScript method {qual.replace('__torch__.', '')}.{func.name}"
    return f"TorchScript function {getattr(func, 'name', func)}"


def _owner_attr(obj: Any, name: str) -> Any:
    getter = getattr(obj, "getattr", None)
    if getter is not None and callable(getter) and not isinstance(obj, torch.nn.Module):
        return getter(name)
    return getattr(obj, name)


def _operator(node: torch._C.Node) -> Callable:
    """The torch.ops overload a graph node calls (its packet when unresolvable)."""
    kind = node.kind()
    namespace, name = kind.split("::", 1)
    packet = getattr(getattr(torch.ops, namespace), name)
    schema = node.schema()
    if schema and schema != "(no schema)":
        head = schema.split("(", 1)[0]
        overload = head.split(".", 1)[1] if "." in head.split("::", 1)[1] else "default"
        found = getattr(packet, overload, None)
        if found is not None:
            return found
    return packet


_SCALAR_CASTS = {"aten::Int": int, "aten::Float": float, "aten::Bool": bool,
                 "aten::ScalarImplicit": lambda t: t.item(), "aten::item": lambda t: t.item()}


class _Interpreter:
    def __init__(self, func: Any, call_site: tuple[str, int]) -> None:
        self.func = func
        self.call_site = call_site
        self.node: torch._C.Node | None = None  # the instruction running (script_site)
        self.env: dict[torch._C.Value, Any] = {}

    def value(self, v: torch._C.Value) -> Any:
        return self.env[v]

    def run_block(self, block: Any, inputs: list) -> list:
        for v, x in zip(block.inputs(), inputs):
            self.env[v] = x
        for node in block.nodes():
            self.run_node(node)
        return [self.env[v] for v in block.outputs()]

    def _set(self, node: torch._C.Node, results: Any) -> None:
        outs = list(node.outputs())
        if len(outs) == 1:
            self.env[outs[0]] = results
        else:
            for v, r in zip(outs, results):
                self.env[v] = r

    def run_node(self, node: torch._C.Node) -> None:  # noqa: C901 (one case per instruction)
        kind = node.kind()
        ins = [self.env[v] for v in node.inputs()]
        self.node = node
        if kind == "prim::Constant":
            out = node.output()
            value = out.toIValue()
            if isinstance(value, torch.Tensor):
                value = value.clone()
            self.env[out] = value
        elif kind == "prim::GetAttr":
            self.env[node.output()] = _owner_attr(ins[0], node.s("name"))
        elif kind == "prim::ListConstruct":
            self.env[node.output()] = list(ins)
        elif kind == "prim::TupleConstruct":
            self.env[node.output()] = tuple(ins)
        elif kind == "prim::DictConstruct":
            self.env[node.output()] = dict(zip(ins[0::2], ins[1::2]))
        elif kind in ("prim::ListUnpack", "prim::TupleUnpack"):
            self._set(node, tuple(ins[0]) if len(list(node.outputs())) > 1 else ins[0][0])
        elif kind == "prim::TupleIndex":
            self.env[node.output()] = ins[0][ins[1]]
        elif kind == "prim::unchecked_cast":
            self.env[node.output()] = ins[0]
        elif kind == "prim::RaiseException":
            raise RuntimeError(f"{describe(self.func)} raised: {ins[0]}")
        elif kind == "prim::Uninitialized":
            self.env[node.output()] = None
        elif kind in ("aten::__is__", "aten::__isnot__"):
            same = ins[0] is ins[1] or (ins[0] is None and ins[1] is None)
            self.env[node.output()] = same if kind == "aten::__is__" else not same
        elif kind == "prim::NumToTensor":
            self.env[node.output()] = torch.scalar_tensor(ins[0]) if not isinstance(
                ins[0], torch.Tensor) else ins[0]
        elif kind in _SCALAR_CASTS:
            arg = ins[0]
            self.env[node.output()] = _SCALAR_CASTS[kind](arg) if isinstance(
                arg, torch.Tensor) else type(arg)(arg) if kind != "aten::ScalarImplicit" else arg
        elif kind == "prim::dtype":
            self.env[node.output()] = ins[0].dtype
        elif kind == "prim::device":
            self.env[node.output()] = ins[0].device
        elif kind == "aten::__getitem__" and isinstance(ins[0], (list, tuple, dict)):
            self.env[node.output()] = ins[0][ins[1]]
        elif kind == "aten::len" and isinstance(ins[0], (list, tuple, dict, str)):
            self.env[node.output()] = len(ins[0])
        elif kind == "aten::append" and isinstance(ins[0], list):
            ins[0].append(ins[1])
            self.env[node.output()] = ins[0]
        elif kind == "aten::tensor":  # from Python values: the op takes no Python list
            self.env[node.output()] = torch.tensor(ins[0], dtype=_as_dtype(ins[1]),
                                                   device=ins[2], requires_grad=bool(ins[3]))
        elif kind == "prim::If":
            blocks = list(node.blocks())
            chosen = blocks[0] if bool(ins[0]) else blocks[1]
            self._set(node, self.run_block(chosen, []) if len(list(node.outputs())) != 1
                      else self.run_block(chosen, [])[0])
        elif kind == "prim::Loop":
            self._loop(node, ins)
        elif kind.startswith("aten::") or kind in ("prim::min", "prim::max", "prim::abs"):
            self._call(node, ins)
        else:
            raise UnsupportedScript(kind)

    def _loop(self, node: torch._C.Node, ins: list) -> None:
        trips, cond, carried = ins[0], ins[1], list(ins[2:])
        body = list(node.blocks())[0]
        i = 0
        while bool(cond) and i < trips:
            results = self.run_block(body, [i] + carried)
            cond, carried = results[0], results[1:]
            i += 1
        outs = list(node.outputs())
        for v, r in zip(outs, carried):
            self.env[v] = r

    def _call(self, node: torch._C.Node, ins: list) -> None:
        op = _operator(node)
        schema = getattr(op, "_schema", None)
        if schema is not None and len(schema.arguments) == len(ins):
            args = [x for a, x in zip(schema.arguments, ins) if not a.kwarg_only]
            kwargs = {a.name: x for a, x in zip(schema.arguments, ins) if a.kwarg_only}
            results = op(*args, **kwargs)
        else:
            results = op(*ins)
        self._set(node, results)


def _bind_inputs(func: Any, graph: torch._C.Graph, args: tuple, kwargs: dict) -> list:
    """The graph's input values for a call (self first for a method)."""
    schema = func.schema
    params = list(schema.arguments)
    given: list = []
    if isinstance(func, torch._C.ScriptMethod):
        given.append(func.owner)
        params = params[1:]
    if len(args) > len(params):
        raise TypeError(f"{describe(func)} takes {len(params)} arguments, {len(args)} given")
    kwargs = dict(kwargs or {})
    for i, param in enumerate(params):
        if i < len(args):
            given.append(args[i])
        elif param.name in kwargs:
            given.append(kwargs.pop(param.name))
        elif param.default_value is not None or param.has_default_value():
            given.append(param.default_value)
        else:
            raise TypeError(f"{describe(func)}: missing argument '{param.name}'")
    if kwargs:
        raise TypeError(f"{describe(func)}: unexpected arguments {sorted(kwargs)}")
    return given


def trace_through(func: Any, args: tuple, kwargs: dict | None) -> Any:
    """Run the TorchScript callable func on traced arguments, op by op (OP_SCRIPTED)."""
    graph = func.inlined_graph
    interpreter = _Interpreter(func, user_site())
    _RUNNING.append(interpreter)
    try:
        inputs = _bind_inputs(func, graph, tuple(args), kwargs or {})
        outputs = interpreter.run_block(graph, inputs)
    except UnsupportedScript as exc:
        file, line = interpreter.call_site
        raise NotImplementedError(
            f"{describe(func)} called at {file}:{line} runs the TorchScript instruction "
            f"'{exc}', which leapp cannot trace through. Call the module or function's "
            f"Python code inside the node instead of its torch.jit.script / torch.jit.trace "
            f"version (e.g. keep the nn.Module you scripted), or replace it with an "
            f"annotate FunctionPatch.") from None
    finally:
        _RUNNING.pop()
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _function_call(original: Callable) -> Callable:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if holds_active(args) or holds_active(kwargs):
            return trace_through(self, args, kwargs)
        return original(self, *args, **kwargs)
    return __call__


def patches() -> Iterator[tuple[Any, str, Any]]:
    """(owner, name, replacement) of the session patch for ScriptFunction calls."""
    owner = torch._C.ScriptFunction
    yield owner, "__call__", _function_call(owner.__call__)
