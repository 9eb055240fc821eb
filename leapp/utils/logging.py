"""``leapp.utils.logging``: the custom log levels of the ``leapp`` logger.

Records go to the standard ``logging.getLogger("leapp")``; these are the
numeric levels it uses besides the standard ones.
"""
from __future__ import annotations

from ..bundle.log import FATAL, SECTION, SYSTEM

__all__ = ["SECTION", "SYSTEM", "FATAL"]
