"""The op rules, one module per family; importing this package registers them all."""
from __future__ import annotations

from . import (activations, attention, casts, elementwise, linalg, recurrent,  # noqa: F401
               reductions, selection, shapes)
