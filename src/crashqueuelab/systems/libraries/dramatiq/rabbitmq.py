"""dramatiq on its RabbitMQ broker (``dramatiq-rabbitmq``): a node the run starts, and the
results in the run's Redis server.

The broker is ``RabbitmqBroker`` with ``confirm_delivery=True`` (an ``enqueue`` returns once
RabbitMQ confirmed the message: persistent, to a durable queue), the same ``Retries`` and
``Results`` middleware as on Redis, the results in Redis (``RedisBackend``): RabbitMQ deletes
an acknowledged message, and a finished job is found by its result.

Each lab worker is one dramatiq consumer as RabbitMQ sees it, as on Redis: a broker of its
own whose consumers of the queue and of its delay queue (prefetch 1 each, each on its own
connection, as dramatiq's) a claim asks for the next message; an outcome is the middleware's
``after_process_message`` and the consumer's ``ack`` or ``nack``. dramatiq's consumer sends
an ack or a nack at its connection's next event and RabbitMQ answers none; the adapter then
makes one round trip on the channel (``basic.qos``), which RabbitMQ answers after the frames
before it, so an outcome reported is one RabbitMQ has. dramatiq's own worker does not wait:
killed just after its ack, it may run the message again (at least once). A message a
consumer holds unacknowledged goes back to the queue as RabbitMQ sees the consumer's
connection close: no heartbeat, no lease, no maintenance (``recover`` has nothing to do).
dramatiq's own worker (the ``dramatiq`` command, with this module's broker) serves
``deploys``.

The adapter's readings use the judges' reader (``job``, ``active_count``, the duplicate
guard at a submission): each ready message is taken and put back, marked redelivered; a
message a consumer holds, unacknowledged or prefetched, is not seen, so a submitted job with
no ready message and no result is taken as held by a consumer, and a key submitted again
while a consumer holds its message is enqueued twice (no command submits a key twice on
RabbitMQ today: only a producer that fails over does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.judges.readers.dramatiq import (
    ACKED,
    DEAD,
    FETCHED,
    DramatiqReading,
    read_dramatiq_rabbitmq_store,
    submitted,
)
from crashqueuelab.servers.rabbitmq import URL_VARIABLE
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobView, OpenRequest, OwnWorker, Verdict
from crashqueuelab.systems.libraries.dramatiq.client import (
    BACKOFF_MS,
    STATUS,
    LabWorker,
    claim_of,
    declare_lab_job,
    enqueue_each,
    held,
    lab_message,
    lab_worker,
    message_id,
    move_due,
    record_submitted,
    redis_socket,
    report_failure,
    report_success,
    store_queue,
)
from crashqueuelab.systems.libraries.dramatiq.promises import AT_LEAST_ONCE
from crashqueuelab.systems.libraries.dramatiq.publishing import declare
from crashqueuelab.systems.libraries.dramatiq.worker import (
    QUEUE_VARIABLE,
    SHUTDOWN,
    SOURCE,
    actor_on,
    serve,
    served_work,
)
from crashqueuelab.systems.libraries.skeleton import LibraryClient, scheduled_job

#: How long a claim waits for a delivery before it answers nothing.
FETCH_WAIT_S = 0.2
#: How long an outcome waits for the consumer's connection to send it, and how long each
#: of its rounds of pika's events may take.
FLUSH_BOUND_S, FLUSH_POLL_S = 10.0, 0.01
#: The jobs whose enqueue RabbitMQ confirmed, written after each confirm (the lines of the
#: submitted record's kind).
CONFIRMED_FILE = "dramatiq-confirmed.jsonl"
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


def jobs_of(directory: Path) -> dict[str, tuple[str, int]]:
    """Every job of the store: the reader's, and each job whose enqueue RabbitMQ confirmed
    with no ready message and no result as held by a consumer (``FETCHED``, its attempt
    unknown: 0). A job whose enqueue never was confirmed is not there."""
    jobs = dict(read(directory).jobs)
    for key in submitted(directory, CONFIRMED_FILE):
        jobs.setdefault(key, (FETCHED, 0))
    return jobs


def delivered(consumer: Any) -> Any:
    """The consumer's next message, or None once none came for ``FETCH_WAIT_S``: RabbitMQ
    pushes deliveries, and a consumer's first may take longer than one inactivity timeout
    (dramatiq's consumer answers None after each)."""
    deadline = time.monotonic() + FETCH_WAIT_S
    while (message := next(consumer)) is None and time.monotonic() < deadline:
        continue
    return message


def flushed(consumer: Any) -> None:
    """Once dramatiq's consumer sent what its connection's callbacks hold (an ack, a nack:
    they run in order, so once a callback added after them ran), one round trip on its
    channel: RabbitMQ answers ``basic.qos`` after the frames before it, so what was sent is
    taken."""
    import pika.exceptions
    from dramatiq.errors import ConnectionClosed

    # Untyped in some releases and typed in others.
    closed: Any = ConnectionClosed
    ran = threading.Event()
    try:
        consumer.connection.add_callback_threadsafe(ran.set)
        deadline = time.monotonic() + FLUSH_BOUND_S
        while not ran.is_set():
            if time.monotonic() > deadline:
                raise closed(f"pika ran no callback in {FLUSH_BOUND_S} s")
            consumer.connection.process_data_events(time_limit=FLUSH_POLL_S)
        consumer.channel.basic_qos(prefetch_count=1)
    except pika.exceptions.AMQPError as error:
        # As dramatiq's consumer says a broken connection or channel in its own calls.
        raise closed(error) from None


class DramatiqRabbitmqClient(LibraryClient):
    """``QueueClient`` over one dramatiq queue on RabbitMQ."""

    def __init__(self, request: OpenRequest) -> None:
        from dramatiq.common import dq_name

        rabbitmq_url()
        redis_socket()
        logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
        logging.getLogger("pika").setLevel(logging.CRITICAL)
        self.directory = request.directory
        self.hook = request.hook
        self.queue = store_queue(request.directory)
        self.delay_queue = dq_name(self.queue)
        self.producer = make_rabbitmq_broker(self.queue)
        self.workers: dict[str, LabWorker] = {}

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        # A job a consumer holds is in no reading: its confirmed enqueue is remembered.
        held = set(read(self.directory).jobs) | set(submitted(self.directory, CONFIRMED_FILE))
        return enqueue_each(
            jobs, held, self.queue, self.directory, self._enqueue_confirmed, self.hook
        )

    def _enqueue_confirmed(self, message: Any) -> None:
        self.producer.enqueue(message)
        key = str(message.args[0])
        record_submitted(self.directory, key, message_id(self.queue, key), CONFIRMED_FILE)

    def _worker(self, worker_id: str) -> LabWorker:
        if worker_id not in self.workers:
            broker = make_rabbitmq_broker(self.queue)
            self.workers[worker_id] = lab_worker(broker, self.queue, self.delay_queue)
        return self.workers[worker_id]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        worker = self._worker(worker_id)
        move_due(worker, self.queue, self.hook)
        flushed(worker.delayed)
        message = around(self.hook, "fetch", partial(delivered, worker.consumer))
        return None if message is None else claim_of(worker_id, worker, message)

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("dramatiq", "heartbeat")

    def _settled(self, claim: Claim) -> bool:
        """Whether the claim's delivery is over: its consumer's connection closed, so
        RabbitMQ put the message back (or the outcome was reported already)."""
        worker, message = held(claim)
        return not worker.consumer.connection.is_open or message._tag not in (
            worker.consumer.known_tags
        )

    def _reported(self, claim: Claim, report: Any) -> Any:
        worker, _ = held(claim)
        outcome = report()
        flushed(worker.consumer)
        return outcome

    def succeed(self, claim: Claim) -> Verdict:
        if self._settled(claim):
            return Verdict.STALE
        around(self.hook, "finish", partial(self._reported, claim, partial(report_success, claim)))
        return Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        if self._settled(claim):
            return Verdict.STALE
        failed = around(
            self.hook,
            "fail",
            partial(self._reported, claim, partial(report_failure, claim, error)),
        )
        return Verdict.DEAD if failed else Verdict.RETRY

    def recover(self) -> int:
        # RabbitMQ puts a gone consumer's messages back itself, as it sees its connection
        # close: nothing waits for a maintenance.
        return 0

    def job(self, key: str) -> JobView | None:
        found = jobs_of(self.directory).get(key)
        if found is None:
            return None
        state, attempts = found
        return JobView(key, STATUS[state], attempts, state)

    def active_count(self) -> int:
        jobs = jobs_of(self.directory).values()
        return sum(1 for state, _ in jobs if state not in (ACKED, DEAD))

    def close(self) -> None:
        # A consumer closed holding a message: RabbitMQ puts it back, as for a killed one.
        # One whose connection broke already raises as it closes: the others still close.
        import pika.exceptions
        from dramatiq.errors import ConnectionClosed

        for worker in self.workers.values():
            close_rabbitmq_broker(worker.broker)
            for consumer in (worker.consumer, worker.delayed):
                with contextlib.suppress(ConnectionClosed, pika.exceptions.AMQPError):
                    consumer.close()
        self.workers.clear()
        close_rabbitmq_broker(self.producer)


def setup() -> None:
    """The command's broker (``module:callable``) on RabbitMQ: the store's queue on the
    run's node, its actor doing this process's work."""
    import dramatiq

    queue = os.environ[QUEUE_VARIABLE]
    broker = make_rabbitmq_broker(queue)
    actor_on(broker, queue, served_work[-1])
    dramatiq.set_broker(broker)


def declare_queues(directory: Path, url: str) -> None:
    """The store's queue, with its delay and dead-letter queues, durable, as dramatiq
    declares them at its first enqueue or consume, on the node at ``url``."""
    declare(url, store_queue(directory))


def schedule(directory: Path, key: str, due_s: float) -> None:
    """``RabbitmqBroker.enqueue(message, delay=...)`` of the lab's job ``key``, due at
    ``due_s`` (seconds since the epoch): its delay queue, as on Redis."""
    queue = store_queue(directory)
    record_submitted(directory, key, message_id(queue, key))
    broker = make_rabbitmq_broker(queue)
    try:
        delay_ms = max(0, round(due_s * 1000 - time.time() * 1000))
        broker.enqueue(lab_message(queue, scheduled_job(key)), delay=delay_ms)
        record_submitted(directory, key, message_id(queue, key), CONFIRMED_FILE)
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
