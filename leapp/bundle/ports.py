"""The port catalogue: what a program that drives a robot needs to know of each port.

A robot program asks a bundle for its ports by kind ("the joint positions
in, the joint targets out") instead of walking the YAML.  This module turns
one port's YAML entry into an :class:`InferencePort`, an immutable record:
its key, node and name, its ``kind`` (the ``InputKindEnum`` /
``OutputKindEnum`` member where the string is one, the string otherwise), its
element names flattened into one tuple (the ``__temporal_axis__`` marker
removed, the period given apart), its shape, ``torch.dtype``, device, the
fields no attribute holds (``extra``), whether it is a static output and, for
a feedback target, the output that feeds it.

Both YAML dialects are read:

* config 1.3 (what leapp and upstream 0.7.2 write): ``kind``,
  ``element_names`` (one list per axis, right-aligned to the shape, a flat
  list or one string naming the last axis, ``__temporal_axis__`` for the
  time axis) and ``temporal_period_ms``;
* config 1.4 (upstream's development line): ``kind`` strings such as
  ``joint/position``, ``axes`` (one entry per dimension: null or a mapping
  with ``kind``, ``names`` and, for a ``time`` axis, ``period_ms``),
  ``is_setpoint``, ``reference`` and ``expressed_in``.

A field neither dialect defines, and a known one in a form the record cannot
hold, stays in ``extra`` under its own name: nothing the YAML says is dropped.

:class:`PortCatalog` is the lookup by kind that ``Pipeline`` (``leapp.bundle.pipeline``)
and ``InferenceManager`` share; :func:`describe` is the one line the command
line and the view print for a port.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import torch

from .dtypes import SPELLINGS
from .kinds import TEMPORAL_AXIS, InputKindEnum, OutputKindEnum

__all__ = ["Axis", "InferencePort", "PortCatalog", "PortLookupError", "describe",
           "kind_value", "port_record", "PORT_FIELDS", "SEMANTIC_FIELDS"]

#: The fields every port entry has (name, dtype, shape; ``type`` is always ``tensor``).
PORT_FIELDS = ("name", "dtype", "shape", "type")
#: The semantic fields a record gives attributes of their own (config 1.3, then 1.4).
SEMANTIC_FIELDS = ("kind", "element_names", "temporal_period_ms", "axes", "is_setpoint",
                   "reference", "expressed_in")
#: The axis kind of a config-1.4 time axis.
TIME_AXIS = "time"

INPUT, OUTPUT = "input", "output"

_KINDS: dict[str, InputKindEnum | OutputKindEnum] = {
    member.value: member for enum in (InputKindEnum, OutputKindEnum) for member in enum}


class PortLookupError(KeyError):
    """No port, or more than one, answers a lookup; the message names the candidates."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def kind_value(kind: Any) -> Any:
    """The YAML string of a kind: an enum member's value, anything else as is."""
    return kind.value if isinstance(kind, (InputKindEnum, OutputKindEnum)) else kind


def _frozen(value: Any) -> Any:
    """A read-only copy of YAML data: mappings as mappingproxies, lists as tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _number(value: Any) -> float | int | None:
    """A finite real number (not a bool), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


