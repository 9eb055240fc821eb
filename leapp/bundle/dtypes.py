"""The one dtype table: a port's YAML name with its torch, NumPy, ONNX and Triton types.

Every module that turns a port's dtype into another library's type reads it
here: the pipeline model (YAML names and their older spellings), the fused
model's metadata and ONNX graph, the ONNX runner's I/O binding and the Triton
repositories.  The types of optional libraries (onnx) are named, not
imported, so reading the table imports nothing but torch and NumPy.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

import numpy as np
import torch


class DType(NamedTuple):
    """One row: the YAML name and the same type in each library (None: it has none)."""

    name: str                # the YAML name (torch's attribute name)
    torch: torch.dtype
    numpy: Any               # NumPy scalar type, None where NumPy has none
    onnx: str                # onnx.TensorProto attribute name
    triton: tuple[str, str]  # (config data type, client wire datatype)


_ROWS = (
    DType("float16", torch.float16, np.float16, "FLOAT16", ("TYPE_FP16", "FP16")),
    DType("float32", torch.float32, np.float32, "FLOAT", ("TYPE_FP32", "FP32")),
    DType("float64", torch.float64, np.float64, "DOUBLE", ("TYPE_FP64", "FP64")),
    DType("bfloat16", torch.bfloat16, None, "BFLOAT16", ("TYPE_BF16", "BF16")),
    DType("int8", torch.int8, np.int8, "INT8", ("TYPE_INT8", "INT8")),
    DType("int16", torch.int16, np.int16, "INT16", ("TYPE_INT16", "INT16")),
    DType("int32", torch.int32, np.int32, "INT32", ("TYPE_INT32", "INT32")),
    DType("int64", torch.int64, np.int64, "INT64", ("TYPE_INT64", "INT64")),
    DType("uint8", torch.uint8, np.uint8, "UINT8", ("TYPE_UINT8", "UINT8")),
    DType("uint16", torch.uint16, np.uint16, "UINT16", ("TYPE_UINT16", "UINT16")),
    DType("uint32", torch.uint32, np.uint32, "UINT32", ("TYPE_UINT32", "UINT32")),
    DType("uint64", torch.uint64, np.uint64, "UINT64", ("TYPE_UINT64", "UINT64")),
    DType("bool", torch.bool, np.bool_, "BOOL", ("TYPE_BOOL", "BOOL")),
)

#: YAML name -> row.
BY_NAME: Mapping[str, DType] = MappingProxyType({row.name: row for row in _ROWS})
#: torch dtype -> row.
BY_TORCH: Mapping[torch.dtype, DType] = MappingProxyType({row.torch: row for row in _ROWS})

#: dtype names a port may carry -> the canonical YAML name (older bundles' spellings too).
SPELLINGS: Mapping[str, str] = MappingProxyType({
    **{row.name: row.name for row in _ROWS},
    "float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
})

#: torch dtypes onnxruntime's I/O binding is handed as NumPy element types.
#: (bfloat16 and the wide unsigned types are not: the runner copies those.)
IO_BINDING: Mapping[torch.dtype, Any] = MappingProxyType({
    row.torch: row.numpy for row in _ROWS
    if row.numpy is not None and row.name not in ("uint16", "uint32", "uint64")})


def onnx_type(dtype: torch.dtype) -> int:
    """The onnx.TensorProto element type of a torch dtype (KeyError: it has none here)."""
    from onnx import TensorProto
    return int(getattr(TensorProto, BY_TORCH[dtype].onnx))
