"""Celery's systems, on the shared skeleton, on its Redis broker (a Redis server with its
default persistence): ``celery`` at Celery's defaults, ``celery-acks-late`` at the
configuration its documentation gives for tasks that must not be lost, ``celery-solo`` and
``celery-gevent-acks-late`` with their own worker's solo and gevent pools; and on its
RabbitMQ broker (a node the run starts, the results in Redis), ``celery-rabbitmq`` and
``celery-rabbitmq-acks-late`` (``rabbitmq.py``: each lab worker a consumer of its own)."""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from importlib.metadata import version
from importlib.util import find_spec

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.amqp import SETTLE_S
from crashqueuelab.judges.readers.celery import (
    queue_name,
    read_celery_rabbitmq_store,
    read_celery_store,
)
from crashqueuelab.servers.rabbitmq import URL_VARIABLE
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.celery import LIBRARY
from crashqueuelab.systems.libraries.celery.client import (
    DEFAULTS,
    RABBITMQ,
    RELIABLE,
    STATUS,
    CeleryClient,
    Settings,
)
from crashqueuelab.systems.libraries.celery.points import CRASH_POINTS, crash_points_on_rabbitmq
from crashqueuelab.systems.libraries.celery.promises import documented_for
from crashqueuelab.systems.libraries.celery.rabbitmq import CeleryRabbitmqClient
from crashqueuelab.systems.libraries.celery.worker import own_worker
from crashqueuelab.systems.libraries.redisstore import persistence_durability
from crashqueuelab.systems.libraries.skeleton import library_reader

read_store = library_reader(
    read_celery_store,
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.celery (reads queue {queue_name(directory)} with RESP)"
    ),
)
read_rabbitmq_store = library_reader(
    # Read once the run stopped its workers: their consumers may take RabbitMQ a moment
    # to remove.
    lambda directory: read_celery_rabbitmq_store(
        directory, os.environ.get(URL_VARIABLE), settle_s=SETTLE_S
    ),
    STATUS,
    lambda directory: (
        f"crashqueuelab.judges.readers.celery (reads RabbitMQ queue {queue_name(directory)}"
        " over AMQP, each message put back, and the results with RESP)"
    ),
)
#: Each system's settings and its own worker's pool, by its name.
SETTINGS = {
    "celery": (DEFAULTS, "prefork"),
    "celery-acks-late": (RELIABLE, "prefork"),
    "celery-solo": (DEFAULTS, "solo"),
    "celery-gevent-acks-late": (RELIABLE, "gevent"),
    "celery-rabbitmq": (Settings(broker=RABBITMQ), "prefork"),
    "celery-rabbitmq-acks-late": (Settings(True, True, broker=RABBITMQ), "prefork"),
}


def celery_system(
    name: str = "celery", settings: Settings | None = None, pool: str | None = None
) -> System:
    """Celery on its Redis broker with ``settings`` and its worker's ``pool`` (by default
    the name's)."""
    # Imported here, once: the lab opens systems from several threads at a time.
    import celery  # noqa: F401

    named, named_pool = SETTINGS.get(name, (DEFAULTS, "prefork"))
    chosen = settings or named
    on_rabbitmq = chosen.broker == RABBITMQ
    if (pool or named_pool) == "gevent" and find_spec("gevent") is None:
        # Celery's gevent pool imports gevent only as the worker starts: say it now.
        raise SystemUnavailable(
            name,
            "gevent is not installed: its worker runs Celery's gevent pool"
            " (pip install 'celery[gevent]'; a pinned release installs it beside)",
        )
    system = LIBRARY.system(
        name,
        durability=f"{chosen.words}; {persistence_durability('rdb')}"
        + (" (its results; the messages in Celery's durable queue)" if on_rabbitmq else ""),
        open=partial(CeleryRabbitmqClient if on_rabbitmq else CeleryClient, settings=chosen),
        reader=read_rabbitmq_store if on_rabbitmq else read_store,
        crash_points=crash_points_on_rabbitmq(chosen.acks_late) if on_rabbitmq else CRASH_POINTS,
        documented=documented_for(chosen),
        persistence="rdb",
        own_worker=own_worker(chosen, pool or named_pool),
    )
    # Celery's bugs of this kind live in kombu: its release is named beside Celery's.
    system = dataclasses.replace(
        system,
        version=f"celery {LIBRARY.installed()} (kombu {version('kombu')}, on its"
        f" {'RabbitMQ' if on_rabbitmq else 'Redis'} broker)",
        broker=RABBITMQ if on_rabbitmq else None,
    )
    if chosen.visibility_timeout_s is None or on_rabbitmq:
        # An hour, kombu's default: the lab does not wait for it (what it would bring back
        # is named by the documented weakness instead). RabbitMQ has no such timeout.
        return system
    # A message received and never acknowledged comes back after the stated timeout.
    return dataclasses.replace(system, recovery_s=float(chosen.visibility_timeout_s))


def build(name: str) -> System:
    """The system of that name (the registry's call)."""
    return celery_system(name)
