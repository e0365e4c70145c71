"""A pass-through FUSE file system that remembers what was never synced.

Every operation reaches the backing tree at once (reads see the latest bytes, as they would
in a page cache) and is recorded in a ``Journal`` with what it overwrote. Nothing here is
durable on its own: ``fsync`` and ``fsyncdir`` only tell the journal which pending operations
the disk now holds. Links and symbolic links are refused (``EPERM``): no system under test
uses them, and a journal that half-modelled them would lie. An ``OSError`` raised here is
the reply (the bindings send its ``errno``). POSIX and ``flock`` locks are not
implemented on purpose, so the kernel keeps them locally, exactly as on a local disk.

Given a ``FaultPlan`` (``faults.py``), a write, read or fsync that an armed fault covers is
answered with its error instead: a failed write or read changes nothing, a failed fsync
drops the writes it covered from what the disk will ever hold (fsyncgate, ``Journal``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.powerloss.faults import FaultPlan
from crashqueuelab.lab.faults.powerloss.journal import GRAVEYARD, TREE, Journal

_OPEN_FLAGS_DROPPED = os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND | os.O_ACCMODE


class PowerLossFilesystem:
    """The FUSE operations (the bindings call them by name, with mount-relative paths)."""

    use_ns = True

    def __init__(
        self,
        root: Path,
        journal: Journal,
        caller: Callable[[], tuple[int, int]] | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        """``caller`` names the uid and gid of the process making a request; given, what it
        creates is its own (a mount shared with another account, as a server's data
        directory is), else the file system's. ``faults``: the disk errors armed."""
        self.tree = root / TREE
        self.faults = faults
        self.caller = caller
        self.graveyard = root / GRAVEYARD
        self.journal = journal
        self._buried = 0
        self._files: dict[int, int] = {}  # handle (the backing fd) -> inode

    def _real(self, path: str) -> Path:
        return self.tree / path.lstrip("/")

    def _bury(self, path: str) -> tuple[str, int]:
        """Move a file or an empty directory aside, where a lost unlink can find it again."""
        self._buried += 1
        name = f"{self._buried:08d}"
        ino = os.lstat(self._real(path)).st_ino
        os.rename(self._real(path), self.graveyard / name)
        self.journal.seen(ino, f"{GRAVEYARD}/{name}")
        return name, ino

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        info = os.lstat(self._real(path)) if fh is None else os.fstat(fh)
        return {
            "st_mode": info.st_mode,
            "st_nlink": info.st_nlink,
            "st_size": info.st_size,
            "st_uid": info.st_uid,
            "st_gid": info.st_gid,
            "st_ino": info.st_ino,
            "st_atime": info.st_atime_ns,
            "st_mtime": info.st_mtime_ns,
            "st_ctime": info.st_ctime_ns,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *sorted(os.listdir(self._real(path)))]

    def opendir(self, path: str) -> int:
        return 0

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, "access denied")
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        info = os.statvfs(self.tree)
        names = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
        return {name: getattr(info, name) for name in (*names, "f_namemax")}

    def _own(self, path: str) -> None:
        if self.caller is not None:
            os.chown(self._real(path), *self.caller())

    def _track(self, path: str, fd: int) -> int:
        ino = os.fstat(fd).st_ino
        self._files[fd] = ino
        self.journal.seen(ino, f"{TREE}/{path.lstrip('/')}")
        return fd

    def open(self, path: str, flags: int) -> int:
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        mode = os.O_RDWR if writable else os.O_RDONLY
        fd = os.open(self._real(path), (flags & ~_OPEN_FLAGS_DROPPED) | mode)
        self._track(path, fd)
        if flags & os.O_TRUNC and writable:
            self._truncate_fd(path, fd, 0)
        return fd

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        fd = os.open(self._real(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, stat.S_IMODE(mode))
        self._own(path)
        self._track(path, fd)
        self.journal.name_op("create", path, self._files[fd])
        return fd

    def _fault(self, operation: str, path: str) -> None:
        if self.faults is not None:
            self.faults.check(operation, path)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._fault("read", path)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._fault("write", path)
        old_size = os.fstat(fh).st_size
        old = os.pread(fh, len(data), offset) if offset < old_size else b""
        written = os.pwrite(fh, data, offset)
        self.journal.wrote(self._files[fh], path, offset, bytes(data[:written]), old, old_size)
        return written

    def _truncate_fd(self, path: str, fd: int, length: int) -> None:
        old_size = os.fstat(fd).st_size
        old = os.pread(fd, old_size - length, length) if length < old_size else b""
        os.ftruncate(fd, length)
        self.journal.truncated(self._files[fd], path, length, old, old_size)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None and fh in self._files:
            self._truncate_fd(path, fh, length)
            return 0
        fd = os.open(self._real(path), os.O_RDWR)
        try:
            self._track(path, fd)
            self._truncate_fd(path, fd, length)
        finally:
            self._files.pop(fd, None)
            os.close(fd)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() promises nothing about durability

    def release(self, path: str, fh: int) -> int:
        self._files.pop(fh, None)
        os.close(fh)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        try:
            self._fault("fsync", path)
        except OSError:
            # fsyncgate: the pages it covered are dropped, never to reach the disk.
            self.journal.file_sync_failed(self._files[fh])
            raise
        self.journal.file_synced(self._files[fh])
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        # A failed one makes nothing durable: the name changes it covered stay pending.
        self._fault("fsyncdir", path)
        self.journal.directory_synced(path)
        return 0

    def unlink(self, path: str) -> int:
        name, ino = self._bury(path)
        self.journal.name_op("unlink", path, ino, buried=name, buried_ino=ino)
        return 0

    def rename(self, old: str, new: str) -> int:
        ino = os.lstat(self._real(old)).st_ino
        buried, buried_ino = self._bury(new) if os.path.lexists(self._real(new)) else (None, None)
        os.rename(self._real(old), self._real(new))
        self.journal.seen(ino, f"{TREE}/{new.lstrip('/')}")
        self.journal.name_op("rename", old, ino, target=new, buried=buried, buried_ino=buried_ino)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), stat.S_IMODE(mode))
        self._own(path)
        ino = os.lstat(self._real(path)).st_ino
        self.journal.seen(ino, f"{TREE}/{path.lstrip('/')}")
        self.journal.name_op("mkdir", path, ino)
        return 0

    def rmdir(self, path: str) -> int:
        if os.listdir(self._real(path)):
            raise OSError(errno.ENOTEMPTY, "directory not empty")
        name, ino = self._bury(path)
        self.journal.name_op("rmdir", path, ino, buried=name, buried_ino=ino)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), stat.S_IMODE(mode))
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)
        return 0

    def link(self, target: str, source: str) -> int:
        raise OSError(errno.EPERM, "hard links are not modelled")

    def symlink(self, target: str, source: str) -> int:
        raise OSError(errno.EPERM, "symbolic links are not modelled")
