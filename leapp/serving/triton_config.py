"""Triton model configs: the ``ModelConfig`` protobuf messages, their text format, and
the pieces every model of a repository is built from (tensors, dims, the model directory).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..bundle.dtypes import BY_NAME
from ..bundle.pipeline import DTYPES, Port

logger = logging.getLogger("leapp")

#: What the python backend runs, written next to its model.py.
SPEC_FILE = "leapp_model.json"


class TritonRepositoryError(ValueError):
    """The bundle cannot be written as a Triton model repository (the message says why)."""


def config_module() -> Any:
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise ImportError("leapp triton builds the configs with tritonclient's ModelConfig "
                          "protobuf definitions: pip install 'tritonclient[grpc]' "
                          f"(or leapp[triton]); {exc}") from exc
    return model_config_pb2


def config_text(config: Any) -> str:
    """A ``ModelConfig`` message in protobuf text format (the ``config.pbtxt`` syntax)."""
    from google.protobuf import text_format
    return text_format.MessageToString(config)


def read_config(path: str) -> Any:
    """Parse a ``config.pbtxt`` into tritonclient's ``ModelConfig`` (raises on bad syntax)."""
    from google.protobuf import text_format
    with open(path) as handle:
        return text_format.Parse(handle.read(), config_module().ModelConfig())


def model_name(text: str, taken: set[str]) -> str:
    """A Triton model (directory) name for ``text``: ``[A-Za-z0-9_.-]``, unique in ``taken``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".") or "model"
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate


# ---- reading the bundle --------------------------------------------------------------------

@dataclass
class TensorSpec:
    """A tensor of a fused model's interface (its metadata's name, dtype and shape)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def triton_types(dtype: Any, where: str) -> tuple[str, str]:
    name = DTYPES.get(dtype[len("torch."):] if str(dtype).startswith("torch.") else dtype) \
        if isinstance(dtype, str) else None
    if name not in BY_NAME:
        raise TritonRepositoryError(
            f"{where}: dtype {dtype!r} has no Triton data type (supported: "
            f"{', '.join(BY_NAME)}); cast the tensor to one of them in the node")
    return BY_NAME[name].triton


def checked_ports(ports: Sequence[Port], node: str, side: str) -> Sequence[Port]:
    """The node's ports, each with a dtype Triton has."""
    for port in ports:
        triton_types(port.dtype, f"node {node!r}, {side[:-1]} {port.name!r}")
    return ports


# ---- config pieces -------------------------------------------------------------------------

def dims(port: Port | TensorSpec) -> list[int]:
    # Triton needs at least one dimension: a 0-d tensor travels as [1], reshaped to []
    return list(port.shape) or [1]


def add_tensor(entry: Any, name: str, port: Port | TensorSpec) -> None:
    entry.name = name
    entry.data_type = getattr(config_module(), triton_types(port.dtype, name)[0])
    entry.dims.extend(dims(port))
    if not port.shape:
        entry.reshape.SetInParent()


def model_config(name: str, backend: str, inputs: Sequence[tuple[str, Port | TensorSpec]],
                  outputs: Sequence[tuple[str, Port | TensorSpec]], max_batch_size: int = 0,
                  instances: str = "cpu") -> Any:
    mc = config_module()
    config = mc.ModelConfig(name=name, backend=backend, max_batch_size=max_batch_size)
    for tensor_name, port in inputs:
        add_tensor(config.input.add(), tensor_name, port)
    for tensor_name, port in outputs:
        add_tensor(config.output.add(), tensor_name, port)
    group = config.instance_group.add()
    group.kind = mc.ModelInstanceGroup.KIND_GPU if instances == "gpu" \
        else mc.ModelInstanceGroup.KIND_CPU
    group.count = 1
    return config


def write_model(staging: str, name: str, config: Any, files: Mapping[str, str] = {},
                 spec: Mapping[str, Any] | None = None) -> str:
    """Write ``<name>/config.pbtxt`` and ``<name>/1/`` (files copied, python model + spec)."""
    version = os.path.join(staging, name, "1")
    os.makedirs(version)
    with open(os.path.join(staging, name, "config.pbtxt"), "w") as handle:
        handle.write(config_text(config))
    for target, source in files.items():
        shutil.copyfile(source, os.path.join(version, target))
    if spec is not None:
        shutil.copyfile(os.path.join(os.path.dirname(__file__), "triton_model.py"),
                        os.path.join(version, "model.py"))
        with open(os.path.join(version, SPEC_FILE), "w") as handle:
            json.dump(spec, handle, indent=1)
    return name


