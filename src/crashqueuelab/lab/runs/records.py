"""Output directories and durable JSON artifacts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput


def prepare_output_directory(path: Path) -> Path:
    """Create ``path``, or accept it when empty; refuse anything else before touching it.

    Results of separate runs must never mix, so a non-empty directory is an error.
    """
    if path.exists():
        if not path.is_dir():
            raise InvalidInput("output_directory", f"{path} exists and is not a directory")
        if any(path.iterdir()):
            raise InvalidInput(
                "output_directory", f"{path} is not empty; choose a new or empty directory"
            )
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically: temp file, fsync, rename, fsync the directory."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)
    _fsync_directory(path.parent)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
