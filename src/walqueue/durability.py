"""Small durable-file helpers: every create, rename and delete that must survive is synced."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_data(fd: int) -> None:
    """Sync a file's data and whatever metadata reading it back needs (its size), not its
    times: fdatasync where the platform has it, fsync elsewhere."""
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def write_file(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``, synced (its directory entry is the caller's job)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
