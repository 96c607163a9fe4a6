"""SHA-256 of files, read in chunks: a job's data file, a model file (no torch here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["file_sha256"]


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes, read 4 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
