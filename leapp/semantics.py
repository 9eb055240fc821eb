"""``leapp.semantics``: tensor semantics where users import them from.

TensorSemantics, the kind enums, TemporalAxis and GraphConfigs are the bundle's
vocabulary and live in the bundle stage (``leapp.bundle.semantics``,
``leapp.bundle.kinds``); this public path re-exports them, nothing else.
"""
from __future__ import annotations

from .bundle.semantics import (REF_TYPES, TEMPORAL_AXIS, GraphConfigs, InputKindEnum,  # noqa: F401
                               OutputKindEnum, TemporalAxis, TensorSemantics, is_axis_list,
                               normalize_element_names, yaml_fields)

__all__ = ["GraphConfigs", "InputKindEnum", "OutputKindEnum", "REF_TYPES", "TEMPORAL_AXIS",
           "TemporalAxis", "TensorSemantics", "is_axis_list", "normalize_element_names",
           "yaml_fields"]
