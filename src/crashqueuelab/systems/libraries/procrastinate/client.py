"""procrastinate's client: the lab's calls, made through its job manager.

The adapter drives procrastinate's ``JobManager`` (``app.job_manager``: the calls its worker
makes, and the ones its documentation gives for stalled jobs) as a worker does: ``defer``
a job of the lab's task, whose arguments hold the job's key, type, payload and
``max_attempts``; ``register_worker`` once per lab worker, ``fetch_job`` under that worker's
id, ``update_heartbeat`` for a heartbeat; ``finish_job`` when the work succeeded; when it
failed, the task's ``RetryStrategy`` decides, as the worker asks it, between ``retry_job``
and ``finish_job`` as failed. Each store is a schema of its own (``search_path``), where
``apply_schema`` puts procrastinate's tables.

``recover`` does what procrastinate documents for a worker that died: a starting worker
prunes the workers whose heartbeat is older than its ``stalled_worker_timeout``
(``prune_stalled_workers``), and the "retry stalled jobs" recipe retries each job that
``get_stalled_jobs`` returns. Heartbeats are on the server's clock, so ``recover`` first
waits ``STALLED_S`` of it out. Pruning first is the order of the scenario a user reported
(procrastinate issue 1518: a job left ``doing`` once its worker's row is pruned); the
campaign's crash points after ``fetch_job`` settle it on the installed release.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from crashqueuelab.judges.readers.procrastinate import attempts_made
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim
from crashqueuelab.systems.postgres import WAIT_FOR_STANDBYS, server_dsn, store_schema

T = TypeVar("T")
TASK = "crashqueuelab"
#: How long without a heartbeat (server clock) makes a worker stalled: the
#: ``stalled_worker_timeout`` and ``seconds_since_heartbeat`` the adapter passes.
STALLED_S = 0.4
#: How often a worker's heartbeat is sent (procrastinate's ``update_heartbeat_interval``):
#: a quarter of the stalled timeout, as procrastinate's defaults (10 s and 30 s) are
#: about a third.
HEARTBEAT_S = 0.1
#: Where a job stands (procrastinate's statuses), in the lab's words.
STATUS = {
    "todo": JobStatus.PENDING,
    "doing": JobStatus.LEASED,
    "succeeded": JobStatus.SUCCEEDED,
    "failed": JobStatus.DEAD,
    "cancelled": JobStatus.DEAD,
    "aborting": JobStatus.LEASED,
    "aborted": JobStatus.DEAD,
}


class JobFailed(Exception):
    """The exception the task's retry strategy is asked about when the lab's work failed."""


def register(app: Any) -> Any:
    """The lab's task on ``app``, by its name (``TASK``), with its job context."""
    return app.task(name=TASK, pass_context=True)(_lab_task)


def install(app: Any, schema: str) -> None:
    """procrastinate's tables in ``schema``, unless they are there."""
    import psycopg

    # Processes opening one new store at once install it once (apply_schema is not
    # idempotent), under a lock of the schema's name; the schema too: two sessions' CREATE
    # SCHEMA IF NOT EXISTS at once both find none, and the second fails on the first's row.
    with psycopg.connect(server_dsn(), autocommit=True) as connection, connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))
        connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        installed = connection.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'procrastinate_jobs'",
            (schema,),
        ).fetchone()
        if installed is None:
            connection.execute(f'SET LOCAL search_path TO "{schema}"')
            connection.execute(app.schema_manager.get_schema().encode())


