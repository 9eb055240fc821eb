"""annotate.mirror_leapp_tags while a session runs: exact match, then provenance copy.

The source and target payloads must match exactly (same structure, same
tensors: shape, dtype, device, values); each traced tensor of the source then
hands its provenance (node, value, port) to the tensor at the same place in
the target.
"""
from __future__ import annotations

from typing import Any

import torch

from . import _core
from ._logging import fatal
from ._traced import TracedTensor, plain


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
    _mirror(source, target)
    return target


class _Mismatch(Exception):
    pass


def _exact_match(source: Any, target: Any) -> None:
    """Raise _Mismatch (or ValueError) at the first difference, depth first, in order."""
    stack = [(source, target)]
    while stack:
        source, target = stack.pop()
        if isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor):
            a, b = plain(source), plain(target)
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


def _mirror(source: Any, target: Any) -> None:
    """Copy each tensor's provenance from source to target (same structure, any depth)."""
    stack = [(source, target)]
    while stack:
        source, target = stack.pop()
        if isinstance(source, torch.Tensor):
            carrier = _core.carrier_of(source)
            if carrier is None:
                continue
            if type(target) is not torch.Tensor and type(target) is not TracedTensor:
                raise TypeError(f"mirror_leapp_tags: cannot tag a {type(target).__name__}")
            _core.set_carrier(target, carrier.node, carrier.vid, carrier.port,
                              bool(carrier.declared))
        elif isinstance(source, dict):
            stack.extend((source[key], target[key]) for key in reversed(list(source)))
        elif isinstance(source, (list, tuple)):
            stack.extend(reversed(list(zip(source, target))))
