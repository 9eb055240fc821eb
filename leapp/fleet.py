"""The public import path `leapp.fleet`: Many robots in one process: ``leapp.serving.fleet.FleetRunner``.

# --- public path only --------------------------------------------------------
# The code lives in leapp/serving/fleet.py (the serving stage); this module
# only keeps `leapp.fleet` importable.  Add nothing here.
"""
from .serving.fleet import (  # noqa: F401
    BatchError, FleetError, FleetRunner, validate_fleet,
)

__all__ = [
    "BatchError", "FleetError", "FleetRunner", "validate_fleet",
]
