"""walqueue: a single-writer durable queue on its own write-ahead log, snapshots and CURRENT."""

from walqueue.errors import (
    CorruptStore,
    InjectedCrash,
    KeyConflict,
    QueueLocked,
    StaleLease,
    WalQueueError,
)
from walqueue.queue import Lease, Queue, TaskState

__all__ = [
    "CorruptStore",
    "InjectedCrash",
    "KeyConflict",
    "Lease",
    "Queue",
    "QueueLocked",
    "StaleLease",
    "TaskState",
    "WalQueueError",
]
