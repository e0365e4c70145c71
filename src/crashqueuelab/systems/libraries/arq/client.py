"""arq's client: the lab's calls, made through arq's own worker code.

A submission is ``ArqRedis.enqueue_job`` with ``_job_id`` the job's id (derived from the
store's queue and the lab's key: arq's idempotency key, "a job with a particular ID cannot
be enqueued again until its execution has finished", nor, while arq keeps its result (a
week here), after). A claim is what arq's worker does in ``_poll_iteration``: the due job ids of the
queue (``zrangebyscore`` up to now), each handed to ``Worker.start_jobs``, which sets the
job's in-progress key and starts ``Worker.run_job`` in a task of the adapter's event loop;
``run_job`` counts the try, checks ``max_tries`` and calls the lab's job function, which
waits there until the lab reports how the work ended, then returns, raises ``Retry`` or
raises ``JobFailed``, so that arq itself records the result, puts the job back in its queue
or records its failure. The Worker never runs its own poll loop here: the lab's worker
decides when to take a job.

arq has no per-job attempt limit: ``max_tries`` is the function's (``func(...,
max_tries=N)``), so a job with ``max_attempts`` N runs the function ``lab_job_N``. arq has
no token, no lease per claim and no heartbeat: a taken job's in-progress key expires on
Redis's clock ``job_timeout`` + 10 s after it was set, whatever the lab's lease. Its time
is the wall clock (``arq.utils.timestamp_ms``) and Redis's: the lab's clock moves nothing
of arq's (``promises``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.judges.readers.arq import (
    COMPLETE,
    DEFERRED,
    FAILED,
    FUNCTION_PREFIX,
    IN_PROGRESS,
    QUEUE_FILE,
    QUEUED,
    job_id,
    tries_made,
)
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.redisstore import kept_once, unique_suffix
from crashqueuelab.systems.libraries.redisstore import redis_socket as shared_socket
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

T = TypeVar("T")

#: The adapter's ``job_timeout``: the longest arq lets a job run, and (plus arq's 10 s) how
#: long a taken job's in-progress key lives, so how long a job whose worker died waits
#: before arq runs it again.
JOB_TIMEOUT_S = 20
#: arq's margin over the longest job timeout for the in-progress key
#: (``in_progress_timeout_s``).
IN_PROGRESS_MARGIN_S = 10
#: How long arq keeps a finished job's result, and so refuses its id again: a week. Not
#: ``keep_result_forever``: arq 0.28.0's ``finish_failed_job`` then sends ``SET ... PX 0``,
#: which Redis refuses, whenever a job is picked past its ``max_tries`` (arq issues 314 and
#: 531, pull request 532 open): the job's keys are deleted and no result is kept.
KEEP_RESULT_S = 7 * 24 * 3600
#: The most tries a lab job may have (chaos gives its ordinary jobs 1000): one arq function
#: per limit.
MAX_TRIES = 1000
#: How long a call waits for arq (a claim, a completion) before the adapter says so.
CALL_TIMEOUT_S = 30.0
#: The key of arq's job context under which the adapter's worker finds its executions, and
#: under which the own worker's work is (``worker.serve``).
EXECUTIONS = "crashqueuelab_executions"
WORK = "crashqueuelab_work"
#: Where a job stands (the reader's states), in the lab's words.
STATUS = {
    QUEUED: JobStatus.PENDING,
    DEFERRED: JobStatus.PENDING,
    IN_PROGRESS: JobStatus.LEASED,
    COMPLETE: JobStatus.SUCCEEDED,
    FAILED: JobStatus.DEAD,
}


class JobFailed(Exception):
    """What the lab's job function raises inside arq's worker when the lab's work failed
    on its last attempt."""


@dataclass
class Execution:
    """One job arq's ``run_job`` is running: its try, and the lab's decision it awaits."""

    entered: asyncio.Future[int]
    decision: asyncio.Future[str | None]
    task: asyncio.Task[Any] | None = None
    retry: bool = False
    #: The job's tries (its function's ``max_tries``).
    limit: int = 0


def _run_blocking(work: Callable[[str], None], key: str) -> Awaitable[None]:
    """``work(key)`` in a daemon thread, awaited: arq tells synchronous jobs to run in an
    executor; a daemon thread, so that the worker process ends when arq's worker does, as
    it would with an async job arq cancelled (a thread cannot be cancelled)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def body() -> None:
        error: BaseException | None = None
        try:
            work(key)
        except BaseException as raised:  # handed to the awaiting job
            error = raised
        with contextlib.suppress(RuntimeError):  # the loop closed: the worker has exited
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=body, name=f"arq-job-{key}", daemon=True).start()
    return done


