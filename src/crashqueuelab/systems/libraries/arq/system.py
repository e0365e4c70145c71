"""arq's systems, on the shared skeleton, on a Redis server with its default persistence or
with the append-only file synced on every write."""

from __future__ import annotations

import dataclasses

from crashqueuelab.judges.readers.arq import queue_name, read_arq_store
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.arq import LIBRARY, PERSISTENCE_BY_SYSTEM
from crashqueuelab.systems.libraries.arq.client import (
    IN_PROGRESS_MARGIN_S,
    JOB_TIMEOUT_S,
    STATUS,
    ArqClient,
)
from crashqueuelab.systems.libraries.arq.points import CRASH_POINTS
from crashqueuelab.systems.libraries.arq.promises import documented_for
from crashqueuelab.systems.libraries.arq.worker import OWN_WORKER
from crashqueuelab.systems.libraries.redisstore import persistence_durability
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_arq_store,
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.arq (reads queue {queue_name(directory)} with RESP)"
    ),
)


def arq_system(name: str = "arq") -> System:
    """arq on a Redis server with the persistence its name says (``arq``: Redis's default,
    RDB snapshots; ``arq-aof-always``: the append-only file synced on every write)."""
    # Imported here, once: the lab opens systems from several threads at a time.
    import arq  # noqa: F401

    persistence = PERSISTENCE_BY_SYSTEM[name]
    system = LIBRARY.system(
        name,
        durability=persistence_durability(persistence),
        open=ArqClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=documented_for(persistence),
        persistence=persistence,
        own_worker=OWN_WORKER,
    )
    # A killed worker's job comes back once Redis expired its in-progress key.
    return dataclasses.replace(system, recovery_s=float(JOB_TIMEOUT_S + IN_PROGRESS_MARGIN_S))


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    return arq_system(name)
