"""The public import path `leapp.triton`: Triton Inference Server model repositories from a bundle: ``leapp triton``.

# --- public path only --------------------------------------------------------
# The code lives in leapp/serving/triton.py (the serving stage); this module
# only keeps `leapp.triton` importable.  Add nothing here.
"""
from .serving.triton import (  # noqa: F401
    CONTROL_INPUTS, DEFAULT_FLEET_SIZE, INSTANCE_KINDS, MAX_FLEET_SIZE, SERVE_WITH,
    TritonRepository, TritonRepositoryError, config_text, model_name, read_config,
    write_repository,
)

__all__ = [
    "CONTROL_INPUTS", "DEFAULT_FLEET_SIZE", "INSTANCE_KINDS", "MAX_FLEET_SIZE", "SERVE_WITH",
    "TritonRepository", "TritonRepositoryError", "config_text", "model_name", "read_config",
    "write_repository",
]
