#!/bin/sh
# make test-device: the GPU run (tests/device/run.py) under the machine's own Python.
# The interpreter: $LEAPP_DEVICE_PYTHON, else the first of python3.12, python3, python
# that imports torch.  Arguments go to run.py (--out DIR, --allow-cpu, ...).
set -eu
cd "$(dirname "$0")/../.."
PY="${LEAPP_DEVICE_PYTHON:-}"
if [ -z "$PY" ]; then
    for candidate in python3.12 python3 python; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" 2>/dev/null; then
            PY="$candidate"
            break
        fi
    done
fi
if [ -z "$PY" ]; then
    echo "test-device: no Python with torch on PATH (set LEAPP_DEVICE_PYTHON)" >&2
    exit 2
fi
exec "$PY" tests/device/run.py "$@"
