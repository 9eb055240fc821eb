"""``leapp.utils.enums``: the semantic kind enums, as exported by ``leapp``."""
from __future__ import annotations

from ..semantics import InputKindEnum, OutputKindEnum

__all__ = ["InputKindEnum", "OutputKindEnum"]
