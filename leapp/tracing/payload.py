"""Annotation payloads: the dict / TensorSemantics contract and nested flattening."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from ..bundle.semantics import TensorSemantics, yaml_fields


class Leaf:
    """One tensor of a payload: flattened name, value, semantic YAML fields."""

    __slots__ = ("name", "value", "semantics", "path")

    def __init__(self, name: str, value: Any, semantics: dict | None, path: tuple) -> None:
        self.name, self.value, self.semantics, self.path = name, value, semantics, path


def _payload_error(api: str, node: str, payload: Any) -> TypeError:
    if isinstance(payload, torch.Tensor):
        return TypeError(
            f"{api}() for node '{node}' does not accept a bare tensor. Pass a dict of named "
            f"tensors such as {{'obs': tensor}}, or TensorSemantics(name=..., ref=tensor).")
    return TypeError(
        f"{api}() for node '{node}' expects either a dict of named tensors or a "
        f"TensorSemantics/list of TensorSemantics. Received {type(payload).__name__}.")


def normalize(api: str, node: str, payload: Any) -> tuple[dict, dict[str, dict]]:
    """The payload as {name: value} plus {name: semantic fields}."""
    if isinstance(payload, dict):
        for key in payload:
            if not isinstance(key, str):
                raise TypeError(f"{api}() for node '{node}': tensor names must be str, "
                                f"got {key!r}")
        return payload, {}
    items = [payload] if isinstance(payload, TensorSemantics) else payload
    if isinstance(items, (list, tuple)) and items and all(
            isinstance(s, TensorSemantics) for s in items):
        values: dict = {}
        fields: dict[str, dict] = {}
        names = [s.name for s in items]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Duplicate TensorSemantics names: {duplicates} in {api}() for "
                             f"node '{node}'")
        for sem in items:
            if not isinstance(sem.name, str) or not sem.name:
                raise TypeError(f"{api}() for node '{node}': TensorSemantics needs a name")
            if not isinstance(sem.ref, (torch.Tensor, np.ndarray)):
                raise TypeError(
                    f"TensorSemantics '{sem.name}': 'ref' must be a traceable tensor type, got "
                    f"{type(sem.ref).__name__}")
            values[sem.name] = sem.ref
            extra = yaml_fields(sem)
            if extra:
                fields[sem.name] = extra
        return values, fields
    if isinstance(items, (list, tuple)) and any(isinstance(s, TensorSemantics) for s in items):
        raise TypeError(f"All items must be TensorSemantics in the list given to {api}() for "
                        f"node '{node}'; do not mix raw tensors and TensorSemantics.")
    raise _payload_error(api, node, payload)


_DONE = object()
_NESTED = (dict, list, tuple)


def _children(value: Any) -> Iterator[tuple[Any, Any]]:
    """(key, item) pairs of a dict, (index, item) pairs of a list or tuple."""
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def _cycle_error(path: list) -> ValueError:
    return ValueError(f"The payload contains a reference cycle: the container at "
                      f"{'/'.join(str(k) for k in path)} contains itself. Payloads are trees "
                      f"of dicts, lists and tuples of tensors.")


def flatten(values: dict, fields: dict[str, dict]) -> Iterator[Leaf]:
    """Leaves in dict order; nested dict keys and list indices join with '_'.

    The walk keeps its own stack, so any nesting depth a payload can have is
    accepted (no RecursionError); a container that contains itself is refused.
    """
    for key, value in values.items():
        yield from _walk(key, value, fields.get(key), (key,))


def _walk(name: str, value: Any, semantics: dict | None, path: tuple) -> Iterator[Leaf]:
    """Depth-first, in order: the leaves under value (value itself if not a container)."""
    if not isinstance(value, _NESTED):
        yield Leaf(name, value, semantics, path)
        return
    parts, keys = [name], list(path)         # one entry per open container
    stack, chain, open_ids = [_children(value)], [id(value)], {id(value)}
    while stack:
        child = next(stack[-1], _DONE)
        if child is _DONE:
            stack.pop()
            open_ids.discard(chain.pop())
            parts.pop()
            keys.pop()
            continue
        key, item = child
        if isinstance(item, _NESTED):
            if id(item) in open_ids:
                raise _cycle_error(keys + [key])
            stack.append(_children(item))
            chain.append(id(item))
            open_ids.add(id(item))
            parts.append(format(key, ""))
            keys.append(key)
        else:
            yield Leaf("_".join(parts + [format(key, "")]), item, semantics, tuple(keys) + (key,))


def _assemble(container: Any, pairs: list) -> Any:
    if isinstance(container, dict):
        return dict(pairs)
    if isinstance(container, list):
        return [v for _, v in pairs]
    return tuple(v for _, v in pairs)


def rebuild_one(value: Any, path: tuple, replaced: dict[tuple, Any]) -> Any:
    """value with the leaves in replaced swapped; containers rebuilt (dict, list, tuple)."""
    if not isinstance(value, _NESTED):
        return replaced.get(path, value)
    keys = list(path)
    # Frames: (container, its children, its rebuilt (key, value) pairs, its key).
    stack = [(value, _children(value), [], None)]
    open_ids = {id(value)}
    while True:
        container, items, pairs, own_key = stack[-1]
        child = next(items, _DONE)
        if child is _DONE:
            stack.pop()
            open_ids.discard(id(container))
            result = _assemble(container, pairs)
            if not stack:
                return result
            keys.pop()
            stack[-1][2].append((own_key, result))
            continue
        key, item = child
        if isinstance(item, _NESTED):
            if id(item) in open_ids:
                raise _cycle_error(keys + [key])
            stack.append((item, _children(item), [], key))
            open_ids.add(id(item))
            keys.append(key)
        else:
            pairs.append((key, replaced.get(tuple(keys) + (key,), item) if replaced else item))


def rebuild(values: dict, replaced: dict[tuple, Any]) -> Any:
    """values with leaves swapped by path; one entry gives its value, else a tuple.

    With nothing swapped the caller's own objects come back (its containers
    too, as upstream returns them); otherwise each value holding a swapped
    leaf is rebuilt (dict, list, tuple).
    """
    if not replaced:
        out = list(values.values())
        return out[0] if len(out) == 1 else tuple(out)
    out = [rebuild_one(v, (k,), replaced) if any(p[0] == k for p in replaced) else v
           for k, v in values.items()]
    return out[0] if len(out) == 1 else tuple(out)
