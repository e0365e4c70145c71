"""Start a power-loss mount, cut its power, and say plainly when this machine cannot.

``PowerLossDisk`` runs the file system in its own process (``daemon``) with the backing tree
in ``root/tree``; everything the system under test does happens through the mount point.
``cut`` stops the file system at once (SIGTERM: it answers no further request), waits for it
to write its journal, and returns the journal: what the disk had not made durable.
``arm`` and ``disarm`` make the file system answer disk errors (``faults.py``).
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from crashqueuelab.core.errors import CrashModeUnavailable, install_hint
from crashqueuelab.lab.faults.powerloss import faults
from crashqueuelab.lab.faults.powerloss.journal import (
    GRAVEYARD,
    JOURNAL_FILE,
    TREE,
    Journal,
    load_journal,
)
from crashqueuelab.lab.runs.modes import POWER_LOSS

#: Bounds on every wait: the mount appearing, the file system stopping.
MOUNT_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 30.0
DAEMON_LOG = "filesystem.log"


def unavailable_reason() -> str | None:
    """Why this machine cannot lose power on purpose, or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"power-loss mode needs Linux FUSE; this is {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return "power-loss mode needs /dev/fuse, and this machine has none"
    if importlib.util.find_spec("mfusepy") is None:
        return f"power-loss mode needs the FUSE bindings: {install_hint('powerloss')}"
    if ctypes.util.find_library("fuse3") is None:
        return "power-loss mode needs libfuse 3 (Debian: apt-get install fuse3)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "power-loss mode needs root or fusermount3 to mount (Debian: apt-get install fuse3)"
    return None


def require_power_loss() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise CrashModeUnavailable(POWER_LOSS, reason)


def _listed_as_mounted(path: Path) -> bool:
    """Whether the kernel lists ``path`` as a mount point, even one whose server is gone."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
            # Field 5 is the mount point, with spaces and the like octal-escaped.
            return any(line.split()[4] == str(path) for line in mounts)
    except OSError:
        return os.path.ismount(path)


class PowerLossDisk:
    """One mount of ``root/tree`` at ``mountpoint``, from start to power cut."""

    def __init__(self, root: Path, mountpoint: Path, *, shared: bool = False) -> None:
        """``shared``: other accounts may use the mount, each owning what it creates (a
        server that runs as its own account keeps its data directory here)."""
        # Absolute: libfuse runs the file system from "/", where relative paths mean nothing.
        self.root = root.absolute()
        self.mountpoint = mountpoint.absolute()
        self.shared = shared
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def tree(self) -> Path:
        return self.root / TREE

    def start(self) -> None:
        require_power_loss()
        for directory in (self.tree, self.root / GRAVEYARD, self.mountpoint):
            directory.mkdir(parents=True, exist_ok=True)
        (self.root / JOURNAL_FILE).unlink(missing_ok=True)
        faults.disarm(self.root)  # a fault armed for an earlier mount is not this one's
        with open(self.root / DAEMON_LOG, "ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "crashqueuelab.lab.faults.powerloss.daemon",
                    self.root,
                    self.mountpoint,
                    str(os.getpid()),
                    *(["shared"] if self.shared else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # A Ctrl-C at a terminal reaches its whole process group: the file system
                # must keep serving until the run that mounted it stops it (it dies with
                # that run all the same: daemon.py asks for SIGTERM when its parent dies).
                start_new_session=True,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(self.mountpoint):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._stop(signal.SIGKILL)
                tail = (self.root / DAEMON_LOG).read_text(errors="replace")[-600:]
                raise CrashModeUnavailable(
                    POWER_LOSS, f"the FUSE mount did not come up: {tail.strip()}"
                )
            time.sleep(0.01)

    def arm(self, *armed: faults.DiskFault, arming: str = "") -> None:
        """From the next operation on, the file system answers ``armed``'s errors."""
        faults.arm(self.root, list(armed), arming)

    def disarm(self) -> None:
        """From the next operation on, the disk answers as a healthy one."""
        faults.disarm(self.root)

    def fired(self) -> list[dict[str, object]]:
        """Every error the file system answered on this root, oldest first."""
        return faults.fired(self.root)

    def cut(self) -> Journal:
        """Pull the plug: the file system stops serving; what was pending is in the journal."""
        self._stop(signal.SIGTERM)
        return load_journal(self.root / JOURNAL_FILE)

    def _stop(self, how: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(how)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        if _listed_as_mounted(self.mountpoint):
            # A killed file system leaves its mount behind ("transport endpoint is not
            # connected", which os.path.ismount cannot even stat): detach it.
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False, capture_output=True)

    def __enter__(self) -> PowerLossDisk:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop(signal.SIGTERM)
