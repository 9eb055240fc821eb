"""Upstream-compatible import paths under ``leapp.utils``.

leapp 0.7.2 published some public names from modules inside ``leapp.utils``
(``from leapp.utils.tensor_description import TensorSemantics`` is the
common one).  These modules are thin aliases: every name they provide is the
very object ``leapp`` itself exports.
"""
from __future__ import annotations

from . import enums, logging, tensor_description  # noqa: F401

__all__ = ["enums", "logging", "tensor_description"]
