"""``leapp.utils.tensor_description``: tensor semantics, as exported by ``leapp``.

``TensorSemantics``, ``TemporalAxis`` and ``GraphConfigs`` are the objects of
``leapp.semantics``; ``TEMPORAL_AXIS_SENTINEL`` is the marker string written in
``element_names`` where a ``TemporalAxis`` stands.
"""
from __future__ import annotations

from ..semantics import TEMPORAL_AXIS, GraphConfigs, TemporalAxis, TensorSemantics

TEMPORAL_AXIS_SENTINEL: str = TEMPORAL_AXIS

__all__ = ["TensorSemantics", "TemporalAxis", "GraphConfigs", "TEMPORAL_AXIS_SENTINEL"]
