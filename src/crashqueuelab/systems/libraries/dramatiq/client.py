"""dramatiq's client on its Redis broker: the lab's calls, made through dramatiq's own broker,
consumer and middleware.

A submission is ``RedisBroker.enqueue`` of a ``Message`` of the actor ``lab_job`` whose
arguments are the lab's key, job type and payload, whose message id is derived from the
store's queue and the key, and whose ``max_retries`` is the job's ``max_attempts`` - 1.
dramatiq has no idempotency key: a job whose message Redis still holds, or whose result it
keeps, is not enqueued again.

Each lab worker is one dramatiq worker process as Redis sees it: a ``RedisBroker`` of its
own (its own broker id, so its own acks set and heartbeat), whose consumer (``consume``,
prefetch 1) a claim asks for the next message, as dramatiq's consumer thread does. Before
that, the claim moves the delayed messages whose time has come from the delay queue to the
queue, as dramatiq's worker does (``handle_delayed_messages``: enqueue a copy, acknowledge
the delayed one); a retry's backoff is 1 ms here, so it is due at once. An outcome is what
dramatiq's worker thread does after the actor ran: the middleware's ``after_process_message``
(``Retries`` enqueues a failed message again with one retry more, or marks it failed past
``max_retries``; ``Results`` stores the result, the attempt that succeeded), then the
consumer's ``ack`` or, for a failed message, ``nack`` (the dead-letter queue).

dramatiq's time is the wall clock: a worker whose heartbeat (any command it sends Redis) is
older than ``heartbeat_timeout`` is dead, and the maintenance that some command runs (one in
a thousand by default) puts its fetched messages back. ``recover`` runs that maintenance
now (a command with a broker whose ``maintenance_chance`` is every command); the lab's clock
moves nothing of dramatiq's (``promises``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.judges.readers.dramatiq import (
    ACKED,
    ACTOR,
    DEAD,
    DELAYED,
    FETCHED,
    NAMESPACE,
    QUEUE_FILE,
    QUEUED,
    SUBMITTED_FILE,
    read_dramatiq_store,
)
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import (
    Claim,
    Hook,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    Verdict,
)
from crashqueuelab.systems.libraries.redisstore import kept_once, record_line, unique_suffix
from crashqueuelab.systems.libraries.redisstore import redis_socket as shared_socket
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

#: The adapter's ``heartbeat_timeout``: how long a worker's silence makes it dead to the
#: maintenance of the others (dramatiq's default is 60 s).
HEARTBEAT_TIMEOUT_MS = 5000
#: dramatiq's maintenance scale: a ``maintenance_chance`` of this many runs it every command.
MAINTENANCE_EVERY_COMMAND = 1_000_000
#: How long dramatiq keeps a result (the reader's only trace of a finished job): a week.
RESULT_TTL_MS = 7 * 24 * 3600 * 1000
#: A retry's backoff: 1 ms, so that a retried job is due at the next claim.
BACKOFF_MS = 1
#: How long a fetch waits on an empty queue before it answers nothing.
IDLE_TIMEOUT_MS = 10
#: Where a job stands (the reader's states), in the lab's words.
STATUS = {
    QUEUED: JobStatus.PENDING,
    DELAYED: JobStatus.PENDING,
    FETCHED: JobStatus.LEASED,
    ACKED: JobStatus.SUCCEEDED,
    DEAD: JobStatus.DEAD,
}


class JobFailed(Exception):
    """What the lab's failed work is to dramatiq's middleware."""


def lab_job(key: str, job_type: str, payload: dict[str, Any]) -> int:
    """The actor every lab job names. Under the adapter it never runs: the lab's worker does
    the work, and reports its outcome to dramatiq's middleware and consumer."""
    raise JobFailed(f"job {key} runs only under crashqueuelab's worker")


def redis_socket() -> str:
    return shared_socket("dramatiq")


def store_queue(directory: Path) -> str:
    """The store's queue name, made on first open."""
    kept = kept_once(directory / QUEUE_FILE, lambda: {"queue": f"lab-{unique_suffix(directory)}"})
    return str(kept["queue"])


def message_id(queue: str, key: str) -> str:
    """The dramatiq message id of the lab's job ``key`` on ``queue``."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"crashqueuelab:{queue}/{key}"))


def make_broker(
    queue: str,
    *,
    maintenance_chance: int | None = None,
    heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
) -> Any:
    """A ``RedisBroker`` on the run's server with ``Retries`` and ``Results``, and the
    actor ``lab_job`` declared on the store's queue."""
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import Retries
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    connection = redis.Redis(unix_socket_path=redis_socket())
    options: dict[str, Any] = {"heartbeat_timeout": heartbeat_timeout_ms}
    if maintenance_chance is not None:
        options["maintenance_chance"] = maintenance_chance
    # Untyped in some releases and typed in others.
    results: Any = Results
    redis_broker: Any = RedisBroker
    broker = redis_broker(
        client=connection,
        middleware=[
            Retries(min_backoff=BACKOFF_MS, max_backoff=BACKOFF_MS),
            results(backend=RedisBackend(client=connection), store_results=True),
        ],
        **options,
    )
    declare_lab_job(broker, queue)
    return broker


