"""The public import path `leapp.triton_server`: Start and stop the ``tritonserver`` binary that the ``nvidia-pytriton`` wheel ships.

# --- public path only --------------------------------------------------------
# The code lives in leapp/serving/triton_server.py (the serving stage); this module
# only keeps `leapp.triton_server` importable.  Add nothing here.
"""
from .serving.triton_server import (  # noqa: F401
    TritonServer, TritonServerError, TritonUnavailable, failed_models, find_tritonserver,
    free_ports,
)

__all__ = [
    "TritonServer", "TritonServerError", "TritonUnavailable", "failed_models",
    "find_tritonserver", "free_ports",
]
