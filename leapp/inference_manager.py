"""The public import path `leapp.inference_manager`: Run an exported LEAPP pipeline from its YAML description.

# --- public path only --------------------------------------------------------
# The code lives in leapp/running/inference_manager.py (the running stage); this module
# only keeps `leapp.inference_manager` importable.  Add nothing here.
"""
from .running.inference_manager import (  # noqa: F401
    InferenceManager, InferenceNode, NodeManager,
)
from .bundle.ports import InferencePort, PortLookupError  # noqa: F401

__all__ = [
    "InferenceManager", "InferenceNode", "NodeManager", "InferencePort", "PortLookupError",
]