def declare_lab_job(broker: Any, queue: str) -> None:
    """The actor ``lab_job`` on the store's queue, its results stored."""
    import dramatiq

    declare = dramatiq.actor(
        actor_name=ACTOR,
        queue_name=queue,
        broker=broker,
        max_retries=0,
        store_results=True,
        result_ttl=RESULT_TTL_MS,
    )
    declare(lab_job)


def record_submitted(
    directory: Path, key: str, identifier: str, file: str = SUBMITTED_FILE
) -> None:
    """Write the job's message id in the store's directory before its message is enqueued:
    once acknowledged, a finished job is found by that id alone (``file``: another record of
    the adapter's, of the same lines)."""
    record_line(directory / file, key, identifier)


def lab_message(queue: str, job: JobSpec) -> Any:
    """The ``Message`` of the actor ``lab_job`` for the lab's job on ``queue``."""
    from dramatiq import Message

    return Message(
        queue_name=queue,
        actor_name=ACTOR,
        args=(job.key, job.job_type, dict(job.payload)),
        kwargs={},
        options={"max_retries": job.max_attempts - 1},
        message_id=message_id(queue, job.key),
        message_timestamp=int(time.time() * 1000),
    )


def enqueue_each(
    jobs: Sequence[JobSpec],
    held: Container[str],
    queue: str,
    directory: Path,
    enqueue: Callable[[Any], Any],
    hook: Any,
) -> list[str]:
    """Each job's message id; its message enqueued (through the hook's point ``enqueue``)
    unless the store already holds the job: dramatiq has no idempotency key, so a producer's
    retry sends nothing the store has. On either broker."""
    identifiers = []
    for job in jobs:
        identifier = message_id(queue, job.key)
        identifiers.append(identifier)
        if job.key in held:
            continue
        record_submitted(directory, job.key, identifier)
        around(hook, "enqueue", partial(enqueue, lab_message(queue, job)))
    return identifiers


def close_broker(broker: Any) -> None:
    """dramatiq's ``close`` (which, for its Redis broker, closes nothing), then the Redis
    connections the broker and its results backend share."""
    broker.close()
    broker.client.connection_pool.disconnect()


@dataclass
class LabWorker:
    """One lab worker as the broker sees it: a broker of its own, its consumer of the
    store's queue and its consumer of the delay queue (prefetch 1 each)."""

    broker: Any
    consumer: Any
    delayed: Any


def lab_worker(broker: Any, queue: str, delay_queue: str) -> LabWorker:
    """A lab worker on ``broker``: its consumers of the queue and of the delay queue (the
    first closed again if the second cannot be made)."""
    consumer = broker.consume(queue, prefetch=1, timeout=IDLE_TIMEOUT_MS)
    try:
        delayed = broker.consume(delay_queue, prefetch=1, timeout=IDLE_TIMEOUT_MS)
    except BaseException:
        consumer.close()
        raise
    return LabWorker(broker, consumer, delayed)


def held(claim: Claim) -> tuple[LabWorker, Any]:
    """The worker and the delivered message a claim of this adapter holds."""
    worker, message = cast(tuple[LabWorker, Any], claim.handle)
    return worker, message


def move_due(worker: LabWorker, queue: str, hook: Hook | None = None) -> None:
    """dramatiq's ``handle_delayed_messages``: each due delayed message is enqueued on its
    queue again (between the hook's ``move`` points) and the delayed one acknowledged."""
    while (delayed := next(worker.delayed)) is not None:
        # dramatiq's worker holds a delayed message until its eta; the adapter's backoff is
        # BACKOFF_MS, so the wait is that at most.
        early_ms = int(delayed.options.get("eta", 0)) - int(time.time() * 1000)
        time.sleep(max(0, min(early_ms, BACKOFF_MS)) / 1000)
        moved = delayed.copy(queue_name=queue)
        moved.options.pop("eta", None)
        around(hook, "move", partial(worker.broker.enqueue, moved))
        worker.delayed.ack(delayed)


