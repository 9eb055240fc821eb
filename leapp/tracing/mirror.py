"""annotate.mirror_leapp_tags while a session runs: exact match, then provenance copy.

The source and target payloads must match exactly (same structure, same
tensors: shape, dtype, device, values); each traced tensor of the source then
hands its provenance (node, value, port) to the tensor at the same place in
the target.

NumPy arrays take part on either side.  A torch target is tagged in place;
a plain ndarray target cannot carry a tag, so it is answered by a
TracedArray over its memory: the returned payload (the target itself when
it holds no plain array, else the target rebuilt with those arrays
swapped) is the one to pass on.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import _core
from . import numpy_array as _numpy
from ..bundle.log import fatal
from .payload import rebuild_one
from .traced import TracedTensor, plain


def mirror_leapp_tags(source: Any, target: Any) -> Any:
    """Copy provenance from source to target after checking they match exactly."""
    if not _core.is_tracing():
        return target
    try:
        _exact_match(source, target)
    except _Mismatch as exc:
        fatal(f"Error: source and target do not match: {exc}")
    except Exception as exc:  # structure the check could not follow
        fatal(f"unexpected error mirroring LEAPP tags: {exc}", cause=exc)
    views = _mirror(source, target)
    return rebuild_one(target, (), views) if views else target


class _Mismatch(Exception):
    pass


def _exact_match(source: Any, target: Any) -> None:
    """Raise _Mismatch (or ValueError) at the first difference, depth first, in order."""
    stack = [(source, target)]
    while stack:
        source, target = stack.pop()
        if _is_leaf(source) and _is_leaf(target):
            a, b = _as_tensor(source), _as_tensor(target)
            if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device \
                    or not torch.equal(a, b):
                raise _Mismatch(f"{_summary(a)} != {_summary(b)}")
        elif isinstance(source, dict) and isinstance(target, dict):
            if list(source) != list(target):
                raise _Mismatch(f"dict keys {list(source)} != {list(target)}")
            stack.extend((source[key], target[key]) for key in reversed(list(source)))
        elif isinstance(source, (list, tuple)) and isinstance(target, (list, tuple)):
            if len(source) != len(target):
                raise ValueError(f"list lengths {len(source)} != {len(target)}")
            stack.extend(reversed(list(zip(source, target))))
        else:
            raise _Mismatch(f"{type(source).__name__} != {type(target).__name__}")


def _summary(t: torch.Tensor) -> str:
    return f"tensor(shape={list(t.shape)}, dtype={t.dtype}, values={t.flatten()[:6].tolist()})"


def _is_leaf(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _as_tensor(value: Any) -> torch.Tensor:
    """A leaf as a plain tensor for the comparison (an array over its memory)."""
    return plain(_numpy.as_payload_tensor(value))


def _mirror(source: Any, target: Any) -> dict[tuple, Any]:
    """Copy each leaf's provenance from source to target (same structure, any depth).

    Returns {path in target: TracedArray} for the plain ndarrays of target
    that were tagged through a view (empty when none was).
    """
    views: dict[tuple, Any] = {}
    stack: list[tuple[Any, Any, tuple]] = [(source, target, ())]
    while stack:
        source, target, path = stack.pop()
        if _is_leaf(source):
            carrier = _core.carrier_of(_numpy.shadow_of(source))
            if carrier is None:
                continue
            if isinstance(target, np.ndarray):
                shadow = _numpy.as_payload_tensor(target)
                _core.set_carrier(shadow, carrier.node, carrier.vid, carrier.port,
                                  bool(carrier.declared))
                if not isinstance(target, _numpy.TracedArray) or target._shadow is None:
                    views[path] = _numpy.wrap(shadow)
                continue
            if type(target) is not torch.Tensor and type(target) is not TracedTensor:
                raise TypeError(f"mirror_leapp_tags: cannot tag a {type(target).__name__}")
            _core.set_carrier(target, carrier.node, carrier.vid, carrier.port,
                              bool(carrier.declared))
        elif isinstance(source, dict):
            stack.extend((source[key], target[key], path + (key,))
                         for key in reversed(list(source)))
        elif isinstance(source, (list, tuple)):
            stack.extend((s, t, path + (i,))
                         for i, (s, t) in reversed(list(enumerate(zip(source, target)))))
    return views
