"""The kinds a port's ``kind`` field names: ``InputKindEnum`` and ``OutputKindEnum``.

They are the bundle's vocabulary, so they live in its lowest stage: the port
catalogue (``leapp.bundle.ports``) turns a YAML ``kind`` string back into its
member, and ``leapp.semantics`` (where users import them from, with
``TensorSemantics``) re-exports these very classes.  Both are plain enums, as
upstream's are: a member is not equal to its string value.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["InputKindEnum", "OutputKindEnum", "TEMPORAL_AXIS"]

#: The element_names item that marks a port's time axis (``TemporalAxis`` writes it).
TEMPORAL_AXIS = "__temporal_axis__"


class InputKindEnum(Enum):
    """Semantic roles of pipeline inputs (written to the YAML as their value)."""

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


class OutputKindEnum(Enum):
    """Semantic roles of pipeline outputs (written to the YAML as their value)."""

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
