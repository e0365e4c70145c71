"""The file-system process: ``python -m crashqueuelab.lab.faults.powerloss.daemon ROOT MOUNTPOINT
[shared]``.

It serves ``ROOT/tree`` at ``MOUNTPOINT`` on one thread (so the journal's order is the order
the kernel sent the requests) until SIGTERM or an unmount, then writes the pending
operations to ``ROOT/unsynced.json``: the moment it stops serving is the power cut. It
answers the disk errors armed in ``ROOT/faults.json`` (``faults.py``).
``shared`` lets other accounts use the mount (a server running as its own account), each
owning what it creates.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.powerloss.faults import FaultPlan
from crashqueuelab.lab.faults.powerloss.filesystem import PowerLossFilesystem
from crashqueuelab.lab.faults.powerloss.journal import JOURNAL_FILE, Journal

#: Zero timeouts: the kernel asks for every name and size instead of remembering them, so a
#: file the lab changed behind the mount is never seen stale.
SIGNALLED = "8"
PR_SET_PDEATHSIG = 1
MOUNT_OPTIONS = {"attr_timeout": 0, "entry_timeout": 0, "negative_timeout": 0}
SHARED = "shared"


def _stop_with_parent(parent: int | None) -> bool:
    """Ask Linux to send SIGTERM when the lab process dies, so a killed run never leaves a
    mount behind (SIGTERM makes libfuse unmount and this process write its journal).
    False when the parent ``parent`` died before the request was made: Linux never sends
    the signal then, and a daemon that mounted anyway would serve an orphan mount for ever
    (seen when a run was stopped while it started a case's disk)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    return parent is None or os.getppid() == parent


def serve(root: Path, mountpoint: str, *, shared: bool = False, parent: int | None = None) -> None:
    # The bindings pick libfuse 2 when both are installed; the kernel protocol is the same,
    # but Debian ships fusermount only with fuse3.
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    import mfusepy

    if not _stop_with_parent(parent):
        return
    journal = Journal()
    try:
        _serve_until_stopped(mfusepy, root, journal, mountpoint, shared=shared)
    finally:
        journal.dump(root / JOURNAL_FILE)


def _caller(mfusepy: Any) -> tuple[int, int]:
    uid, gid, _ = mfusepy.fuse_get_context()
    return int(uid), int(gid)


def _serve_until_stopped(
    mfusepy: Any, root: Path, journal: Journal, mountpoint: str, *, shared: bool
) -> None:
    caller = (lambda: _caller(mfusepy)) if shared else None
    options: dict[str, Any] = {**MOUNT_OPTIONS, **({"allow_other": True} if shared else {})}
    try:
        mfusepy.FUSE(
            PowerLossFilesystem(root, journal, caller, FaultPlan(root)),
            mountpoint,
            foreground=True,
            nothreads=True,
            fsname="crashqueuelab-powerloss",
            **options,
        )
    except RuntimeError as error:
        # libfuse's main loop reports "ended by a signal" as 8; SIGTERM is how we stop it.
        if str(error) != SIGNALLED:
            raise


if __name__ == "__main__":  # run as a process by disk.PowerLossDisk
    # ROOT MOUNTPOINT PARENT_PID [shared]
    serve(Path(sys.argv[1]), sys.argv[2], shared=sys.argv[4:] == [SHARED], parent=int(sys.argv[3]))
