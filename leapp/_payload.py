"""Annotation payloads: the dict / TensorSemantics contract and nested flattening."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from .semantics import TensorSemantics


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
            extra = sem.yaml_fields()
            if extra:
                fields[sem.name] = extra
        return values, fields
    if isinstance(items, (list, tuple)) and any(isinstance(s, TensorSemantics) for s in items):
        raise TypeError(f"All items must be TensorSemantics in the list given to {api}() for "
                        f"node '{node}'; do not mix raw tensors and TensorSemantics.")
    raise _payload_error(api, node, payload)


def flatten(values: dict, fields: dict[str, dict]) -> Iterator[Leaf]:
    """Leaves in dict order; nested dict keys and list indices join with '_'."""
    for key, value in values.items():
        yield from _walk(key, value, fields.get(key), (key,))


def _walk(name: str, value: Any, semantics: dict | None, path: tuple) -> Iterator[Leaf]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(f"{name}_{key}", item, semantics, path + (key,))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(f"{name}_{index}", item, semantics, path + (index,))
    else:
        yield Leaf(name, value, semantics, path)


def rebuild(values: dict, replaced: dict[tuple, Any]) -> Any:
    """values with leaves swapped by path; one entry gives its value, else a tuple."""
    def walk(value: Any, path: tuple) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path + (i,)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(walk(v, path + (i,)) for i, v in enumerate(value))
        return replaced.get(path, value)

    out = [walk(v, (k,)) for k, v in values.items()]
    return out[0] if len(out) == 1 else tuple(out)