class ProcrastinateClient(LibraryClient):
    """``QueueClient`` over one procrastinate schema."""

    def __init__(self, request: OpenRequest) -> None:
        import procrastinate

        self.hook = request.hook
        dsn = server_dsn()
        schema = store_schema(request.directory, dsn)
        self.loop = asyncio.new_event_loop()
        connector: Callable[..., Any] = partial(
            procrastinate.PsycopgConnector,
            conninfo=dsn,
            kwargs={"options": f"-c search_path={schema}"},
        )
        self.app = procrastinate.App(connector=connector(min_size=1, max_size=2))
        self.task = register(self.app)
        self.workers: dict[str, int] = {}
        self.beats = _Heartbeats(connector)
        self._run(self.app.open_async())
        try:
            install(self.app, schema)
        except BaseException:
            self.close()
            raise
        self.manager = self.app.job_manager
        fetch = inspect.signature(self.manager.fetch_job).parameters
        self.registers_workers = "worker_id" in fetch

    def _run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def _jobs(self) -> dict[str, Any]:
        jobs = self._run(self.manager.list_jobs_async(task=TASK))
        return {str(job.task_kwargs.get("key")): job for job in jobs}

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        known = self._jobs()
        if any(job.key in known for job in jobs):
            # Found under its key: its row may not be on the standbys yet (WAIT_FOR_STANDBYS).
            self._run(self.app.connector.execute_query_async(WAIT_FOR_STANDBYS.decode()))
        ids = []
        for job in jobs:
            if job.key in known:
                ids.append(str(known[job.key].id))
                continue

            def defer(job: JobSpec = job) -> int:
                deferred = self.task.defer_async(
                    key=job.key,
                    job_type=job.job_type,
                    payload=job.payload,
                    max_attempts=job.max_attempts,
                )
                return int(self._run(deferred))

            ids.append(str(around(self.hook, "defer", defer)))
        return ids

    def _worker(self, worker_id: str) -> int | None:
        if not self.registers_workers:
            return None
        if worker_id not in self.workers:
            self.workers[worker_id] = int(self._run(self.manager.register_worker()))
            self.beats.beat_for(self.workers[worker_id])
        return self.workers[worker_id]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        pk = self._worker(worker_id)
        settings = {} if pk is None else {"worker_id": pk}
        fetch = partial(self.manager.fetch_job, queues=None, **settings)
        job = around(self.hook, "fetch_job", lambda: self._run(fetch()))
        if job is None:
            return None
        arguments: Any = job.task_kwargs
        attempt = int(job.attempts) + 1
        return tokenless_claim(
            job_id=str(job.id),
            key=str(arguments["key"]),
            job_type=str(arguments["job_type"]),
            payload=dict(arguments["payload"]),
            attempt=attempt,
            worker_id=worker_id,
            handle=job,
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        pk = self._worker(claim.worker_id)
        if pk is None:
            return True
        beat = partial(self.manager.update_heartbeat, pk)
        around(self.hook, "update_heartbeat", lambda: self._run(beat()))
        return True

    def _finish(self, claim: Claim, status: str, point: str) -> Verdict | None:
        """``finish_job``; STALE where procrastinate refuses it (the job is no longer todo
        or doing), None where it took it."""
        from procrastinate import exceptions, jobs

        held: Any = claim.handle
        finish = partial(
            self.manager.finish_job, held, status=jobs.Status(status), delete_job=False
        )
        try:
            around(self.hook, point, lambda: self._run(finish()))
        except exceptions.ProcrastinateException:
            return Verdict.STALE
        return None

    def succeed(self, claim: Claim) -> Verdict:
        return self._finish(claim, "succeeded", "finish_job") or Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        from procrastinate import RetryStrategy, exceptions

        job: Any = claim.handle
        # The lab's max_attempts counts every attempt; procrastinate's counts the attempts
        # that ended before the one failing now, and a task of one attempt has no retry
        # strategy at all (max_attempts=0 would mean no limit).
        retries = int(job.task_kwargs["max_attempts"]) - 1
        decision = (
            _retry_decision(RetryStrategy(max_attempts=retries), JobFailed(error), job)
            if retries > 0
            else None
        )
        if decision is None:
            return self._finish(claim, "failed", "finish_job-failed") or Verdict.DEAD
        retry = partial(self.manager.retry_job, job, **decision)
        try:
            around(self.hook, "retry_job", lambda: self._run(retry()))
        except exceptions.ProcrastinateException:
            return Verdict.STALE
        return Verdict.RETRY

    def recover(self) -> int:
        # Heartbeats are on the server's clock: a dead worker is stalled once that much
        # real time has passed since its last one.
        time.sleep(STALLED_S * 1.5)
        if not self.registers_workers:
            # Releases before heartbeats count whole seconds since the job started.
            stalled = self._run(self.manager.get_stalled_jobs(nb_seconds=math.ceil(STALLED_S)))
        else:
            # What a starting worker does first, then the documented recipe.
            self._run(self.manager.prune_stalled_workers(STALLED_S))
            stalled = self._run(self.manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_S))
        moved = 0
        for job in stalled:
            if job.task_name == TASK:
                self._run(self.manager.retry_job(job))
                moved += 1
        return moved

    def job(self, key: str) -> JobView | None:
        job = self._jobs().get(key)
        if job is None:
            return None
        status = str(getattr(job.status, "value", job.status))
        return JobView(
            key, STATUS.get(status, JobStatus.PENDING), attempts_made(status, job.attempts), status
        )

    def active_count(self) -> int:
        return sum(
            1
            for job in self._jobs().values()
            if str(getattr(job.status, "value", job.status)) in ("todo", "doing")
        )

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.beats.stop()
            try:
                for pk in self.workers.values():
                    self._run(self.manager.unregister_worker(pk))
                self.workers.clear()
            finally:
                # Also when the server went away (a failover, a restart): the pool's tasks
                # end with the loop, never later in whatever code collects them.
                self._run(self.app.close_async())
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()


