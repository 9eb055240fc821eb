"""Calls in one form: positional, keyword and method calls of a torch op reach a
rule identically.

torch's Python bindings are generated from the ATen schemas, so a call's
meaning is fixed by the overload its arguments bind to: `x.var(1, False)` is
`var.dim(self=x, dim=1, unbiased=False)` and `x.where(c, y)` is
`where.self(condition=c, self=x, other=y)`.  `normalize` binds a traced call to
the first overload its arguments fit (by count, name and type) and rewrites it
in the function form of that overload: positional arguments in the schema's
order (`self` where the schema puts it, every positional parameter present,
those not given with the schema's default) and every argument but the input by
name too.  A rule reads `call.arg(i, name)`
with torch's function signature and sees the same thing for every spelling.

Python functions (`torch.nn.functional.*`) are bound to their own signature;
calls of neither kind (`operator.*`, leapp's functional ops) stay as written.
A call of an ATen op that fits none of its overloads gets no rule (NoRule):
the writer never guesses a form it does not know.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.fx as fx

from .emit import Value

_UNBOUND = object()


@functools.lru_cache(maxsize=None)
def _schemas(name: str) -> tuple:
    """The non-out overload schemas of aten::name ([] when there is no such op)."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return ()
    found = []
    try:
        overloads = packet.overloads()
    except Exception:  # noqa: BLE001  not an op packet
        return ()
    for overload in overloads:
        schema = getattr(packet, overload)._schema
        if schema.is_mutable or any(a.kwarg_only and a.name == "out" for a in schema.arguments):
            continue
        found.append(schema)
    return tuple(found)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, Value))


def _fits(value: Any, jit_type: Any) -> bool:
    """Whether a Python value (an example: tensors as tensors) fits a schema type."""
    kind = jit_type.kind()
    if kind == "OptionalType":
        return value is None or _fits(value, jit_type.getElementType())
    if value is None:
        return kind == "NoneType"
    if kind == "TensorType":
        return _is_tensor(value)
    if kind == "ListType":
        element = jit_type.getElementType()
        if isinstance(value, (list, tuple, torch.Size)):
            return all(_fits(v, element) for v in value)
        # int[1] takes a single int (dim=1)
        return element.kind() in ("IntType", "SymIntType") and _fits(value, element)
    if kind in ("IntType", "SymIntType"):
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return not _HAS_REAL_TYPE  # there, ScalarType / Layout / MemoryFormat read int
        return isinstance(value, int) or (isinstance(value, torch.Tensor) and value.dim() == 0
                                          and not value.is_floating_point())
    if kind == "FloatType":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "BoolType":
        return isinstance(value, bool)
    if kind == "NumberType":  # Scalar
        return isinstance(value, (int, float, bool)) or \
            (isinstance(value, torch.Tensor) and value.dim() == 0)
    if kind == "StringType":
        return isinstance(value, str)
    wanted = {"ScalarTypeType": torch.dtype, "LayoutType": torch.layout,
              "MemoryFormatType": torch.memory_format, "DeviceObjType": (torch.device, str, int),
              "GeneratorType": torch.Generator}.get(kind)
    return wanted is not None and isinstance(value, wanted)


def _type(p: Any) -> Any:
    """A schema argument's declared type (ScalarType, not the int it is stored as)."""
    return getattr(p, "real_type", p.type)


# Whether this torch's schema arguments tell ScalarType, Layout and MemoryFormat from int
# (real_type); where they do not, an int argument takes their values.
_HAS_REAL_TYPE = hasattr(torch.ops.aten.to.dtype._schema.arguments[1], "real_type")


def _bind(schema: Any, args: tuple, kwargs: dict, method: bool) -> dict | None:
    """{argument name: value} for a call that fits schema, else None."""
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    bound: dict[str, Any] = {}
    rest = list(args)
    if method:
        if not any(p.name == "self" for p in params) or not rest:
            return None
        bound["self"] = rest.pop(0)
        positional = [p for p in positional if p.name != "self"]
    if len(rest) > len(positional):
        return None
    for p, value in zip(positional, rest):
        bound[p.name] = value
    by_name = {p.name: p for p in params}
    for key, value in kwargs.items():
        name = "self" if key == "input" and "input" not in by_name else key
        if name not in by_name or name in bound:
            return None
        bound[name] = value
    for p in params:
        if p.name not in bound:
            if not p.has_default_value() and _type(p).kind() != "OptionalType":
                return None
            continue
        if not _fits(bound[p.name], _type(p)):
            return None
    return bound


def _canonical(params: list, bound: dict, defaults: dict) -> tuple[list, dict]:
    """(positional names in order, keyword-only names) of the function form: positional
    parameters up to the last one given, keyword-only ones given."""
    positional = [p for p in params if not p[1]]
    last = max((i for i, (name, _) in enumerate(positional) if name in bound), default=-1)
    names = [name for name, _ in positional[:last + 1]]
    keywords = [name for name, kw_only in params if kw_only and name in bound]
    return names, keywords


