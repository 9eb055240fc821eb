"""Tensor semantics: TensorSemantics, the kind enums, TemporalAxis, GraphConfigs.

These behave as upstream leapp 0.7.2's objects do: the kind enums are plain
enums (a member is not equal to its string value), ``TensorSemantics``
normalises ``element_names`` on the object to one list per axis when it is
built or updated, and both dataclasses offer ``to_dict()``.  What the YAML gets
is :func:`yaml_fields`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping

import numpy as np
import torch

from .kinds import TEMPORAL_AXIS, InputKindEnum, OutputKindEnum  # noqa: F401  (public here)
from .log import fatal, logger
from .pipeline import flow

#: The types a TensorSemantics ``ref`` may have (traced subclasses included).
REF_TYPES: tuple[type, ...] = (torch.Tensor, np.ndarray)


@dataclass(frozen=True)
class TemporalAxis:
    """Marks the time axis inside element_names; period_ms (> 0) is the sample period."""

    period_ms: float

    def __post_init__(self) -> None:
        if self.period_ms <= 0:
            fatal(f"TemporalAxis period_ms must be positive, got {self.period_ms!r}", ValueError)


def _reserved() -> None:
    fatal(f"{TEMPORAL_AXIS!r} is reserved for TemporalAxis: pass TemporalAxis(period_ms=...) "
          f"as the axis item instead", ValueError)


def normalize_element_names(names: Any, temporal_known: bool = False) -> tuple[Any, float | None]:
    """element_names as stored on a TensorSemantics, plus the TemporalAxis period if any.

    A string or a flat list of strings names the last axis: it becomes one list
    (``["a", "b"]`` -> ``[["a", "b"]]``).  A list holding per-axis items (a
    list of names, None, or a TemporalAxis, which becomes the reserved marker
    string) keeps one item per axis.  Anything else (a tuple, a dict, a list
    with other items) is kept as given.  temporal_known: the marker string may
    stand as an axis item, since an earlier normalisation put it there.
    """
    if isinstance(names, str):
        if names != TEMPORAL_AXIS:
            return [[names]], None
        if not temporal_known:
            _reserved()
        return [names], None
    if not isinstance(names, list):
        return names, None
    period = None
    axes: list[Any] = []
    per_axis = False
    for item in names:
        if isinstance(item, TemporalAxis):
            if period is not None:
                fatal("element_names can contain at most one TemporalAxis", ValueError)
            period = item.period_ms
            per_axis = True
            axes.append(TEMPORAL_AXIS)
        elif isinstance(item, str):
            if item == TEMPORAL_AXIS:
                if not temporal_known:
                    _reserved()
                per_axis = True
            axes.append(item)
        elif isinstance(item, list):
            if any(isinstance(inner, TemporalAxis) for inner in item):
                fatal("TemporalAxis must be an axis item, not nested in a list", ValueError)
            if any(isinstance(inner, str) and inner == TEMPORAL_AXIS for inner in item):
                fatal(f"{TEMPORAL_AXIS!r} must be a bare axis item, not nested in a list",
                      ValueError)
            per_axis = True
            axes.append(list(item))
        elif item is None:
            per_axis = True
            axes.append(None)
        else:
            logger.warning("element_names has mixed types, expected names or axis descriptors "
                           "(got %s); it is kept as given", type(item).__name__)
            return names, period
    return (axes, period) if per_axis else ([axes], None)


@dataclass
class TensorSemantics:
    """A named tensor with optional semantic metadata for the pipeline YAML.

    name: the port name; ref: the tensor (torch.Tensor or numpy.ndarray);
    kind: an InputKindEnum / OutputKindEnum member or a custom value;
    element_names: a string, a flat list of names, or one item per axis (a
    list of names, None, or one TemporalAxis), stored normalised;
    temporal_period_ms: set from the TemporalAxis; extra: project fields
    flattened into the YAML entry.
    """

    _INTERNAL_FIELDS: ClassVar[frozenset[str]] = frozenset({"ref", "name"})

    name: str | None = None
    ref: Any = None
    kind: InputKindEnum | OutputKindEnum | str | None = None
    element_names: Any = None
    temporal_period_ms: float | None = field(default=None, init=False)
    extra: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        known_period = self.temporal_period_ms
        self.temporal_period_ms = None
        if not isinstance(self.ref, REF_TYPES):
            fatal(f"TensorSemantics 'ref' must be a traceable tensor type accepted types are: "
                  f"{REF_TYPES}got {type(self.ref).__name__} (for TensorSemantics "
                  f"{self.name!r})", TypeError)
        if self.element_names is not None:
            self.element_names, period = normalize_element_names(
                self.element_names, temporal_known=known_period is not None)
            self.temporal_period_ms = period or known_period

    def to_dict(self) -> dict[str, Any]:
        """The semantic fields that are set (kind, element_names, temporal_period_ms),
        in that order, then the entries of extra (which win over a field of the same name)."""
        result: dict[str, Any] = {}
        for f in fields(self):
            if f.name in self._INTERNAL_FIELDS or f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is not None:
                result[f.name] = value
        if self.extra:
            result.update(self.extra)
        return result

    def update(self, values: Mapping[str, Any]) -> None:
        """Set semantic fields from a mapping and normalise again.

        kind, element_names and extra are set as given; any other key
        (name, ref and temporal_period_ms included) goes into extra.
        """
        settable = {f.name for f in fields(self) if f.init} - self._INTERNAL_FIELDS
        for key, value in values.items():
            if key in settable:
                setattr(self, key, value)
            else:
                if self.extra is None:
                    self.extra = {}
                self.extra[key] = value
        self.__post_init__()


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (the YAML form of a tuple given as element_names)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _copied(value: Any) -> Any:
    """value with its lists and dicts copied (the YAML fields never alias the caller's)."""
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


def is_axis_list(value: Any) -> bool:
    """Whether element_names has the normalised shape written in flow style: a list
    whose items are names, None or lists (one per axis)."""
    return isinstance(value, (list, tuple)) and all(
        item is None or isinstance(item, (str, list, tuple)) for item in value)


def yaml_fields(semantics: TensorSemantics) -> dict | None:
    """The semantic fields of semantics' YAML tensor entry, in their order (None: none).

    Enum values are written as their value.  Normalised element_names are flow
    lists (tuples here); element_names given as tuples are written as lists
    would be; other forms are written as given.
    """
    out = semantics.to_dict()
    names = semantics.element_names
    if isinstance(names, tuple) or (isinstance(names, list) and any(
            isinstance(item, tuple) for item in names)):
        plain, period = normalize_element_names(_plain(names),
                                                semantics.temporal_period_ms is not None)
        given, out = out, {}
        for key, value in given.items():
            out[key] = plain if key == "element_names" else value
            if key == "element_names" and period is not None:
                out.setdefault("temporal_period_ms", period)
    for key, value in out.items():
        if hasattr(value, "value"):
            out[key] = value.value
        elif key == "element_names" and is_axis_list(value):
            out[key] = flow(value)
        else:
            out[key] = _copied(value)
    return out or None


@dataclass
class GraphConfigs:
    """Pipeline-level settings written to pipeline.configs (frequency in Hz, > 0)."""

    frequency: float | None = None
    extra: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.frequency is not None and self.frequency <= 0:
            fatal(f"GraphConfigs frequency must be positive when provided, got "
                  f"{self.frequency!r}", ValueError)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, then the entries of extra (which win over a field)."""
        result: dict[str, Any] = {}
        if self.frequency is not None:
            result["frequency"] = self.frequency
        if self.extra:
            result.update(self.extra)
        return result
