"""walqueue's exceptions: one root, and a crash signal outside it."""

from __future__ import annotations


class WalQueueError(Exception):
    """Raised for every failure walqueue reports on purpose."""


class KeyConflict(WalQueueError):
    """Raised when a key or task id is reused for a different request; nothing was written."""


class StaleLease(WalQueueError):
    """Raised when ack/release does not come from the live lease; nothing was written."""


class CorruptStore(WalQueueError):
    """Raised when the directory's bytes cannot be trusted: never silently repaired."""


class QueueLocked(WalQueueError):
    """Raised when another Queue (in this or another process) owns the directory."""


class InjectedCrash(BaseException):
    """Simulated process death raised by a test hook; not an Exception, so nothing swallows it."""
