"""One owner per directory: an OS file lock on ``LOCK``, released on close or process death."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from walqueue.errors import QueueLocked


class Ownership:
    """Holds the directory's exclusive lock for as long as it is open."""

    def __init__(self, directory: Path) -> None:
        self._fd: int | None = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock locks belong to the open file description, so a second Queue in the
            # same process is refused just like one in another process.
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise QueueLocked(f"{directory} is owned by another Queue") from None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