@dataclass(frozen=True, slots=True)
class Axis:
    """One dimension of a config-1.4 port: its ``kind`` (``robot``, ``element``,
    ``component``, ``time`` or a custom string), the ``names`` of its elements, the
    ``period_ms`` of a time axis and the axis fields no attribute holds (``extra``)."""

    kind: str | None = None
    names: tuple[str, ...] | None = None
    period_ms: float | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class InferencePort:
    """One port of a bundle, as a robot program reads it.

    Attributes:
        key: ``"node/name"``, the key ``run_policy`` takes and returns.
        node, name: the two halves of ``key``.
        side: ``"input"`` or ``"output"`` (a feedback port is its target, an input).
        kind: the ``InputKindEnum`` / ``OutputKindEnum`` member the YAML's ``kind``
            string is the value of; the YAML's value itself otherwise (a custom
            string, a config-1.4 kind such as ``"joint/position"``), None without one.
        element_names: the names of the port's elements, flattened over its axes in
            axis order (``[[hip, knee]]`` gives ``("hip", "knee")``); the temporal axis
            marker is not among them; ``()`` when the port names none.
        axis_names: per dimension of ``shape``, the names of that axis' elements or None.
        temporal_axis: the dimension that is time (``__temporal_axis__``, or a 1.4
            ``time`` axis), or None.
        temporal_period_ms: the time between two samples of that axis, or None.
        shape: the declared shape.
        dtype: the ``torch.dtype`` (None only for a dtype name torch lacks, which
            ``InferenceManager`` refuses to load).
        dtype_name: the YAML's canonical dtype name (``"float32"``).
        device: where ``InferenceManager`` keeps the port's tensors (the node's
            device); None in a catalogue read from the YAML alone.
        extra: the entry's fields no attribute holds (project fields such as
            ``source: state:robot:joint_pos``, and unknown ones), read-only.
        static: for an output, whether its value depends on no input of its node (a
            ``static_outputs`` tensor such as gains); False for inputs; None where
            the model was not read (a catalogue read from the YAML alone).
        source: for a feedback port, the ``"node/output"`` that feeds it.
        axes: config 1.4's ``axes`` (an :class:`Axis` or None per dimension), or None.
        is_setpoint: config 1.4's ``is_setpoint`` (False when absent).
        reference: config 1.4's ``reference`` frame, or None.
        expressed_in: config 1.4's ``expressed_in`` mapping, or None.
        entry: the whole YAML entry, read-only.
    """

    key: str
    node: str
    name: str
    side: str
    kind: Any
    element_names: tuple[str, ...]
    axis_names: tuple[tuple[str, ...] | None, ...]
    temporal_axis: int | None
    temporal_period_ms: float | None
    shape: tuple[int, ...]
    dtype: torch.dtype | None
    dtype_name: str
    device: torch.device | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    static: bool | None = None
    source: str | None = None
    axes: tuple[Axis | None, ...] | None = None
    is_setpoint: bool = False
    reference: str | None = None
    expressed_in: Mapping[str, Any] | None = None
    entry: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}),
                                     repr=False, compare=False)

    @property
    def kind_name(self) -> Any:
        """The YAML's ``kind`` (the string an enum member stands for), or None."""
        return kind_value(self.kind)

    @property
    def numel(self) -> int:
        """The number of elements of a tensor of this port."""
        return math.prod(self.shape)

    def has_kind(self, kind: Any) -> bool:
        """Whether the port's kind is ``kind`` (an enum member or its string)."""
        return self.kind_name is not None and self.kind_name == kind_value(kind)

    def index_of(self, names: str | Iterable[str], axis: int | None = None) -> list[int]:
        """The positions of the named elements along one axis of the port.

        ``axis``: the dimension whose names to search (negative counts from the
        end); by default the last one that has names.  ``port.index_of(["hip",
        "knee"])`` gives ``[i_hip, i_knee]``, in the order asked, so that
        ``tensor[..., port.index_of(order)]`` puts the port's values in ``order``.

        Raises:
            PortLookupError: a name the axis does not have (the known ones are
                listed), or a port (axis) that names no elements.
        """
        wanted = [names] if isinstance(names, str) else list(names)
        named = [i for i, axis_names in enumerate(self.axis_names) if axis_names]
        if axis is None:
            if not named:
                raise PortLookupError(f"Port '{self.key}' names no elements: its YAML entry "
                                      "has no element_names (or axes with names)")
            axis = named[-1]
        elif -len(self.shape) <= axis < 0:
            axis += len(self.shape)
        known = self.axis_names[axis] if 0 <= axis < len(self.axis_names) else None
        if not known:
            raise PortLookupError(f"Port '{self.key}' names no elements on axis {axis}; "
                                  f"named axes: {named or 'none'}")
        positions = {name: i for i, name in reversed(list(enumerate(known)))}
        missing = [name for name in wanted if name not in positions]
        if missing:
            raise PortLookupError(
                f"Port '{self.key}' has no element{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in missing)} on axis {axis}; its elements: "
                f"{', '.join(known)}")
        return [positions[name] for name in wanted]


