"""@annotate.method while a session runs: one call of a function, traced as one node.

The signature gives the node's inputs (tensor defaults not passed become
constants), the function's return statements its output names; names listed
in environment_constants / register_buffers are resolved in the function's
closure, globals and self on the first trace.  The node itself is driven
through the session's SessionAPI, passed in as ``api``.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable

import numpy as np
import torch

from .. import _core
from ..bundle.log import fatal, logger
from .node_info import info
from .traced import alias


def call_method(api: Any, method: Any, args: tuple, kwargs: dict) -> Any:
    """Run a decorated function as one traced node of api (the session's SessionAPI).

    A call that raises before the node is finished leaves no trace of it: a
    node this call opened is discarded, so the next call builds it afresh.
    """
    fn = method.fn
    options = method.options
    node_name = options.get("node_name") or getattr(fn, "__name__", "method")
    existing = _core.find_node(node_name)
    # defaults may be registered before any input
    node = existing if existing is not None else api.inputs.new_node(node_name)
    try:
        return _trace_call(api, fn, options, node_name, node, args, kwargs)
    except BaseException:
        if existing is None and node.is_tracing and _core.find_node(node_name) is node:
            for tracker in info(node).trackers:
                tracker.restore()
            _core.discard_node(node)
            logger.debug("Node '%s' discarded: its first call raised", node_name)
        raise


def _trace_call(api: Any, fn: Any, options: dict, node_name: str, node: Any, args: tuple,
                kwargs: dict) -> Any:
    """call_method's work: declare the arguments, run fn, publish what it returns.

    The inputs are declared in the order of the call, as upstream does:
    positional arguments first (an excess over the named parameters, the
    *args, as arg_0, arg_1, ...), then the keyword arguments as given.  fn is
    called with the arguments in the shape they came in; tensor defaults not
    passed become constants of the node, passed by keyword (positional-only
    ones by position: every parameter after a skipped one is skipped too).
    """
    target = inspect.unwrap(fn)
    # The signature of fn itself: it follows __wrapped__ (torch.no_grad() and
    # other functools.wraps decorators) and leaves out a bound method's self,
    # also when the method's function is the wrapped one.
    signature = inspect.signature(fn)
    bound = signature.bind(*args, **kwargs)  # the TypeError of a plain call
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    skip_first = bool(params) and params[0].name in ("self", "cls") and bool(bound.args)
    first_pass = bool(node.is_tracing)
    if first_pass and (options.get("environment_constants") or options.get("register_buffers")):
        owner = bound.args[0] if skip_first else _bound_self(fn)
        _closed_over(api, node_name, target, owner, options)
    origin = ("method", getattr(target, "__code__", target))
    call_args: list = []
    for index, value in enumerate(args):
        if index == 0 and skip_first:
            call_args.append(value)
            continue
        name = positional[index].name if index < len(positional) \
            else f"arg_{index - len(positional)}"
        call_args.append(_method_input(api, node_name, name, value, origin))
    call_kwargs = {key: _method_input(api, node_name, key, value, origin)
                   for key, value in kwargs.items()}
    for param in params:
        if param.name in bound.arguments or not isinstance(param.default, torch.Tensor):
            continue
        # An unpassed tensor default is a constant of the node.  A fresh
        # alias per parameter: one default object may serve several
        # parameters, and the caller's default itself is never tagged.
        constant = api.register_buffer(node_name, {param.name: alias(param.default)})
        if param.kind is param.POSITIONAL_ONLY:
            call_args.append(constant)
        else:
            call_kwargs[param.name] = constant
    result = fn(*call_args, **call_kwargs)
    names = return_names(target)
    if result is None:
        fatal(f"Error: annotated method {node_name} returned None, but LEAPP expects a "
              f"return value")
    values = result if isinstance(result, tuple) else (result,)
    if len(names) != len(values):
        if len(names) == 1 and not isinstance(result, tuple):
            pass
        elif all(n.startswith("output") for n in names):
            names = [f"output{i + 1}" for i in range(len(values))]
        else:
            fatal(f"Error: annotated method {node_name} returned {len(values)} values, but "
                  f"LEAPP detected the following return names: {names}")
    api.output_tensors(node_name, dict(zip(names, values)),
                       export_with=options.get("export_with"),
                       backend_params=options.get("backend_params") or {})
    if first_pass and options.get("environment_constants") and not node.is_tracing:
        # Freeze the named constants now: the node's graph (and the copies
        # of the closed-over tensors it holds) is built from today's values.
        _ = info(node).graph_module.module
    return result


def _closed_over(api: Any, node_name: str, target: Callable, owner: Any,
                 options: dict) -> None:
    """First trace: resolve environment_constants and register register_buffers."""
    for name in options.get("environment_constants") or ():
        found, _ = _resolve_name(target, owner, name)
        if found:
            logger.info("Environment constant '%s' of node '%s' is frozen into the node as "
                        "a constant.", name, node_name)
        else:
            logger.warning("environment_constants of node '%s': '%s' does not name an "
                           "object the function can reach (closure, globals, self); "
                           "closed-over values it reads are constants of the node anyway.",
                           node_name, name)
    for name in options.get("register_buffers") or ():
        found, value = _resolve_name(target, owner, name)
        if not found or not isinstance(value, torch.Tensor):
            what = "does not name an object the function can reach" if not found \
                else f"is a {type(value).__name__}, not a tensor"
            fatal(f"register_buffers of node '{node_name}': '{name}' {what}. List the "
                  f"closed-over tensors the function writes in place.", ValueError)
        api.register_buffer(node_name, {name.replace(".", "_"): value})


def _method_input(api: Any, node_name: str, name: str, value: Any, origin: Any) -> Any:
    if _has_tensor(value):
        return api.input_tensors(node_name, {name: value}, _origin=origin)
    return value


def _bound_self(fn: Any) -> Any:
    """The object a bound method (possibly under functools.wraps wrappers) is bound to."""
    seen = 0
    while fn is not None and seen < 100:
        owner = getattr(fn, "__self__", None)
        if owner is not None and not inspect.ismodule(owner):
            return owner
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


def _resolve_name(target: Callable, owner: Any, name: str) -> tuple[bool, Any]:
    """(found, value) of a dotted name seen from target: self/cls, closure, globals."""
    head, *rest = name.split(".")
    if head in ("self", "cls") and owner is not None:
        value = owner
    else:
        try:
            scopes = inspect.getclosurevars(target)
        except TypeError:
            return False, None
        globals_ = getattr(target, "__globals__", {})
        for scope in (scopes.nonlocals, scopes.globals, globals_, scopes.builtins):
            if head in scope:
                value = scope[head]
                break
        else:
            return False, None
    for attr in rest:
        try:
            value = getattr(value, attr)
        except AttributeError:
            return False, None
    return True, value



def _has_tensor(value: Any) -> bool:
    """Whether a tensor lies anywhere in value (dicts, lists, tuples; any depth)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor) or isinstance(item, np.ndarray):
            return True
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return False


