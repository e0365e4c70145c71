"""taskiq's client: the lab's calls, made through taskiq's own receiver on taskiq-redis's
stream broker.

A submission is the task's kicker (``kicker().with_task_id(...).with_labels(...).kiq``), the
task id derived from the store's queue and the lab's key. taskiq has no idempotency key: the
adapter kicks a key only when the stream holds no entry of its task id yet (read with the
lab's reader), so an idempotent producer's retry makes no second entry. A claim is what
taskiq's worker does: the next message of ``RedisStreamBroker.listen`` (``XREADGROUP`` for
the broker's consumer, then, from taskiq-redis 1.0.6, ``XAUTOCLAIM`` of entries idle past
``idle_timeout``), parsed as the receiver parses it. A report is ``Receiver.callback`` on
that message: it runs the retry middleware's and the lab's task's code, the task returning
or raising what the lab reported, and then saves the result and acknowledges the entry
(``XACK``: taskiq's default ``when_saved``); a failure with attempts left is re-kicked by
taskiq's ``SimpleRetryMiddleware`` (a new entry, label ``_retries``) before the receiver
acknowledges the old one. With ``when_saved`` the callback writes nothing to Redis before the
task has returned, so running it when the lab reports leaves what the worker leaves.

taskiq has no token, no lease and no heartbeat: a delivered entry stays pending for its
consumer until it is acknowledged, and only ``XAUTOCLAIM`` (1.0.6 on) hands it to another
consumer, once it has been idle ``idle_timeout`` ms on Redis's clock (``promises``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.judges.readers.taskiq import (
    ACKNOWLEDGED,
    FAILED,
    PENDING,
    QUEUE_FILE,
    QUEUED,
    SUCCEEDED,
    read_taskiq_store,
    task_id,
)
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.redisstore import kept_once, unique_suffix
from crashqueuelab.systems.libraries.redisstore import redis_socket as shared_socket
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

T = TypeVar("T")

#: The one task every lab job names.
TASK_NAME = "crashqueuelab.job"
#: taskiq-redis's ``idle_timeout`` here (ms): how long an entry stays pending, unacknowledged,
#: before a consumer's ``XAUTOCLAIM`` hands it out again (taskiq-redis 1.0.6 on; its default
#: is 10 minutes). Longer than any job the lab runs (a live holder's entry is not taken), short
#: enough that a run waits for it.
IDLE_TIMEOUT_MS = 5_000
#: taskiq-redis's ``xread_block`` here (ms): how long one ``XREADGROUP`` waits for a new entry,
#: and so, from 1.0.6 to 1.2.2, how long at most between two ``XAUTOCLAIM`` (1.0.6's
#: default; from 1.2.3 an ``XAUTOCLAIM`` follows only a read that delivered new entries).
XREAD_BLOCK_MS = 2_000
#: How long a claim waits for the broker's next message before it says there is none: an
#: entry kicked before the claim wakes the waiting ``XREADGROUP`` at once.
CLAIM_WAIT_S = 0.1
#: How long a call waits for taskiq (a kick, a completion) before the adapter says so.
CALL_TIMEOUT_S = 30.0
#: Where a job stands (the reader's states), in the lab's words.
STATUS = {
    QUEUED: JobStatus.PENDING,
    PENDING: JobStatus.LEASED,
    SUCCEEDED: JobStatus.SUCCEEDED,
    FAILED: JobStatus.DEAD,
    ACKNOWLEDGED: JobStatus.SUCCEEDED,
}


class JobFailed(Exception):
    """What the lab's task raises inside taskiq's receiver when the lab's work failed."""


@dataclass
class Delivery:
    """One message the broker handed the adapter's consumer, until the lab reports on it."""

    message: Any
    #: The broker whose consumer read it: its acknowledgement goes through that broker's
    #: connections, whichever client the lab reports through.
    broker: Any
    #: Its attempts (the retry middleware's ``max_retries``).
    limit: int
    reported: bool = False


def store_queue(directory: Path) -> str:
    """The store's stream, named in its directory (made on the first open)."""
    kept = kept_once(
        directory / QUEUE_FILE, lambda: {"queue": f"taskiq-lab-{unique_suffix(directory)}"}
    )
    return str(kept["queue"])


