"""persist-queue's system, on the shared skeleton."""

from __future__ import annotations

from crashqueuelab.judges.readers.persistqueue import DATABASE_FILE, read_ack_queue
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.persistqueue import LIBRARY
from crashqueuelab.systems.libraries.persistqueue.client import STATUS, PersistQueueClient
from crashqueuelab.systems.libraries.persistqueue.points import CRASH_POINTS
from crashqueuelab.systems.libraries.persistqueue.promises import DOCUMENTED
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_ack_queue,
    STATUS,
    f"crashqueuelab.judges.readers.persistqueue (reads {DATABASE_FILE} directly)",
)


def persistqueue_system() -> System:
    """persist-queue's SQLiteAckQueue, as installed."""
    return LIBRARY.system(
        "persist-queue",
        durability="WAL (set by persist-queue); synchronous left at SQLite's default",
        open=PersistQueueClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=DOCUMENTED,
    )


def build(name: str) -> System:
    """The system of that name (the registry's call): persist-queue has one."""
    return persistqueue_system()