def claim_of(worker_id: str, worker: LabWorker, message: Any) -> Claim:
    """The lab's claim of a delivered message of the actor ``lab_job``."""
    key, job_type, payload = message.args
    return tokenless_claim(
        job_id=str(message.message_id),
        key=str(key),
        job_type=str(job_type),
        payload=dict(payload),
        attempt=int(message.options.get("retries", 0)) + 1,
        worker_id=worker_id,
        handle=(worker, message),
    )


def report_success(claim: Claim) -> None:
    """What dramatiq's worker thread does after the actor returned: the middleware's
    ``after_process_message`` (``Results`` stores the attempt), then the consumer's ack."""
    worker, message = held(claim)
    worker.broker.emit_after("process_message", message, result=claim.attempt)
    worker.consumer.ack(message)


def report_failure(claim: Claim, error: str) -> bool:
    """What dramatiq's worker thread does after the actor raised: ``Retries`` enqueues a
    copy with one retry more (acknowledging this delivery), or, past ``max_retries``, marks it
    failed and the consumer nacks it (the dead-letter queue). Whether it was failed."""
    worker, message = held(claim)
    try:
        raise JobFailed(error)
    except JobFailed as raised:
        # Retries reads the traceback of the exception being handled.
        worker.broker.emit_after("process_message", message, exception=raised)
    if message.failed:
        worker.consumer.nack(message)
        worker.broker.emit_after("nack", message)
    else:
        worker.consumer.ack(message)
    return bool(message.failed)


class DramatiqClient(LibraryClient):
    """``QueueClient`` over one dramatiq queue on Redis."""

    def __init__(self, request: OpenRequest) -> None:
        from dramatiq.common import dq_name

        redis_socket()
        # dramatiq logs each retry and each failure: the lab's own logs say what happened.
        logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
        self.directory = request.directory
        self.hook = request.hook
        self.queue = store_queue(request.directory)
        self.delay_queue = dq_name(self.queue)
        self.producer = make_broker(self.queue)
        self.workers: dict[str, LabWorker] = {}

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        held = read_dramatiq_store(self.directory).jobs
        return enqueue_each(
            jobs, held, self.queue, self.directory, self.producer.enqueue, self.hook
        )

    def _worker(self, worker_id: str) -> LabWorker:
        if worker_id not in self.workers:
            broker = make_broker(self.queue)
            self.workers[worker_id] = lab_worker(broker, self.queue, self.delay_queue)
        return self.workers[worker_id]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        worker = self._worker(worker_id)
        move_due(worker, self.queue, self.hook)
        message = around(self.hook, "fetch", partial(next, worker.consumer))
        return None if message is None else claim_of(worker_id, worker, message)

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("dramatiq", "heartbeat")

    def _settled(self, claim: Claim) -> bool:
        """Whether the claim's delivery is over: its message is no longer in its worker's
        acks set (acknowledged, dead-lettered, or put back by the maintenance after the
        worker's heartbeat timeout). dramatiq's worker reports an outcome only for a
        message it holds, so such a report reaches nothing of dramatiq's."""
        worker, message = held(claim)
        acks = f"{NAMESPACE}:__acks__.{worker.broker.broker_id}.{self.queue}"
        return not worker.broker.client.sismember(acks, message.options["redis_message_id"])

    def succeed(self, claim: Claim) -> Verdict:
        if self._settled(claim):
            return Verdict.STALE
        around(self.hook, "finish", partial(report_success, claim))
        return Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        if self._settled(claim):
            return Verdict.STALE
        failed = around(self.hook, "fail", partial(report_failure, claim, error))
        return Verdict.DEAD if failed else Verdict.RETRY

    def recover(self) -> int:
        # dramatiq's maintenance, run now rather than at one command in a thousand.
        queued = f"{NAMESPACE}:{self.queue}"
        before = int(self.producer.client.llen(queued))
        maintenance = make_broker(self.queue, maintenance_chance=MAINTENANCE_EVERY_COMMAND)
        try:
            maintenance.do_qsize(self.queue)
        finally:
            close_broker(maintenance)
        return max(0, int(self.producer.client.llen(queued)) - before)

    def job(self, key: str) -> JobView | None:
        found = read_dramatiq_store(self.directory).jobs.get(key)
        if found is None:
            return None
        state, attempts = found
        return JobView(key, STATUS[state], attempts, state)

    def active_count(self) -> int:
        jobs = read_dramatiq_store(self.directory).jobs.values()
        return sum(1 for state, _ in jobs if state in (QUEUED, DELAYED, FETCHED))

    def close(self) -> None:
        # A worker that goes away holding a message: its acks set waits for maintenance
        # after its heartbeat timeout, as a killed worker's does.
        for worker in self.workers.values():
            close_broker(worker.broker)
        self.workers.clear()
        close_broker(self.producer)
