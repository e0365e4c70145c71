"""RQ's systems, on the shared skeleton: one for each persistence of the Redis server."""

from __future__ import annotations

from crashqueuelab.judges.readers.rq import queue_name, read_rq_store
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.redisstore import persistence_durability
from crashqueuelab.systems.libraries.rq import LIBRARY, PERSISTENCE_BY_SYSTEM
from crashqueuelab.systems.libraries.rq.client import STATUS, RqClient
from crashqueuelab.systems.libraries.rq.points import CRASH_POINTS
from crashqueuelab.systems.libraries.rq.promises import documented_for
from crashqueuelab.systems.libraries.rq.worker import OWN_WORKER
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_rq_store,
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.rq (reads queue {queue_name(directory)} with RESP)"
    ),
)


def _system(name: str, persistence: str) -> System:
    # Imported here, once: the lab opens systems from several threads at a time.
    import rq  # noqa: F401

    return LIBRARY.system(
        name,
        durability=persistence_durability(persistence),
        open=RqClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=documented_for(persistence),
        persistence=persistence,
        own_worker=OWN_WORKER,
    )


def rq_system(name: str = "rq") -> System:
    """RQ on a Redis server with the persistence ``name`` stands for."""
    return _system(name, PERSISTENCE_BY_SYSTEM[name])


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    return rq_system(name)
