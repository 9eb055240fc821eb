"""Tensor semantics: TensorSemantics, the kind enums, TemporalAxis, GraphConfigs."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

TEMPORAL_AXIS = "__temporal_axis__"


class InputKindEnum(str, Enum):
    """Semantic roles of pipeline inputs."""

    JOINT_POSITION = "state/joint/position"
    JOINT_VELOCITY = "state/joint/velocity"
    JOINT_EFFORT = "state/joint/effort"
    BODY_POSE = "state/body/pose"
    BODY_VEL = "state/body/velocity"
    BODY_ACC = "state/body/acceleration"
    BODY_LINEAR_ACCELERATION = "state/body/linear_acceleration"
    BODY_LINEAR_VELOCITY = "state/body/linear_velocity"
    BODY_ANGULAR_ACCELERATION = "state/body/angular_acceleration"
    BODY_ANGULAR_VELOCITY = "state/body/angular_velocity"
    BODY_ROTATION = "state/body/rotation"
    BODY_POSITION = "state/body/position"
    WRENCH = "state/wrench"
    VECTOR3D = "state/vector3d"
    COMMAND_JOINT_POSITION = "command/joint/position"
    COMMAND_JOINT_VELOCITY = "command/joint/velocity"
    COMMAND_JOINT_TORQUES = "command/joint/torques"
    COMMAND_BODY_ROTATION = "command/body/rotation"
    COMMAND_BODY_VELOCITY = "command/body/velocity"
    COMMAND_POSE = "command/body/pose"


class OutputKindEnum(str, Enum):
    """Semantic roles of pipeline outputs."""

    KP = "kp"
    KD = "kd"
    JOINT_POSITION = "target/joint/position"
    JOINT_VELOCITY = "target/joint/velocity"
    JOINT_TORQUES = "target/joint/torques"
    JOINT_EFFORT = "target/joint/effort"
    BODY_POSITION = "target/body/position"
    BODY_LINEAR_ACCELERATION = "target/body/linear_acceleration"
    BODY_ORIENTATION = "target/body/orientation"
    BODY_LINEAR_VELOCITY = "target/body/linear_velocity"
    BODY_ANGULAR_ACCELERATION = "target/body/angular_acceleration"


@dataclass(frozen=True)
class TemporalAxis:
    """Marks the time axis inside element_names; period_ms is the sample period."""

    period_ms: float


@dataclass
class TensorSemantics:
    """A named tensor with optional semantic metadata for the pipeline YAML.

    name: the port name; ref: the tensor; kind: an InputKindEnum /
    OutputKindEnum member or a custom string; element_names: a string, a flat
    list of strings, or one list per dimension (None entries allowed, one
    TemporalAxis at most); extra: project fields flattened into the entry.
    """

    name: str | None = None
    ref: Any = None
    kind: InputKindEnum | OutputKindEnum | str | None = None
    element_names: Any = None
    extra: dict | None = None

    def yaml_fields(self) -> dict | None:
        """The semantic fields of the YAML tensor entry, in their order."""
        fields: dict[str, Any] = {}
        if self.kind is not None:
            fields["kind"] = self.kind.value if isinstance(self.kind, Enum) else str(self.kind)
        if self.element_names is not None:
            names, period = normalize_element_names(self.element_names)
            fields["element_names"] = names
            if period is not None:
                fields["temporal_period_ms"] = period
        if self.extra:
            if not isinstance(self.extra, dict):
                raise TypeError(f"TensorSemantics '{self.name}': extra must be a dict, "
                                f"got {type(self.extra).__name__}")
            fields.update(self.extra)
        return fields or None


def _flow(value: Any) -> Any:
    """Lists become tuples: the YAML emitter writes tuples in flow style."""
    if isinstance(value, (list, tuple)):
        return tuple(_flow(v) for v in value)
    return value


def normalize_element_names(names: Any) -> tuple[tuple, float | None]:
    """element_names as one flow list per axis, plus the temporal period if any."""
    if isinstance(names, str):
        if names == TEMPORAL_AXIS:
            raise ValueError(f"'{TEMPORAL_AXIS}' is reserved for TemporalAxis")
        return ((names,),), None
    if not isinstance(names, (list, tuple)):
        raise TypeError(f"element_names must be a str or a list, got {type(names).__name__}")
    items = list(names)
    if all(isinstance(n, str) for n in items):
        if TEMPORAL_AXIS in items:
            raise ValueError(f"'{TEMPORAL_AXIS}' is reserved for TemporalAxis")
        return (tuple(items),), None
    period = None
    axes: list[Any] = []
    for item in items:
        if isinstance(item, TemporalAxis):
            if period is not None:
                raise ValueError("element_names may contain at most one TemporalAxis")
            period = item.period_ms
            axes.append(TEMPORAL_AXIS)
        elif isinstance(item, (list, tuple)):
            for inner in item:
                if isinstance(inner, TemporalAxis):
                    raise ValueError("TemporalAxis may not be nested inside an element_names list")
                if inner == TEMPORAL_AXIS:
                    raise ValueError(f"'{TEMPORAL_AXIS}' is reserved for TemporalAxis")
            axes.append(_flow(item))
        elif item is None or isinstance(item, str):
            if item == TEMPORAL_AXIS:
                raise ValueError(f"'{TEMPORAL_AXIS}' is reserved for TemporalAxis")
            axes.append(item)
        else:
            raise TypeError(f"element_names entries must be lists, str, None or TemporalAxis, "
                            f"got {type(item).__name__}")
    return tuple(axes), period


@dataclass
class GraphConfigs:
    """Pipeline-level settings written to pipeline.configs (frequency in Hz > 0)."""

    frequency: float | None = None
    extra: dict = field(default_factory=dict)

    def to_yaml(self) -> dict:
        out: dict[str, Any] = {}
        if self.frequency is not None:
            if not isinstance(self.frequency, (int, float)) or self.frequency <= 0:
                raise ValueError(f"GraphConfigs.frequency must be > 0, got {self.frequency!r}")
            out["frequency"] = self.frequency
        out.update(self.extra or {})
        return out
