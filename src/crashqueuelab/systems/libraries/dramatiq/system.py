"""dramatiq's systems, on the shared skeleton: ``dramatiq`` and ``dramatiq-aof-always``, its
Redis broker on a Redis server with Redis's default persistence or with the append-only file
synced on every write; ``dramatiq-rabbitmq``, its RabbitMQ broker on a node
the run starts, the results in that Redis server."""

from __future__ import annotations

import dataclasses
import os

from crashqueuelab.judges.readers.amqp import SETTLE_S
from crashqueuelab.judges.readers.dramatiq import (
    queue_name,
    read_dramatiq_rabbitmq_store,
    read_dramatiq_store,
)
from crashqueuelab.servers.rabbitmq import URL_VARIABLE
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.dramatiq import LIBRARY, PERSISTENCE_BY_SYSTEM
from crashqueuelab.systems.libraries.dramatiq.client import (
    HEARTBEAT_TIMEOUT_MS,
    STATUS,
    DramatiqClient,
)
from crashqueuelab.systems.libraries.dramatiq.points import CRASH_POINTS, CRASH_POINTS_ON_RABBITMQ
from crashqueuelab.systems.libraries.dramatiq.promises import DOCUMENTED_ON_RABBITMQ, documented_for
from crashqueuelab.systems.libraries.dramatiq.worker import LIBRARY_WORKER, OWN_WORKER
from crashqueuelab.systems.libraries.redisstore import persistence_durability
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_dramatiq_store,
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.dramatiq (reads queue {queue_name(directory)} with RESP)"
    ),
)


def dramatiq_system(name: str = "dramatiq") -> System:
    """dramatiq's Redis broker on a Redis server with the persistence its name says
    (``dramatiq``: Redis's default, RDB snapshots; ``dramatiq-aof-always``: the append-only
    file synced on every write)."""
    # Imported here, once: the lab opens systems from several threads at a time.
    import dramatiq
    import dramatiq.brokers.redis  # noqa: F401

    persistence = PERSISTENCE_BY_SYSTEM[name]
    system = LIBRARY.system(
        name,
        durability=persistence_durability(persistence),
        open=DramatiqClient,
        reader=read_store,
        crash_points=CRASH_POINTS,
        documented=documented_for(persistence),
        persistence=persistence,
        own_worker=OWN_WORKER,
        library_worker=LIBRARY_WORKER,
    )
    # A killed worker's messages come back once its heartbeat is older than the timeout.
    return dataclasses.replace(system, recovery_s=HEARTBEAT_TIMEOUT_MS / 1000)


read_rabbitmq_store = library_reader(
    # Read once the run stopped its workers: their consumers may take RabbitMQ a moment
    # to remove.
    lambda directory: read_dramatiq_rabbitmq_store(
        directory, os.environ.get(URL_VARIABLE), settle_s=SETTLE_S
    ),
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.dramatiq (reads RabbitMQ queue {queue_name(directory)}"
        " and its delay and dead-letter queues over AMQP, each message put back, and the"
        " results with RESP)"
    ),
)


def dramatiq_rabbitmq_system(name: str = "dramatiq-rabbitmq") -> System:
    """dramatiq's RabbitMQ broker (publisher confirms) on a node the run starts, the results
    in its Redis server."""
    import dramatiq
    import dramatiq.brokers.rabbitmq  # noqa: F401

    from crashqueuelab.servers.redis import PERSISTENCE_WORDS
    from crashqueuelab.systems.libraries.dramatiq.rabbitmq import (
        OWN_WORKER as OWN_WORKER_ON_RABBITMQ,
    )
    from crashqueuelab.systems.libraries.dramatiq.rabbitmq import (
        DramatiqRabbitmqClient,
        declare_queues,
    )

    system = LIBRARY.system(
        name,
        durability="RabbitMQ: durable queues, persistent messages, publisher confirms"
        " (confirm_delivery=True); the results in Redis, persistence rdb:"
        f" {PERSISTENCE_WORDS['rdb']}",
        open=DramatiqRabbitmqClient,
        reader=read_rabbitmq_store,
        crash_points=CRASH_POINTS_ON_RABBITMQ,
        documented=DOCUMENTED_ON_RABBITMQ,
        persistence="rdb",
        own_worker=OWN_WORKER_ON_RABBITMQ,
    )
    # A killed worker's messages come back as its connection closes: no timeout to wait.
    return dataclasses.replace(
        system,
        version=f"dramatiq {LIBRARY.installed()} (its RabbitMQ broker)",
        broker="rabbitmq",
        declare_broker=declare_queues,
    )


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    if name == "dramatiq-rabbitmq":
        return dramatiq_rabbitmq_system(name)
    return dramatiq_system(name)
