"""Disk errors answered by the power-loss file system: ``EIO`` on fsync (of a file or of a
directory), a write or a read, ``ENOSPC`` on a write, at a chosen point and for a chosen
window.

The error comes from the file system under the queue (the FUSE daemon answers the request
with it), never from the queue's code: the queue sees exactly what a failing disk gives a
plain ``os.fsync`` or ``os.write``. A fault is armed by writing a control file beside the
backing tree (``ROOT/faults.json``, replaced atomically) and disarmed by removing it; the
daemon looks at it (one ``stat``) before every operation a fault can hit, so a parent that
arms, makes a call and disarms knows the call ran under the fault. Every error answered is
appended to ``ROOT/faults.log``, one JSON line each, as evidence.

A fault names the operation (``fsync``, ``fsyncdir``, ``write``, ``read``), the errno (``EIO`` or
``ENOSPC``), a glob of mount-relative paths (``*`` for all, ``*.log`` for walqueue's
segments) and its window among the matching operations: ``skip`` of them pass, then
``count`` fail (None: every one until disarmed). Counting starts again at each arming.

A failed fsync is fsyncgate: the journal drops the writes it covered (``Journal``); they
stay readable until the cut (the page cache keeps them, marked clean) and never reach the
disk, whatever a later fsync answers. A failed directory fsync makes none of the directory's
pending name changes (a create, a rename, an unlink) durable: they stay pending, lost at a
cut unless a later directory fsync succeeds. A failed write or read changes nothing.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput

CONTROL_FILE = "faults.json"
FIRED_LOG = "faults.log"

#: What a fault can hit, and the errors each may answer.
OPERATIONS = ("fsync", "fsyncdir", "write", "read")
ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC}

#: The disk faults by the names a run gives them.
DISK_FAULTS = {
    "eio-fsync": ("fsync", "EIO"),
    "eio-dirsync": ("fsyncdir", "EIO"),
    "eio-write": ("write", "EIO"),
    "eio-read": ("read", "EIO"),
    "enospc": ("write", "ENOSPC"),
}


@dataclass(frozen=True)
class DiskFault:
    """One armed fault: ``operation`` on paths matching ``path`` answers ``error``, for the
    matching operations ``skip`` to ``skip + count`` (``count`` None: until disarmed)."""

    operation: str
    error: str
    path: str = "*"
    skip: int = 0
    count: int | None = None

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise InvalidInput("operation", f"{self.operation!r} is not one of {OPERATIONS}")
        if self.error not in ERRNOS:
            raise InvalidInput("error", f"{self.error!r} is not one of {sorted(ERRNOS)}")
        if self.skip < 0 or (self.count is not None and self.count < 1):
            raise InvalidInput("window", "skip must be at least 0 and count at least 1")

    @classmethod
    def named(
        cls, name: str, *, path: str = "*", skip: int = 0, count: int | None = None
    ) -> DiskFault:
        """A fault by its run name (``DISK_FAULTS``)."""
        if name not in DISK_FAULTS:
            raise InvalidInput("disk_fault", f"{name!r} is not one of {', '.join(DISK_FAULTS)}")
        operation, error = DISK_FAULTS[name]
        return cls(operation, error, path, skip, count)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def arm(root: Path, faults: list[DiskFault], arming: str) -> None:
    """Arm ``faults`` on the disk whose root is ``root`` (replacing what was armed)."""
    temporary = root / (CONTROL_FILE + ".tmp")
    body = {"arming": arming, "faults": [fault.to_json() for fault in faults]}
    temporary.write_text(json.dumps(body), encoding="utf-8")
    os.replace(temporary, root / CONTROL_FILE)


def disarm(root: Path) -> None:
    (root / CONTROL_FILE).unlink(missing_ok=True)


def fired(root: Path) -> list[dict[str, Any]]:
    """Every error the disk answered, oldest first."""
    log = root / FIRED_LOG
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


class FaultPlan:
    """The daemon's side: what is armed now, and whether one operation must fail."""

    def __init__(self, root: Path) -> None:
        self.control = root / CONTROL_FILE
        self.log = root / FIRED_LOG
        self._seen: tuple[int, int, int] | None = None
        self._arming = ""
        self._faults: list[DiskFault] = []
        self._matched: list[int] = []

    def _refresh(self) -> None:
        try:
            info = os.stat(self.control)
        except FileNotFoundError:
            self._seen, self._faults, self._matched = None, [], []
            return
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key == self._seen:
            return
        raw = json.loads(self.control.read_text(encoding="utf-8"))
        self._seen = key
        self._arming = str(raw.get("arming", ""))
        self._faults = [DiskFault(**fault) for fault in raw["faults"]]
        self._matched = [0] * len(self._faults)

    def check(self, operation: str, path: str) -> None:
        """Raise the armed error if ``operation`` on ``path`` falls in a fault's window."""
        self._refresh()
        relative = path.lstrip("/")
        for index, fault in enumerate(self._faults):
            if fault.operation != operation or not fnmatch.fnmatch(relative, fault.path):
                continue
            nth = self._matched[index]
            self._matched[index] += 1
            if nth < fault.skip or (fault.count is not None and nth >= fault.skip + fault.count):
                continue
            code = ERRNOS[fault.error]
            entry = {"arming": self._arming, "operation": operation, "path": path}
            with open(self.log, "a", encoding="utf-8") as log:
                log.write(json.dumps({**entry, "error": fault.error, "nth": nth}) + "\n")
            raise OSError(code, os.strerror(code))
