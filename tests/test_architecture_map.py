"""docs/architecture.md's map names every source file, and only files that exist.

A new module without a row, or a row left behind by a move, fails here, so the
map someone new reads first cannot drift from the tree.
"""
from __future__ import annotations

import os
import pathlib
import re

from support import ROOT

MAP = pathlib.Path(ROOT, "docs", "architecture.md")
CELL = re.compile(r"^\|[^|]*\|\s*(.+?)\s*\|\s*$")
NAME = re.compile(r"`([\w./]+)`")


def mapped() -> set[str]:
    """Every path the map's tables name (a folder stands for the files in it)."""
    names: set[str] = set()
    text = MAP.read_text()
    section = text[text.index("## Where each concern lives"):]
    section = section[:section.index("\n## ", 1)]
    for line in section.splitlines():
        cell = CELL.match(line)
        if cell is None:
            continue
        folder = ""  # `leapp/backends/jit.py`, `onnx.py`: a bare name is in the last folder
        for name in NAME.findall(cell.group(1)):
            if "/" in name:
                folder = os.path.dirname(name.rstrip("/"))
                names.add(name.rstrip("/"))
            elif folder:
                names.add(f"{folder}/{name}")
    return names


def sources() -> set[str]:
    found = set()
    for pattern in ("leapp/**/*.py", "leapp/**/*.pyi", "csrc/*.c", "csrc/*.h"):
        for path in pathlib.Path(ROOT).glob(pattern):
            if "__pycache__" not in path.parts:
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_every_row_names_an_existing_file_or_folder():
    missing = sorted(n for n in mapped() if not os.path.exists(os.path.join(ROOT, n)))
    assert missing == []


# the package's front door and the annotations' type stub need no row of their own
UNMAPPED = {"leapp/__init__.py", "leapp/annotate.pyi"}


def test_every_source_file_has_a_row():
    names = mapped()
    unmapped = sorted(path for path in sources() - UNMAPPED
                      if path not in names and not any(path.startswith(n + "/") for n in names))
    assert unmapped == []
