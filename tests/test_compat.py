"""Drop-in compatibility with upstream leapp 0.7.2, one test per pipeline.

Each test exports one pipeline of bench/compat_pipelines/ with our package
(this interpreter, or $LEAPP_OURS_PYTHON) and with upstream's interpreter
($LEAPP_UPSTREAM_PYTHON, else .compat-venv/bin/python as made by
`make compat`), then requires the same YAML (key by key), the same initial
values and the same outputs when each bundle runs under the other
implementation's InferenceManager (bench/compat.py does the work).

Skipped when no upstream interpreter is available.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402

UPSTREAM = compat.find_upstream_python()
OURS = compat.resolve_python(os.environ.get("LEAPP_OURS_PYTHON") or sys.executable)

pytestmark = [
    pytest.mark.skipif(
        UPSTREAM is None,
        reason="no upstream leapp interpreter: run `make compat` (creates "
               ".compat-venv) or set LEAPP_UPSTREAM_PYTHON"),
]


@pytest.mark.parametrize("pipeline", compat.PIPELINES)
def test_pipeline_matches_upstream(pipeline, tmp_path):
    report = compat.check_pipeline(pipeline, OURS, UPSTREAM, str(tmp_path))
    assert report.ok, "\n" + report.text()