async def lab_job(ctx: dict[str, Any], key: str, job_type: str, payload: dict[str, Any]) -> int:
    """The coroutine every lab job names. Run by the adapter's worker, it waits for the
    lab's outcome; run by arq's own worker (``worker.serve``), it does the worker process's
    work for ``key``."""
    from arq.worker import Retry

    executions: dict[str, Execution] | None = ctx.get(EXECUTIONS)
    if executions is not None:
        execution = executions[ctx["job_id"]]
        execution.entered.set_result(int(ctx["job_try"]))
        failure = await execution.decision
        if failure is None:
            return 0
        if execution.retry:
            raise Retry()
        raise JobFailed(failure)
    work: Callable[[str], None] | None = ctx.get(WORK)
    if work is None:
        raise JobFailed(f"job {key} runs only under crashqueuelab (its adapter or its worker)")
    await _run_blocking(work, key)
    return 0


def functions() -> list[Any]:
    """arq's functions for the lab's jobs: ``lab_job_N`` runs a job with N tries."""
    from arq.worker import func

    return [
        func(lab_job, name=f"{FUNCTION_PREFIX}{tries}", max_tries=tries)
        for tries in range(1, MAX_TRIES + 1)
    ]


def store_queue(directory: Path) -> str:
    """The store's queue name, named in its directory (made on the first open)."""
    kept = kept_once(
        directory / QUEUE_FILE, lambda: {"queue": f"arq-lab-{unique_suffix(directory)}"}
    )
    return str(kept["queue"])


def redis_socket() -> str:
    return shared_socket("arq")


