"""taskiq's systems, on the shared skeleton: taskiq-redis's stream broker on a Redis server with
its default persistence (``taskiq``) or with the append-only file synced on every write
(``taskiq-aof-always``)."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version

from crashqueuelab.judges.readers.taskiq import queue_name, read_taskiq_store
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.redisstore import persistence_durability
from crashqueuelab.systems.libraries.skeleton import library_reader
from crashqueuelab.systems.libraries.taskiq import LIBRARY, PERSISTENCE_BY_SYSTEM
from crashqueuelab.systems.libraries.taskiq.client import (
    IDLE_TIMEOUT_MS,
    STATUS,
    XREAD_BLOCK_MS,
    TaskiqClient,
    reclaims,
)
from crashqueuelab.systems.libraries.taskiq.points import CRASH_POINTS
from crashqueuelab.systems.libraries.taskiq.promises import documented
from crashqueuelab.systems.libraries.taskiq.worker import OWN_WORKER

read_store = library_reader(
    read_taskiq_store,
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.taskiq (reads stream {queue_name(directory)} with RESP)"
    ),
    facts=lambda reading: reading.facts,
)
#: Beyond ``idle_timeout``: the ``XREADGROUP`` wait before the next ``XAUTOCLAIM``, and a
#: margin for the replacement worker's start.
RECLAIM_MARGIN_S = 3.0


def taskiq_system(name: str = "taskiq") -> System:
    """taskiq with taskiq-redis's stream broker, on a Redis server with the persistence its
    name says (``taskiq``: Redis's default, RDB snapshots; ``taskiq-aof-always``: the
    append-only file synced on every write)."""
    # Imported here, once: the lab opens systems from several threads at a time.
    import taskiq_redis  # noqa: F401

    persistence = PERSISTENCE_BY_SYSTEM[name]
    reclaiming = reclaims()
    system = LIBRARY.system(
        name,
        durability=persistence_durability(persistence),
        open=TaskiqClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=documented(reclaiming, persistence),
        persistence=persistence,
        own_worker=OWN_WORKER,
    )
    idle = (
        f"idle_timeout {IDLE_TIMEOUT_MS} ms"
        if reclaiming
        else "no idle_timeout: this release reclaims no pending entry"
    )
    return dataclasses.replace(
        system,
        version=f"{system.version}, taskiq {version('taskiq')}'s receiver; {idle},"
        f" xread_block {XREAD_BLOCK_MS} ms",
        # A killed worker's entry comes back once it was idle idle_timeout and a consumer's
        # next XAUTOCLAIM ran; before 1.0.6 it never does, and waiting changes nothing.
        recovery_s=(IDLE_TIMEOUT_MS + XREAD_BLOCK_MS) / 1000 + RECLAIM_MARGIN_S,
    )


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    return taskiq_system(name)