# ---- reading one entry ---------------------------------------------------------------------

def _aligned(per_axis: list[Any], rank: int) -> tuple[list[Any], int]:
    """Per-axis items and the dimension of the first one: right-aligned to the shape
    (``[[hip, knee]]`` on shape ``(1, 2)`` names axis 1), or from 0 when there are more
    items than dimensions."""
    offset = rank - len(per_axis) if len(per_axis) <= rank else 0
    return per_axis, offset


def _names(value: Any) -> tuple[str, ...] | None:
    """A list of element names (non-empty strings), or None."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _from_element_names(value: Any, rank: int) -> tuple[list[Any], int | None] | None:
    """Config 1.3's ``element_names``: (names per dimension, temporal dimension), or None
    for a form that names nothing the record can hold."""
    if isinstance(value, str):
        items: list[Any] = [None] if value == TEMPORAL_AXIS else [(value,)]
        temporal = 0 if value == TEMPORAL_AXIS else None
        per_axis, offset = _aligned(items, rank)
    elif isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value) and TEMPORAL_AXIS not in value:
            per_axis, offset = _aligned([tuple(value)], rank)  # a flat list: the last axis
            temporal = None
        else:
            items, temporal = [], None
            for index, item in enumerate(value):
                if item is None:
                    items.append(None)
                elif isinstance(item, str):
                    if item == TEMPORAL_AXIS:
                        temporal = index
                        items.append(None)
                    else:
                        items.append((item,))
                elif _names(item) is not None:
                    items.append(tuple(n for n in item if n != TEMPORAL_AXIS))
                else:
                    return None
            per_axis, offset = _aligned(items, rank)
            if temporal is not None:
                temporal += offset
    else:
        return None
    names: list[Any] = [None] * max(rank, offset + len(per_axis))
    for index, item in enumerate(per_axis):
        names[offset + index] = item
    return names, temporal


def _from_axes(value: Any) -> tuple[tuple[Axis | None, ...], list[Any], int | None,
                                    float | None] | None:
    """Config 1.4's ``axes``: (axes, names per dimension, time dimension, its period), or
    None for a form the record cannot hold."""
    if not isinstance(value, (list, tuple)):
        return None
    axes: list[Axis | None] = []
    names: list[Any] = []
    temporal, period = None, None
    for index, item in enumerate(value):
        if item is None:
            axes.append(None)
            names.append(None)
            continue
        if not isinstance(item, Mapping):
            return None
        kind = item.get("kind")
        axis_names = _names(item.get("names"))
        axis_period = _number(item.get("period_ms"))
        known = {"kind", "names", "period_ms"}
        extra = {k: v for k, v in item.items() if k not in known}
        for key, parsed in (("names", axis_names), ("period_ms", axis_period)):
            if item.get(key) is not None and parsed is None:
                extra[key] = item[key]  # a form the axis cannot hold: kept, not dropped
        if kind is not None and not isinstance(kind, str):
            extra["kind"], kind = kind, None
        axes.append(Axis(kind, axis_names, axis_period, _frozen(extra)))
        names.append(axis_names)
        if kind == TIME_AXIS and temporal is None:
            temporal, period = index, axis_period
    return tuple(axes), names, temporal, period


def port_record(entry: Mapping[str, Any], node: str, side: str, *,
                shape: tuple[int, ...] | None = None, dtype: str | None = None,
                device: torch.device | str | None = None, static: bool | None = None,
                source: str | None = None) -> InferencePort:
    """The :class:`InferencePort` of one YAML port entry of ``node``.

    ``shape`` and ``dtype``: the checked ones (``leapp.bundle.pipeline.Port``);
    by default the entry's own.  ``device``, ``static`` and ``source`` are what
    the YAML entry cannot say: where the runtime keeps the tensors, whether the
    node's model computes the output from no input, what feeds a feedback port.
    """
    name = entry.get("name")
    shape = tuple(shape if shape is not None else entry.get("shape") or ())
    dtype_name = str(dtype if dtype is not None else entry.get("dtype"))
    spelled = SPELLINGS.get(dtype_name[len("torch."):] if dtype_name.startswith("torch.")
                            else dtype_name)
    extra = {k: v for k, v in entry.items() if k not in PORT_FIELDS
             and k not in SEMANTIC_FIELDS}

    raw_kind = entry.get("kind")
    kind = _KINDS.get(raw_kind, raw_kind) if isinstance(raw_kind, str) else _frozen(raw_kind)

    per_axis: list[Any] = [None] * len(shape)
    temporal: int | None = None
    period = _number(entry.get("temporal_period_ms"))
    if entry.get("temporal_period_ms") is not None and period is None:
        extra["temporal_period_ms"] = entry["temporal_period_ms"]
    axes = None
    if entry.get("axes") is not None:
        parsed_axes = _from_axes(entry["axes"])
        if parsed_axes is None:
            extra["axes"] = entry["axes"]
        else:
            axes, per_axis, temporal, axis_period = parsed_axes
            per_axis = per_axis + [None] * (len(shape) - len(per_axis))
            period = axis_period if axis_period is not None else period
    if entry.get("element_names") is not None:
        parsed = _from_element_names(entry["element_names"], len(shape))
        if parsed is None:
            extra["element_names"] = entry["element_names"]
        else:  # config 1.3's names win over axes of the same entry
            per_axis, names_temporal = parsed
            temporal = names_temporal if names_temporal is not None else temporal
    flat = tuple(n for names in per_axis if names for n in names)

    is_setpoint = entry.get("is_setpoint", False)
    if not isinstance(is_setpoint, bool):
        extra["is_setpoint"], is_setpoint = is_setpoint, False
    reference = entry.get("reference")
    if reference is not None and not isinstance(reference, str):
        extra["reference"], reference = reference, None
    expressed_in = entry.get("expressed_in")
    if expressed_in is not None and not isinstance(expressed_in, Mapping):
        extra["expressed_in"], expressed_in = expressed_in, None

    return InferencePort(
        key=f"{node}/{name}", node=node, name=str(name), side=side, kind=kind,
        element_names=flat, axis_names=tuple(per_axis), temporal_axis=temporal,
        temporal_period_ms=period, shape=shape,
        dtype=getattr(torch, spelled) if spelled is not None else None,
        dtype_name=spelled or dtype_name,
        device=torch.device(device) if device is not None else None,
        extra=_frozen(extra), static=(False if side == INPUT else static), source=source,
        axes=axes, is_setpoint=is_setpoint, reference=reference,
        expressed_in=None if expressed_in is None else _frozen(expressed_in),
        entry=_frozen(dict(entry)))


# ---- lookups ---------------------------------------------------------------------------------

def _checked_kind(kind: Any) -> Any:
    if isinstance(kind, (InputKindEnum, OutputKindEnum)):
        return kind.value
    if isinstance(kind, str) and kind:
        return kind
    raise TypeError(f"A kind is an InputKindEnum / OutputKindEnum member or its string "
                    f"(such as 'state/joint/position'), got {kind!r}")


def _kinds_text(ports: Mapping[str, InferencePort]) -> str:
    if not ports:
        return "none"
    return ", ".join(f"{key} ({port.kind_name if port.kind_name is not None else 'no kind'})"
                     for key, port in ports.items())


class PortCatalog:
    """The lookups by kind over ``input_ports`` and ``output_ports`` (mixed into
    ``Pipeline`` and ``InferenceManager``, which provide those two mappings)."""

    __slots__ = ()

    input_ports: Mapping[str, InferencePort]
    output_ports: Mapping[str, InferencePort]

    def inputs_by_kind(self, kind: InputKindEnum | OutputKindEnum | str) -> list[InferencePort]:
        """Every graph input of ``kind`` (a member or its string), in YAML order."""
        wanted = _checked_kind(kind)
        return [p for p in self.input_ports.values() if p.kind_name == wanted]

    def outputs_by_kind(self, kind: InputKindEnum | OutputKindEnum | str) -> list[InferencePort]:
        """Every graph output of ``kind`` (a member or its string), in YAML order."""
        wanted = _checked_kind(kind)
        return [p for p in self.output_ports.values() if p.kind_name == wanted]

    def input_by_kind(self, kind: InputKindEnum | OutputKindEnum | str) -> InferencePort:
        """The one graph input of ``kind``; :class:`PortLookupError` (a KeyError) when
        none or several have it, naming the graph inputs and their kinds."""
        return _one(self.inputs_by_kind(kind), kind, "input", self.input_ports)

    def output_by_kind(self, kind: InputKindEnum | OutputKindEnum | str) -> InferencePort:
        """The one graph output of ``kind``; :class:`PortLookupError` (a KeyError) when
        none or several have it, naming the graph outputs and their kinds."""
        return _one(self.outputs_by_kind(kind), kind, "output", self.output_ports)


def _one(found: list[InferencePort], kind: Any, side: str,
         ports: Mapping[str, InferencePort]) -> InferencePort:
    if len(found) == 1:
        return found[0]
    wanted = kind_value(kind)
    plural = "inputs" if side == INPUT else "outputs"
    if not found:
        raise PortLookupError(f"No graph {side} has kind '{wanted}'. The graph {plural}: "
                              f"{_kinds_text(ports)}")
    raise PortLookupError(
        f"{len(found)} graph {plural} have kind '{wanted}': "
        f"{', '.join(p.key for p in found)}; {side}_by_kind wants exactly one. Use "
        f"{plural}_by_kind('{wanted}') for all of them, or pick one by its key in "
        f"{side}_ports")


# ---- text ------------------------------------------------------------------------------------

def _short_names(names: tuple[str, ...], limit: int = 8) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit - 2]) + f", ... {names[-1]} ({len(names)})"


def describe(port: InferencePort) -> str:
    """One line: key, dtype and shape, element names, period, 1.4 fields, static,
    source and the extra fields (what ``leapp inspect`` prints under each kind)."""
    dims = "x".join(str(s) for s in port.shape)
    text = f"{port.key}: {port.dtype_name}[{dims}]"
    if port.element_names:
        text += f"  elements [{_short_names(port.element_names)}]"
    if port.temporal_axis is not None:
        period = port.temporal_period_ms
        text += f"  time axis {port.temporal_axis}" + (
            f" every {period:g} ms" if period is not None else " (no period)")
    if port.is_setpoint:
        text += "  setpoint"
    if port.reference is not None:
        text += f"  reference {port.reference}"
    if port.expressed_in is not None:
        text += "  expressed in " + ", ".join(f"{k}={v}" for k, v in port.expressed_in.items())
    if port.static:
        text += "  static"
    if port.source is not None:
        text += f"  <- {port.source}"
    if port.extra:
        text += "  (" + ", ".join(f"{k}={_plain_text(v)}" for k, v in port.extra.items()) + ")"
    return text


def _plain_text(value: Any) -> str:
    if isinstance(value, Mapping):
        value = {k: _plain_text(v) for k, v in value.items()}
    elif isinstance(value, tuple):
        value = [_plain_text(v) for v in value]
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."
