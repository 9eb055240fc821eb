"""Every ```python block of README.md and docs/*.md runs as written.

Each Markdown file runs in its own interpreter and its own empty directory; each
block starts from a fresh namespace, in the order of the file.  Two markers, an
HTML comment on the last non-blank line before the opening fence, change that:

    <!-- fragment -->   the block is an excerpt (names defined elsewhere): not run
    <!-- continue -->   the block goes on from the previous block's namespace
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from support import ROOT

DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(fragment|continue)\s*-->$")

RUNNER = r"""
import json, sys, traceback
blocks = json.load(sys.stdin)
namespace = None
for block in blocks:
    if block["marker"] != "continue" or namespace is None:
        namespace = {"__name__": "__main__"}
    try:
        exec(compile(block["code"], f"{block['file']}:{block['line']}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"the block at {block['file']}:{block['line']} failed")
"""


def python_blocks(path: str) -> list[dict]:
    """The ```python blocks of a Markdown file: code, first line, marker (or None)."""
    with open(os.path.join(ROOT, path)) as handle:
        lines = handle.read().splitlines()
    blocks, index, previous = [], 0, ""
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            if lines[index].strip():
                previous = lines[index].strip()
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if fence.group(1) in ("python", "py"):
            marker = MARKER.match(previous)
            blocks.append({"file": path, "line": index + 2,
                           "code": "\n".join(lines[index + 1:end]) + "\n",
                           "marker": marker.group(1) if marker else None})
        previous, index = "```", end + 1
    return blocks


def test_markers_are_known_and_attached():
    for path in DOCS:
        with open(os.path.join(ROOT, path)) as handle:
            text = handle.read()
        for comment in re.findall(r"<!--\s*([\w-]+)\s*-->", text):
            assert comment in ("fragment", "continue"), (path, comment)
        blocks = python_blocks(path)
        if blocks:
            assert blocks[0]["marker"] != "continue", f"{path}: its first block continues nothing"


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)])
def test_python_blocks_run(path, tmp_path):
    blocks = [b for b in python_blocks(path) if b["marker"] != "fragment"]
    if not blocks:
        pytest.skip(f"{path}: only fragments")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks),
                            capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]


def test_every_doc_with_code_is_covered():
    # README and the guides hold Python; a block in another language is not run
    assert "README.md" in DOCS and "docs/api.md" in DOCS
    assert sum(len(python_blocks(p)) for p in DOCS) >= 6