def redis_socket() -> str:
    return shared_socket("taskiq")


def quiet_taskiq() -> None:
    """taskiq logs every task and the traceback of every failure: the lab's own logs say
    what happened, and a crash child's stderr is for its errors."""
    for name in ("taskiq", "taskiq_redis"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def reclaims() -> bool:
    """Whether the installed taskiq-redis's stream broker reclaims idle entries (its
    ``idle_timeout``, pull request 82, released in 1.0.6)."""
    from taskiq_redis import RedisStreamBroker

    return "idle_timeout" in inspect.signature(RedisStreamBroker.__init__).parameters


def stream_broker(socket: str, queue: str) -> Any:
    """taskiq-redis's stream broker on the store's stream, as a user writes it: the result
    backend beside it and taskiq's retry middleware; ``idle_timeout`` where the release has
    one; the rest at taskiq-redis's defaults (consumer group ``taskiq``, a consumer named by
    a fresh uuid per broker)."""
    from taskiq.middlewares import SimpleRetryMiddleware
    from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

    url = f"unix://{socket}"
    options: dict[str, Any] = {"xread_block": XREAD_BLOCK_MS}
    if reclaims():
        options["idle_timeout"] = IDLE_TIMEOUT_MS
    broker = RedisStreamBroker(url, queue_name=queue, **options)
    return broker.with_result_backend(RedisAsyncResultBackend(url)).with_middlewares(
        SimpleRetryMiddleware(default_retry_count=1)
    )


async def kick(broker: Any, queue: str, job: JobSpec) -> None:
    """The lab's job through its task's kicker: its attempts are the retry middleware's
    ``max_retries`` (taskiq retries while ``_retries + 1 < max_retries``)."""
    task = broker.find_task(TASK_NAME)
    await (
        task.kicker()
        .with_task_id(task_id(queue, job.key))
        .with_labels(retry_on_error=True, max_retries=job.max_attempts)
        .kiq(job.key, job.job_type, dict(job.payload))
    )


class TaskiqClient(LibraryClient):
    """``QueueClient`` over one taskiq-redis stream, taskiq's receiver on an event loop of
    its own."""

    def __init__(self, request: OpenRequest) -> None:
        socket = redis_socket()
        quiet_taskiq()
        self.hook = request.hook
        self.directory = request.directory
        self.queue = store_queue(request.directory)
        self.outcomes: dict[str, str | None] = {}
        self.waiting: asyncio.Task[Any] | None = None
        self.messages: AsyncIterator[Any] | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = _LoopThread(self.loop)
        try:
            self.broker, self.receiver = self._call(self._open, socket)
        except BaseException:
            self.thread.stop()
            raise

    async def _open(self, socket: str) -> tuple[Any, Any]:
        from taskiq.receiver import Receiver

        outcomes = self.outcomes

        async def lab_job(key: str, job_type: str, payload: dict[str, Any]) -> int:
            failure = outcomes.pop(key)
            if failure is not None:
                raise JobFailed(failure)
            return 0

        broker = stream_broker(socket, self.queue)
        broker.register_task(lab_job, task_name=TASK_NAME)
        # The consumer group exists before the first kick: a group made at "$" would never
        # deliver an entry added before it.
        await broker.startup()
        return broker, Receiver(broker=broker, run_startup=False)

    def _call(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``call(*args)`` on the adapter's event loop, awaited there (the coroutine made
        only now, so that a hook that stops before the call leaves none unawaited)."""

        async def run() -> T:
            return await call(*args)

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return future.result(CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise SystemUnavailable(
                "taskiq", f"taskiq did not answer in {CALL_TIMEOUT_S} s"
            ) from None

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        # One read of the stream per batch: a stream has no index by task id.
        kicked = set(read_taskiq_store(self.directory).jobs)
        for job in jobs:
            if job.key in kicked:
                continue
            around(self.hook, "kiq", partial(self._call, kick, self.broker, self.queue, job))
            kicked.add(job.key)
        return [task_id(self.queue, job.key) for job in jobs]

    async def _next_message(self) -> Any | None:
        """The broker's next message, or None if none came within ``CLAIM_WAIT_S``: the
        wait for it goes on, for the next claim (cancelling it would drop the entries its
        ``XREADGROUP`` read, pending for this consumer)."""
        if self.messages is None:
            self.messages = self.broker.listen()
        if self.waiting is None:
            self.waiting = asyncio.ensure_future(anext(self.messages))
        done, _ = await asyncio.wait({self.waiting}, timeout=CLAIM_WAIT_S)
        if not done:
            return None
        waited, self.waiting = self.waiting, None
        return waited.result()

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        message = around(self.hook, "listen", partial(self._call, self._next_message))
        if message is None:
            return None
        # What the receiver's callback does first with a message.
        parsed = self.broker.formatter.loads(message=message.data)
        key, job_type, payload = parsed.args
        return tokenless_claim(
            job_id=str(parsed.task_id),
            key=str(key),
            job_type=str(job_type),
            payload=dict(payload),
            attempt=int(parsed.labels.get("_retries", 0)) + 1,
            worker_id=worker_id,
            handle=Delivery(message, self.broker, int(parsed.labels.get("max_retries", 1))),
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("taskiq", "heartbeat")

    async def _run(self, key: str, delivery: Delivery, failure: str | None) -> None:
        # With taskiq's default acknowledgement (when_saved) nothing of the callback reaches
        # Redis before the task returned: running it when the lab reports is running it as
        # the worker does, the task's wait aside.
        self.outcomes[key] = failure
        try:
            await self.receiver.callback(delivery.message, raise_err=True)
        finally:
            self.outcomes.pop(key, None)
            if delivery.broker is not self.broker:
                # Read by a client closed since: its pool opened a connection again for
                # the acknowledgement, which nothing else will close.
                await delivery.broker.connection_pool.disconnect()

    def _finish(self, claim: Claim, failure: str | None, point: str) -> bool:
        """Hand the claim's outcome to taskiq's receiver (``Receiver.callback``: the task
        returns or raises, the result is saved, the entry acknowledged); False for a second
        report of one delivery, which reaches nothing of taskiq."""
        delivery: Delivery = claim.handle  # type: ignore[assignment]
        if delivery.reported:
            return False
        delivery.reported = True
        around(self.hook, point, partial(self._call, self._run, claim.key, delivery, failure))
        return True

    def succeed(self, claim: Claim) -> Verdict:
        return Verdict.SUCCEEDED if self._finish(claim, None, "finish") else Verdict.STALE

    def fail(self, claim: Claim, error: str) -> Verdict:
        delivery: Delivery = claim.handle  # type: ignore[assignment]
        retry = claim.attempt < delivery.limit
        if not self._finish(claim, error, "retry" if retry else "fail"):
            return Verdict.STALE
        return Verdict.RETRY if retry else Verdict.DEAD

    def recover(self) -> int:
        # taskiq has no maintenance call: from 1.0.6 an idle entry is reclaimed by the next
        # consumer's XAUTOCLAIM, on Redis's clock.
        return 0

    def job(self, key: str) -> JobView | None:
        # taskiq reports only a result (its result backend); where a task without one
        # stands is read from the stream by the lab's reader.
        found = read_taskiq_store(self.directory).jobs.get(key)
        if found is None:
            return None
        state, attempts = found
        return JobView(key, STATUS[state], attempts, state)

    def active_count(self) -> int:
        jobs = read_taskiq_store(self.directory).jobs.values()
        return sum(1 for state, _ in jobs if state in (QUEUED, PENDING))

    async def _close(self) -> None:
        # The wait for the next message is cancelled, as a stopping worker's is: what its
        # XREADGROUP delivered stays pending for this consumer, as every undecided delivery.
        if self.waiting is not None:
            self.waiting.cancel()
            await asyncio.gather(self.waiting, return_exceptions=True)
        if self.messages is not None:
            await self.messages.aclose()  # type: ignore[attr-defined]
        await self.broker.shutdown()

    def close(self) -> None:
        try:
            self._call(self._close)
        finally:
            self.thread.stop()


class _LoopThread:
    """The adapter's event loop, run in a daemon thread of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        import threading

        self.loop = loop
        self.thread = threading.Thread(target=loop.run_forever, name="taskiq-client", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CALL_TIMEOUT_S)
        self.loop.close()