def quiet_arq() -> None:
    """arq logs every job and the traceback of every failure: the lab's own logs say what
    happened, and a crash child's stderr is for its errors."""
    for name in ("arq", "arq.worker", "arq.connections", "arq.jobs"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def function_for(job: JobSpec) -> str:
    if not 1 <= job.max_attempts <= MAX_TRIES:
        raise OperationUnsupported("arq", f"a job with {job.max_attempts} attempts")
    return f"{FUNCTION_PREFIX}{job.max_attempts}"


class ArqClient(LibraryClient):
    """``QueueClient`` over one arq queue, its worker code on an event loop of its own."""

    def __init__(self, request: OpenRequest) -> None:
        socket = redis_socket()
        quiet_arq()
        self.hook = request.hook
        self.queue = store_queue(request.directory)
        self.executions: dict[str, Execution] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="arq-client", daemon=True)
        self.thread.start()
        try:
            self.pool, self.worker = self._call(self._open, socket)
        except BaseException:
            self._stop_loop()
            raise

    async def _open(self, socket: str) -> tuple[Any, Any]:
        from arq.connections import RedisSettings, create_pool
        from arq.worker import Worker

        pool = await create_pool(
            RedisSettings(unix_socket_path=socket), default_queue_name=self.queue
        )
        worker = Worker(
            functions(),
            queue_name=self.queue,
            redis_pool=pool,
            handle_signals=False,
            max_jobs=1000,
            job_timeout=JOB_TIMEOUT_S,
            keep_result=KEEP_RESULT_S,
            ctx={EXECUTIONS: self.executions},
        )
        return pool, worker

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
            raise SystemUnavailable("arq", f"arq did not answer in {CALL_TIMEOUT_S} s") from None

    def _job_id(self, key: str) -> str:
        return job_id(self.queue, key)

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        for job in jobs:
            function = function_for(job)
            enqueue = partial(
                self.pool.enqueue_job,
                function,
                job.key,
                job.job_type,
                dict(job.payload),
                _job_id=self._job_id(job.key),
                _queue_name=self.queue,
            )
            around(self.hook, "enqueue_job", partial(self._call, enqueue))
        return [self._job_id(job.key) for job in jobs]

    async def _due(self) -> list[bytes]:
        from arq.utils import timestamp_ms

        # What arq's worker reads each poll (``_poll_iteration``).
        ids: list[bytes] = await self.pool.zrangebyscore(
            self.queue, min=float("-inf"), max=timestamp_ms(), start=0, num=100
        )
        return ids

    async def _start(self, raw_id: bytes) -> tuple[Execution, int] | None:
        """``Worker.start_jobs`` for one job, until arq's ``run_job`` called the lab's
        function (its try) or ended the job itself (None: past its tries, expired, or taken
        by another worker)."""
        loop = asyncio.get_running_loop()
        identifier = raw_id.decode()
        execution = Execution(entered=loop.create_future(), decision=loop.create_future())
        self.executions[identifier] = execution
        await self.worker.start_jobs([raw_id])
        task: asyncio.Task[Any] | None = self.worker.tasks.get(identifier)
        if task is None:
            del self.executions[identifier]
            return None
        execution.task = task
        await asyncio.wait({execution.entered, task}, return_when=asyncio.FIRST_COMPLETED)
        if not execution.entered.done():
            del self.executions[identifier]
            self.worker.tasks.pop(identifier, None)
            # What arq's run_job raised is arq's failure, never a job's.
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error
            return None
        return execution, execution.entered.result()

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        for raw_id in self._call(self._due):
            identifier = raw_id.decode()
            if identifier in self.executions:
                continue
            started = around(self.hook, "start_job", partial(self._call, self._start, raw_id))
            if started is None:
                continue
            execution, job_try = started
            definition = self._call(self._definition, identifier)
            key, job_type, payload = definition.args
            execution.limit = int(str(definition.function)[len(FUNCTION_PREFIX) :])
            return tokenless_claim(
                job_id=identifier,
                key=str(key),
                job_type=str(job_type),
                payload=dict(payload),
                attempt=job_try,
                worker_id=worker_id,
                handle=execution,
            )
        return None

    async def _definition(self, identifier: str) -> Any:
        from arq.jobs import Job

        return await Job(identifier, self.pool, _queue_name=self.queue).info()

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("arq", "heartbeat")

    async def _decide(self, identifier: str, execution: Execution, failure: str | None) -> bool:
        if execution.decision.done() or execution.task is None or execution.task.done():
            return False
        execution.decision.set_result(failure)
        try:
            # What arq's run_job raises (its finish_job's Redis errors) is arq's failure.
            await execution.task
        finally:
            self.worker.tasks.pop(identifier, None)
        return True

    def _finish(self, claim: Claim, failure: str | None, retry: bool, point: str) -> bool:
        """Hand the claim's outcome to arq's ``run_job``; False when its execution has
        ended already (a first report, or arq's own timeout): arq recorded that outcome,
        and nothing of this report reaches it."""
        execution: Execution = claim.handle  # type: ignore[assignment]
        execution.retry = retry
        decided = around(
            self.hook, point, partial(self._call, self._decide, claim.job_id, execution, failure)
        )
        if self.executions.get(claim.job_id) is execution:
            del self.executions[claim.job_id]
        return decided

    def succeed(self, claim: Claim) -> Verdict:
        return Verdict.SUCCEEDED if self._finish(claim, None, False, "finish") else Verdict.STALE

    def fail(self, claim: Claim, error: str) -> Verdict:
        execution: Execution = claim.handle  # type: ignore[assignment]
        retry = claim.attempt < execution.limit
        if not self._finish(claim, error, retry, "retry" if retry else "fail"):
            return Verdict.STALE
        return Verdict.RETRY if retry else Verdict.DEAD

    def recover(self) -> int:
        # arq has no maintenance call: a dead worker's job comes back when Redis expires
        # its in-progress key, on Redis's clock.
        return 0

    async def _view(self, key: str) -> JobView | None:
        from arq.jobs import Job
        from arq.jobs import JobStatus as ArqStatus

        identifier = self._job_id(key)
        job = Job(identifier, self.pool, _queue_name=self.queue)
        status = await job.status()
        if status == ArqStatus.not_found:
            return None
        if status == ArqStatus.complete:
            result = await job.result_info()
            if result is None:
                return None
            state = COMPLETE if result.success else FAILED
            limit = int(str(result.function)[len(FUNCTION_PREFIX) :])
            tries = tries_made(result.success, int(result.job_try), result.result, limit)
            return JobView(key, STATUS[state], tries, state)
        retry = await self.pool.get(f"arq:retry:{identifier}")
        tries = int(retry) if retry is not None else 0
        state = str(status.value)
        return JobView(key, STATUS.get(state, JobStatus.PENDING), tries, state)

    def job(self, key: str) -> JobView | None:
        return self._call(self._view, key)

    def active_count(self) -> int:
        return int(self._call(self.pool.zcard, self.queue))

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CALL_TIMEOUT_S)
        self.loop.close()

    def close(self) -> None:
        # arq's own shutdown: ``Worker.close`` cancels the jobs still running (arq puts them
        # back in the queue, "to be run again") and closes the pool.
        try:
            self._call(self._close)
        finally:
            self._stop_loop()

    async def _close(self) -> None:
        # arq 0.28.0's Worker.close ends with redis-py's deprecated ``close``, which warns,
        # then calls ``aclose`` (its name since redis-py 5.0.1): this pool answers arq's call
        # with ``aclose`` itself. Not by silencing the warning: ``warnings.catch_warnings``
        # swaps the process's filters, and a campaign closes clients on several threads at
        # once, so one thread's restore let another's warning through (an error under the
        # suite's filters: "recovery raised DeprecationWarning") and left its pool open.
        self.pool.close = self.pool.aclose
        await self.worker.close()
