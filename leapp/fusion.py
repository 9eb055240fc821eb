"""The public import path `leapp.fusion`: The whole pipeline as one model: ``leapp.fuse``.

# --- public path only --------------------------------------------------------
# The code lives in leapp/serving/fusion.py (the serving stage); this module
# only keeps `leapp.fusion` importable.  Add nothing here.
"""
from .serving.fusion import (  # noqa: F401
    FuseError, FusedModel, fuse, initial_state, read_metadata, validate,
)

__all__ = [
    "FuseError", "FusedModel", "fuse", "initial_state", "read_metadata", "validate",
]
