"""Digests of files: the one place leapp hashes a file's bytes.

Used for the checksums a compile writes into the YAML (md5 and sha256 in
one read), the model checksum ``InferenceManager`` verifies, and the CLI's
check of a bundle.
"""
from __future__ import annotations

import hashlib
import os
from typing import Iterable

_CHUNK = 1 << 20  # read 1 MiB at a time: model files can be large


def file_digests(source: str | os.PathLike | int,
                 algorithms: Iterable[str] = ("sha256",)) -> tuple[str, ...]:
    """The hex digests of a file's bytes, one per hashlib algorithm name, in order.

    source: a path, or a descriptor open for reading (closed here), for callers
    that opened the file with their own checks (``_safe_load.open_regular``).
    The file is read once whatever the number of algorithms.
    """
    digests = [hashlib.new(name) for name in algorithms]
    with (os.fdopen(source, "rb") if isinstance(source, int) else open(source, "rb")) as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            for digest in digests:
                digest.update(chunk)
    return tuple(digest.hexdigest() for digest in digests)