class _Heartbeats(threading.Thread):
    """What procrastinate's worker runs beside its jobs: every ``HEARTBEAT_S`` it sends each
    of its workers' heartbeats (``update_heartbeat``), through a connector of its own, as
    long as the process runs. A process that dies or is stopped sends none, and its workers
    go stale; an error (a server restarting) is skipped until the next beat."""

    def __init__(self, connector: Callable[..., Any]) -> None:
        super().__init__(name="procrastinate-heartbeats", daemon=True)
        self.connector = connector
        self.workers: list[int] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def beat_for(self, pk: int) -> None:
        with self.lock:
            self.workers.append(pk)
        if not self.is_alive():
            self.start()

    def run(self) -> None:
        asyncio.run(self._beat())

    async def _beat(self) -> None:
        import procrastinate

        app = procrastinate.App(connector=self.connector(min_size=1, max_size=1))
        await app.open_async()
        try:
            while not self.stopping.wait(HEARTBEAT_S):
                with self.lock:
                    workers = list(self.workers)
                for pk in workers:
                    try:
                        await app.job_manager.update_heartbeat(pk)
                    except procrastinate.exceptions.ConnectorException:
                        break
        finally:
            await app.close_async()

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(HEARTBEAT_S * 20)


#: The name under which the worker process's work is in its worker's additional context
#: (``worker.serve`` passes it: procrastinate hands each job of a task registered with
#: ``pass_context`` a ``JobContext`` holding what ``run_worker(additional_context=...)`` was
#: given).
WORK = "crashqueuelab_work"


def _lab_task(context: Any, **arguments: Any) -> None:
    """The lab's task. The adapter never runs it (the lab's worker does the work and reports
    it through the job manager); procrastinate's own worker (``worker.serve``) runs it with
    the served process's work in its context, and does that work for the job's key."""
    work = context.additional_context.get(WORK)
    key = str(arguments.get("key"))
    if work is None:
        raise JobFailed(f"the lab's task runs only under crashqueuelab: {key}")
    work(key)


def _retry_decision(strategy: Any, error: BaseException, job: Any) -> dict[str, Any] | None:
    """What the strategy decides, as ``retry_job``'s arguments (None: fail the job)."""
    if hasattr(strategy, "get_retry_decision"):
        decision = strategy.get_retry_decision(exception=error, job=job)
        if decision is None:
            return None
        return {"retry_at": decision.retry_at}
    # Releases before 3.1 ask for a delay instead.
    delay = strategy.get_schedule_in(exception=error, attempts=job.attempts)
    if delay is None:
        return None
    import datetime

    return {"retry_at": datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delay)}