class Normalized:
    """A call's arguments in function form: the names of its positional arguments in
    order and of its keyword ones, each with where its value comes from."""

    def __init__(self, positional: list[str], keywords: list[str], sources: dict,
                 defaults: dict) -> None:
        self.positional = positional
        self.keywords = keywords
        self.sources = sources  # name -> ("arg", i) / ("kw", key) / ("pack", i, j)
        self.defaults = defaults  # name -> the schema's default

    def apply(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """args / kwargs (the mapped call's, or its examples) in the function form: the
        positional arguments, and every argument but the input by name as well (a rule
        may read either)."""
        def value(name: str) -> Any:
            source = self.sources.get(name)
            if source is None:
                return self.defaults.get(name)
            if source[0] == "pack":
                return tuple(args[source[1]:source[2]])
            kind, key = source
            return args[key] if kind == "arg" else kwargs[key]
        positional = tuple(value(n) for n in self.positional)
        named = {n: v for n, v in zip(self.positional, positional) if n not in ("self", "input")}
        named.update((n, value(n)) for n in self.keywords)
        return positional, named


def _schema_default(p: Any) -> Any:
    return p.default_value if p.has_default_value() else None


def normalize(node: fx.Node, example_args: tuple, example_kwargs: dict
              ) -> Normalized | None | bool:
    """How node's call reads in function form: a Normalized, None for a call that is
    left as written (no schema to bind to), False for an ATen call none of whose
    overloads its arguments fit."""
    target = node.target
    method = node.op == "call_method"
    if method:
        name = str(target)
    elif inspect.isfunction(target):
        return _python_form(target, example_args, example_kwargs)
    elif inspect.isbuiltin(target) and (getattr(target, "__module__", "") or "").startswith(
            "torch"):
        name = target.__name__
    else:
        return None
    schemas = _schemas(name)
    if not schemas:
        return None
    for packed in (False, True):
        for schema in schemas:
            args = _packed(schema, example_args, method) if packed else example_args
            if args is None:
                continue
            bound = _bind(schema, args, example_kwargs, method)
            if bound is None:
                continue
            sources = _sources(schema, args, example_kwargs, method)
            if packed:  # x.view(2, 3): the sizes are one int[] argument
                first = 1 if method else 0
                sources = {k: v for k, v in sources.items() if v != ("arg", first)}
                size_name = _size_param(schema, method).name
                sources[size_name] = ("pack", first, len(example_args))
            positional = [p.name for p in schema.arguments if not p.kwarg_only]
            keywords = [p.name for p in schema.arguments if p.kwarg_only]
            defaults = {p.name: _schema_default(p) for p in schema.arguments}
            return Normalized(positional, keywords, sources, defaults)
    return False


def _size_param(schema: Any, method: bool) -> Any:
    """The first positional parameter after self (an int[] one for varargs sizes)."""
    params = [p for p in schema.arguments if not p.kwarg_only
              and not (method and p.name == "self")]
    return params[0] if params else None


def _packed(schema: Any, args: tuple, method: bool) -> tuple | None:
    """args with the ints after self as one tuple (x.view(2, 3), x.permute(1, 0)) where the
    schema's first parameter after self is an int[]; None when that does not apply."""
    first = 1 if method else 0
    rest = args[first:]
    param = _size_param(schema, method)
    if len(rest) < 2 or param is None or _type(param).kind() != "ListType" or \
            not all(isinstance(a, int) and not isinstance(a, bool) for a in rest):
        return None
    return tuple(args[:first]) + (tuple(rest),)


def _sources(schema: Any, args: tuple, kwargs: dict, method: bool) -> dict:
    params = list(schema.arguments)
    positional = [p.name for p in params if not p.kwarg_only]
    sources: dict[str, tuple] = {}
    start = 0
    if method:
        sources["self"] = ("arg", 0)
        positional = [p for p in positional if p != "self"]
        start = 1
    for i, name in enumerate(positional[:len(args) - start]):
        sources[name] = ("arg", i + start)
    names = {p.name for p in params}
    for key in kwargs:
        sources["self" if key == "input" and "input" not in names else key] = ("kw", key)
    return sources


def _python_form(fn: Any, args: tuple, kwargs: dict) -> Normalized | None:
    """A Python function's call bound to its own signature (None: it does not bind, or
    takes *args: left as written)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    sources: dict[str, tuple] = {}
    for i, p in enumerate(params[:len(args)]):
        sources[p.name] = ("arg", i)
    for key in kwargs:
        sources[key] = ("kw", key)
    flags = [(p.name, p.kind == p.KEYWORD_ONLY) for p in params]
    positional, keywords = _canonical(flags, bound.arguments, {})
    defaults = {p.name: (None if p.default is p.empty else p.default) for p in params}
    return Normalized(positional, keywords, sources, defaults)


def describe_form(args: tuple, kwargs: dict) -> str:
    """'(Tensor, int, dtype=torch.float16)': a call's form, for messages."""
    def one(x: Any) -> str:
        if isinstance(x, (torch.Tensor, Value)):
            return "Tensor"
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(one(v) for v in x) + "]"
        if isinstance(x, (torch.dtype, str, type(None))):
            return repr(x)
        return type(x).__name__
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"
