"""dramatiq on its RabbitMQ broker (``dramatiq-rabbitmq``): a node the run starts, and the
results in the run's Redis server.

The broker is ``RabbitmqBroker`` with ``confirm_delivery=True`` (an ``enqueue`` returns once
RabbitMQ confirmed the message: persistent, to a durable queue), the same ``Retries`` and
``Results`` middleware as on Redis, the results in Redis (``RedisBackend``): RabbitMQ deletes
an acknowledged message, and a finished job is found by its result. Only dramatiq's own
worker consumes (the ``dramatiq`` command, as on Redis, with this module's broker): the
adapter submits and reads, and claims nothing, so the lab runs it under ``deploys``. A
message a worker holds unacknowledged goes back to the queue as RabbitMQ sees the worker's
connection close; no heartbeat or maintenance is involved.

The adapter's own readings (its duplicate guard at a submission, ``job``, ``active_count``)
use the judges' reader while workers may consume: each ready message is taken and put back,
marked redelivered, and a message a worker holds (a delayed one it keeps until its eta, too)
is not seen, so a key submitted again while a worker holds its message is enqueued twice. No
command submits a key twice on RabbitMQ today (only a producer that fails over does).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.judges.readers.dramatiq import (
    DELAYED,
    QUEUED,
    DramatiqReading,
    read_dramatiq_rabbitmq_store,
)
from crashqueuelab.servers.rabbitmq import URL_VARIABLE
from crashqueuelab.systems.contract import Claim, JobSpec, JobView, OpenRequest, OwnWorker, Verdict
from crashqueuelab.systems.libraries.dramatiq.client import (
    BACKOFF_MS,
    STATUS,
    declare_lab_job,
    enqueue_each,
    lab_message,
    message_id,
    record_submitted,
    redis_socket,
    store_queue,
)
from crashqueuelab.systems.libraries.dramatiq.promises import AT_LEAST_ONCE
from crashqueuelab.systems.libraries.dramatiq.worker import (
    QUEUE_VARIABLE,
    SHUTDOWN,
    SOURCE,
    actor_on,
    serve,
    served_work,
)
from crashqueuelab.systems.libraries.skeleton import LibraryClient, scheduled_job

#: RabbitMQ's documentation of what happens to a delivery whose channel closes.
REQUEUED = "https://www.rabbitmq.com/confirms.html#automatic-requeueing"


def rabbitmq_url() -> str:
    url = os.environ.get(URL_VARIABLE)
    if not url:
        raise SystemUnavailable(
            "dramatiq-rabbitmq",
            f"no RabbitMQ node: the command line starts one; {URL_VARIABLE} is unset",
        )
    return url


def make_rabbitmq_broker(queue: str) -> Any:
    """A ``RabbitmqBroker`` on the run's node, with publisher confirms, ``Retries`` and
    ``Results`` (in the run's Redis), and the actor ``lab_job`` on the store's queue."""
    import redis
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.middleware import Retries
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    connection = redis.Redis(unix_socket_path=redis_socket())
    # Untyped in some releases and typed in others.
    results: Any = Results
    rabbitmq_broker: Any = RabbitmqBroker
    broker = rabbitmq_broker(
        url=rabbitmq_url(),
        confirm_delivery=True,
        middleware=[
            Retries(min_backoff=BACKOFF_MS, max_backoff=BACKOFF_MS),
            results(backend=RedisBackend(client=connection), store_results=True),
        ],
    )
    declare_lab_job(broker, queue)
    return broker


def close_rabbitmq_broker(broker: Any) -> None:
    """dramatiq's ``close`` (its RabbitMQ connections), then the results' Redis connections."""
    from dramatiq.results import Results

    broker.close()
    for middleware in broker.middleware:
        if isinstance(middleware, Results):
            middleware.backend.client.connection_pool.disconnect()


def read(directory: Path) -> DramatiqReading:
    return read_dramatiq_rabbitmq_store(directory, os.environ.get(URL_VARIABLE))


class DramatiqRabbitmqClient(LibraryClient):
    """``QueueClient`` over one dramatiq queue on RabbitMQ: submissions and readings; the
    worker's steps are dramatiq's own worker's."""

    def __init__(self, request: OpenRequest) -> None:
        rabbitmq_url()
        redis_socket()
        logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
        self.directory = request.directory
        self.hook = request.hook
        self.queue = store_queue(request.directory)
        self.producer = make_rabbitmq_broker(self.queue)

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        held = read(self.directory).jobs
        return enqueue_each(
            jobs, held, self.queue, self.directory, self.producer.enqueue, self.hook
        )

    def _own_worker_only(self, operation: str) -> OperationUnsupported:
        return OperationUnsupported("dramatiq", f"{operation} of its own on RabbitMQ")

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        raise self._own_worker_only("claim")

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise self._own_worker_only("heartbeat")

    def succeed(self, claim: Claim) -> Verdict:
        raise self._own_worker_only("acknowledgement")

    def fail(self, claim: Claim, error: str) -> Verdict:
        raise self._own_worker_only("failure report")

    def recover(self) -> int:
        raise self._own_worker_only("recover")

    def job(self, key: str) -> JobView | None:
        found = read(self.directory).jobs.get(key)
        if found is None:
            return None
        state, attempts = found
        return JobView(key, STATUS[state], attempts, state)

    def active_count(self) -> int:
        jobs = read(self.directory).jobs.values()
        return sum(1 for state, _ in jobs if state in (QUEUED, DELAYED))

    def close(self) -> None:
        close_rabbitmq_broker(self.producer)


def setup() -> None:
    """The command's broker (``module:callable``) on RabbitMQ: the store's queue on the
    run's node, its actor doing this process's work."""
    import dramatiq

    queue = os.environ[QUEUE_VARIABLE]
    broker = make_rabbitmq_broker(queue)
    actor_on(broker, queue, served_work[-1])
    dramatiq.set_broker(broker)


def schedule(directory: Path, key: str, due_s: float) -> None:
    """``RabbitmqBroker.enqueue(message, delay=...)`` of the lab's job ``key``, due at
    ``due_s`` (seconds since the epoch): its delay queue, as on Redis."""
    queue = store_queue(directory)
    record_submitted(directory, key, message_id(queue, key))
    broker = make_rabbitmq_broker(queue)
    try:
        delay_ms = max(0, round(due_s * 1000 - time.time() * 1000))
        broker.enqueue(lab_message(queue, scheduled_job(key)), delay=delay_ms)
    finally:
        close_rabbitmq_broker(broker)


OWN_WORKER = OwnWorker(
    serve=partial(serve, setup=f"{__name__}:setup"),
    describe="dramatiq's command (dramatiq.cli.main) with one worker process of one thread, on"
    " its RabbitMQ broker: its main process passes SIGTERM/SIGINT on, its worker finishes the"
    " message in hand and puts back the ones it prefetched",
    shutdown={
        **SHUTDOWN,
        "SIGKILL": AT_LEAST_ONCE + ": a killed worker's unacknowledged messages go back to the"
        ' queue as RabbitMQ sees its connection close ("any delivery (message) that was not'
        " acked is automatically requeued when the channel (or connection) on which the"
        f' delivery happened is closed", {REQUEUED})',
    },
    source=SOURCE,
    schedule=schedule,
)