_RETURN_NAMES: dict[Any, list[str]] = {}


def return_names(fn: Callable) -> list[str]:
    """Output names from the function's return statements (output{i} otherwise)."""
    code = getattr(fn, "__code__", None)
    if code in _RETURN_NAMES:
        return _RETURN_NAMES[code]
    names = ["output1"]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    if tree is not None and tree.body:
        top = tree.body[0]
        returns = [n for n in ast.walk(top) if isinstance(n, ast.Return) and n.value is not None
                   and _owner(top, n) is top]
        found: list[list[str | None]] = []
        for ret in returns:
            elts = ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]
            found.append([e.id if isinstance(e, ast.Name) else None for e in elts])
        if found:
            width = max(len(f) for f in found)
            merged = []
            for i in range(width):
                options = [f[i] for f in found if i < len(f) and f[i] is not None]
                merged.append(options[0] if options else f"output{i + 1}")
            names = merged
            if len({len(f) for f in found}) > 1:
                logger.warning("Return statements of %s differ in arity; using %s",
                               getattr(fn, "__name__", fn), names)
    if len(set(names)) != len(names):
        names = [f"{n}_{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]
    _RETURN_NAMES[code] = names
    return names


def _owner(top: ast.AST, target: ast.AST) -> ast.AST | None:
    """The innermost function definition containing target."""
    owner = None
    for node in ast.walk(top):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if any(child is target for child in ast.walk(node)):
                owner = node
    return owner
