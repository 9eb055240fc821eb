"""How leapp writes files: the modes they get (what the umask gives), torch archives
serialised through memory.

Bundles, fused models and Triton repositories are written under temporary
names (mkstemp / mkdtemp create them 0600 / 0700) and then given the mode a
plain ``open()`` or ``mkdir()`` would have given them.
"""
from __future__ import annotations

import io
import os
from typing import Any, Callable


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


def save_via_memory(save: Callable[[Any], None], path: str) -> None:
    """save(file object) into memory, then the bytes to path with ordinary file I/O.

    torch's zip writer (torch.jit.save, torch.export.save) aborts the process
    when a write fails (a full disk): serialising into memory first turns that
    into an OSError from the file write.
    """
    buffer = io.BytesIO()
    save(buffer)
    with open(path, "wb") as handle:
        handle.write(buffer.getbuffer())
