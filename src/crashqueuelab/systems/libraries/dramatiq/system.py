"""dramatiq's system, on the shared skeleton, with its Redis broker on a Redis server with
Redis's default persistence."""

from __future__ import annotations

import dataclasses

from crashqueuelab.judges.readers.dramatiq import queue_name, read_dramatiq_store
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.dramatiq import LIBRARY
from crashqueuelab.systems.libraries.dramatiq.client import (
    HEARTBEAT_TIMEOUT_MS,
    STATUS,
    DramatiqClient,
)
from crashqueuelab.systems.libraries.dramatiq.points import CRASH_POINTS
from crashqueuelab.systems.libraries.dramatiq.promises import DOCUMENTED
from crashqueuelab.systems.libraries.dramatiq.worker import LIBRARY_WORKER, OWN_WORKER
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_dramatiq_store,
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.dramatiq (reads queue {queue_name(directory)} with RESP)"
    ),
)


def dramatiq_system(name: str = "dramatiq") -> System:
    """dramatiq's Redis broker on a Redis server with Redis's default persistence."""
    # Imported here, once: the lab opens systems from several threads at a time.
    import dramatiq
    import dramatiq.brokers.redis  # noqa: F401

    from crashqueuelab.servers.redis import PERSISTENCE_WORDS

    system = LIBRARY.system(
        name,
        durability=f"Redis persistence rdb: {PERSISTENCE_WORDS['rdb']}",
        open=DramatiqClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=DOCUMENTED,
        persistence="rdb",
        own_worker=OWN_WORKER,
        library_worker=LIBRARY_WORKER,
    )
    # A killed worker's messages come back once its heartbeat is older than the timeout.
    return dataclasses.replace(system, recovery_s=HEARTBEAT_TIMEOUT_MS / 1000)


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    return dramatiq_system(name)
