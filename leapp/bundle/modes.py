"""The modes of the files and directories leapp writes: what the umask gives.

Bundles, fused models and Triton repositories are written under temporary
names (mkstemp / mkdtemp create them 0600 / 0700) and then given the mode a
plain ``open()`` or ``mkdir()`` would have given them.
"""
from __future__ import annotations

import os


def umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new regular file gets."""
    return 0o666 & ~umask()


def directory_mode() -> int:
    """The mode a new directory gets."""
    return 0o777 & ~umask()
