"""Sleeping until another process says so: Linux futexes on words of a shared file mapping.

The fair turns (turns.py) used to let every waiter poll the line: measured with 16 workers
and 1 ms of work each, that was about 125 sleeps, reads and lock probes per job, and the
polling took CPU from the one process holding the write lock on a 2-core machine. A
futex lets a waiter sleep in the kernel until the process ahead of it hands over, with a
timeout, so every wait stays bounded and a dead neighbour is still noticed.

A futex word is 4 bytes of a ``MAP_SHARED`` mapping of the sidecar file; the kernel keys a
shared futex by file and offset, so processes that map the same file meet on it. Where the
system call is not available (another OS, an architecture not listed here),
``futex_available()`` is False and callers poll instead.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
#: The futex system call's number, per architecture (Linux's syscall tables).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
WORD_BYTES = 4
_WORD_MASK = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall_number() -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    return _SYS_FUTEX.get(platform.machine())


def futex_available() -> bool:
    """Whether this process can sleep on futex words (Linux on x86_64 or aarch64)."""
    return _syscall_number() is not None


class FutexWords:
    """``count`` futex words at ``offset`` of the file open as ``fd`` (grown to hold them)."""

    def __init__(self, fd: int, offset: int, count: int) -> None:
        number = _syscall_number()
        if number is None:
            raise OSError("futexes are not available on this system")
        self._number = number
        self._offset = offset
        self._count = count
        size = offset + WORD_BYTES * count
        # Growing never shrinks a file another process already grew; both write zeros.
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        self._map: mmap.mmap | None = mmap.mmap(fd, size)
        # The mapping's address, for the system call; held while the mapping is open.
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(self._map)
        self._base = ctypes.addressof(self._anchor)
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall

    def close(self) -> None:
        if self._map is not None:
            # The anchor exports the mapping's buffer; it must go before the mapping can.
            self._anchor = None
            self._map.close()
            self._map = None

    def _at(self, index: int) -> int:
        return self._offset + WORD_BYTES * (index % self._count)

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            raise OSError("the futex words are closed")
        return self._map

    def value(self, index: int) -> int:
        at = self._at(index)
        return int.from_bytes(self._mapping()[at : at + WORD_BYTES], "little")

    def wait(self, index: int, seen: int, timeout_s: float) -> None:
        """Sleep while word ``index`` still holds ``seen``: until woken, or ``timeout_s``.

        Returns at once if the word already changed (a wake-up between the caller's read
        and this call is never lost). Early returns are normal: callers re-check.
        """
        self._mapping()
        seconds = max(timeout_s, 0.0)
        spec = _Timespec(int(seconds), int((seconds % 1) * 1e9))
        address = ctypes.c_void_p(self._base + self._at(index))
        self._syscall(
            ctypes.c_long(self._number),
            address,
            ctypes.c_int(_FUTEX_WAIT),
            ctypes.c_int(seen),
            ctypes.byref(spec),
            None,
            ctypes.c_int(0),
        )

    def wake(self, index: int) -> None:
        """Change word ``index`` and wake one process sleeping on it."""
        mapping = self._mapping()
        at = self._at(index)
        changed = (self.value(index) + 1) & _WORD_MASK
        mapping[at : at + WORD_BYTES] = changed.to_bytes(WORD_BYTES, "little")
        self._syscall(
            ctypes.c_long(self._number),
            ctypes.c_void_p(self._base + at),
            ctypes.c_int(_FUTEX_WAKE),
            ctypes.c_int(1),
            None,
            None,
            ctypes.c_int(0),
        )
