"""pgqueuer as a system under test, on the run's PostgreSQL server
(``pip install crashqueuelab[pgqueuer]``).

The adapter drives pgqueuer's ``Queries`` (its documented persistence API, the one its
``QueueManager`` calls) as a worker configured with ``concurrency_limit=1`` and a retry
timer (the heartbeat timeout of 1.x) of ``RETRY_TIMER``: ``enqueue`` with the job's key as
its ``dedupe_key``, ``dequeue`` under one queue manager id per worker and client (a
restarted worker is a new queue manager, as in pgqueuer), ``update_heartbeat`` and
``log_jobs``. Each store is a schema of its own (``search_path``), where ``install`` puts
pgqueuer's tables.

What pgqueuer does not have, the adapter does not pretend (the system's ``documented``
weaknesses): no token, so a stale holder's completion is accepted; retries happen inside
the worker process (``RetryWithBackoffEntrypointExecutor``), so a failed attempt with
attempts left stays ``picked`` and the same worker's next claim runs it again (the retry
timer hands it to another worker if this one dies first), and the last one is logged as
``exception``; pgqueuer's time is the server's, so ``recover`` waits ``RETRY_TIMER`` out.

The job ids the adapter was given are kept in ``keys.jsonl`` beside the store descriptor
(synced), as a producer keeps the ids it enqueued: pgqueuer's log holds no key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from crashqueuelab.judges.readers.pgqueuer import FINAL, KEYS_FILE, read_pgqueuer_store
from crashqueuelab.systems.boundary import (
    OneAtATime,
    around,
    boundary_point,
    library_capabilities,
    library_reading,
)
from crashqueuelab.systems.contract import (
    Claim,
    Documented,
    JobSpec,
    JobStatus,
    JobView,
    LibraryWorker,
    OpenRequest,
    StoreReading,
    System,
    Verdict,
)
from crashqueuelab.systems.postgres import server_dsn, store_schema

T = TypeVar("T")
DISTRIBUTION = "pgqueuer"
ENTRYPOINT = "crashqueuelab"
CONCURRENCY_LIMIT = 1
#: pgqueuer's retry timer runs on the server's clock, whatever the lab's lease says.
RETRY_TIMER = timedelta(milliseconds=400)
_STATUS = {
    "queued": JobStatus.PENDING,
    "picked": JobStatus.LEASED,
    "successful": JobStatus.SUCCEEDED,
    "exception": JobStatus.DEAD,
    "canceled": JobStatus.DEAD,
    "deleted": JobStatus.DEAD,
}
_DOCS = "https://pgqueuer.readthedocs.io/en/latest/"


def _state(statuses: Sequence[str]) -> str:
    """Where a job stands, from every status pgqueuer logged for it."""
    final = [status for status in statuses if status in FINAL]
    if final:
        return final[-1]
    return "picked" if "picked" in statuses else "queued"


def _held(claim: Claim) -> tuple[Any, int]:
    """The pgqueuer job a claim holds, and its ``max_attempts``."""
    held: tuple[Any, int] = claim.handle  # type: ignore[assignment]
    return held[0], int(held[1])


def _append_synced(path: Path, line: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class PgQueuerClient(OneAtATime):
    """``QueueClient`` over one pgqueuer schema."""

    def __init__(self, request: OpenRequest) -> None:
        import psycopg
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import EntrypointExecutionParameter, Queries

        self.hook = request.hook
        dsn = server_dsn()
        schema = store_schema(request.directory, dsn)
        self.keys_file = request.directory / KEYS_FILE
        self.loop = asyncio.new_event_loop()
        self.connection = self._run(
            psycopg.AsyncConnection.connect(
                dsn, autocommit=True, options=f"-c search_path={schema}"
            )
        )
        try:
            self._install(schema, Queries(PsycopgDriver(self.connection)))
        except BaseException:
            self.close()
            raise
        names = {field.name for field in dataclasses.fields(EntrypointExecutionParameter)}
        settings = {"retry_after": RETRY_TIMER, "serialized": False}
        self.parameters = {
            ENTRYPOINT: EntrypointExecutionParameter(
                concurrency_limit=CONCURRENCY_LIMIT,
                **{name: value for name, value in settings.items() if name in names},
            )
        }
        # 1.x passes the retry timer to dequeue as heartbeat_timeout.
        dequeue = inspect.signature(self.queries.dequeue).parameters
        self.dequeue_settings = (
            {"heartbeat_timeout": RETRY_TIMER} if "heartbeat_timeout" in dequeue else {}
        )
        self.managers: dict[str, uuid.UUID] = {}
        #: Each worker's failed job, to run again at its next claim.
        self.retrying: dict[str, Claim] = {}
        #: Jobs a dequeue handed a worker beyond the one its claim returned.
        self.backlog: dict[str, list[Any]] = {}

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def _install(self, schema: str, queries: Any) -> None:
        self.queries = queries

        async def install() -> None:
            async with self.connection.transaction():
                cursor = self.connection.cursor()
                await cursor.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                # Processes opening one new store at once install it once.
                await cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))
                if not await queries.has_table("pgqueuer"):
                    await queries.install()

        self._run(install())

    def _keys(self) -> dict[str, str]:
        if not self.keys_file.is_file():
            return {}
        known = {}
        for line in self.keys_file.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line torn by a crash: its job was never acknowledged
                continue
            known[str(entry["key"])] = str(entry["id"])
        return known

    def _log(self, job_id: str) -> list[str]:
        """The statuses pgqueuer logged for the job (in no promised order)."""
        rows = self._run(self.queries.queue_log())
        return [str(row.status) for row in rows if str(row.job_id) == job_id]

    def submit(self, job: JobSpec) -> str:
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        from pgqueuer.errors import DuplicateJobError

        ids = []
        for job in jobs:
            known = self._keys().get(job.key)
            if known is not None:
                ids.append(known)
                continue
            payload = json.dumps(
                {
                    "key": job.key,
                    "job_type": job.job_type,
                    "payload": job.payload,
                    "max_attempts": job.max_attempts,
                }
            ).encode()

            def enqueue(job: JobSpec = job, payload: bytes = payload) -> str:
                try:
                    created = self._run(
                        self.queries.enqueue(ENTRYPOINT, payload, dedupe_key=job.key)
                    )
                except DuplicateJobError:
                    # Queued or picked under this key already, by a producer that died
                    # before it noted the id: pgqueuer says no more than that.
                    return job.key
                _append_synced(self.keys_file, {"key": job.key, "id": str(created[0])})
                return str(created[0])

            ids.append(around(self.hook, "enqueue", enqueue))
        return ids

    def _manager(self, worker_id: str) -> uuid.UUID:
        return self.managers.setdefault(worker_id, uuid.uuid4())

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        retry = self.retrying.pop(worker_id, None)
        if retry is not None:
            # The worker runs its failed job again, as pgqueuer's retrying executor does,
            # in its own process: the job stays picked by it, its heartbeat sent anew.
            self.heartbeat(retry, lease_us)
            attempt = retry.attempt + 1
            return dataclasses.replace(retry, attempt=attempt, token=f"{retry.job_id}.{attempt}")
        dequeue = partial(
            self.queries.dequeue,
            batch_size=1,
            entrypoints=self.parameters,
            queue_manager_id=self._manager(worker_id),
            global_concurrency_limit=None,
            **self.dequeue_settings,
        )
        backlog = self.backlog.setdefault(worker_id, [])
        if not backlog:
            # One dequeue may return more than batch_size jobs (a queued one and a stale
            # one): the worker holds them all, as pgqueuer's QueueManager runs them all.
            backlog += around(self.hook, "dequeue", lambda: self._run(dequeue()))
        if not backlog:
            return None
        job = backlog.pop(0)
        item = json.loads(bytes(job.payload))
        attempt = self._log(str(job.id)).count("picked")
        return Claim(
            job_id=str(job.id),
            key=item["key"],
            job_type=item["job_type"],
            payload=item["payload"],
            attempt=attempt,
            worker_id=worker_id,
            # No token exists; the job id and attempt name the claim for the lab's logs.
            token=f"{job.id}.{attempt}",
            handle=(job, int(item["max_attempts"])),
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        job, _ = _held(claim)
        around(self.hook, "heartbeat", lambda: self._run(self.queries.update_heartbeat([job.id])))
        return True

    def _log_job(self, claim: Claim, status: str) -> None:
        job, _ = _held(claim)
        log = partial(self.queries.log_jobs, [(job, status, None)])
        around(self.hook, f"log_jobs-{status}", lambda: self._run(log()))

    def succeed(self, claim: Claim) -> Verdict:
        self._log_job(claim, "successful")
        return Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        _, max_attempts = _held(claim)
        if claim.attempt < max_attempts:
            # pgqueuer retries in the worker's process (RetryWithBackoffEntrypointExecutor):
            # the job stays picked, and this worker's next claim runs it again. Should the
            # worker die first, the retry timer hands it to another.
            self.retrying[claim.worker_id] = claim
            return Verdict.RETRY
        self._log_job(claim, "exception")
        return Verdict.DEAD

    def recover(self) -> int:
        # The retry timer runs on the server's clock: a stale pick is offered again only
        # once that much real time has passed since its last heartbeat.
        time.sleep(RETRY_TIMER.total_seconds())
        return 0

    def checkpoint(self) -> None:
        return None

    def job(self, key: str) -> JobView | None:
        job_id = self._keys().get(key)
        if job_id is None:
            return None
        statuses = self._log(job_id)
        if not statuses:
            return None
        state = _state(statuses)
        return JobView(key, _STATUS[state], statuses.count("picked"), state)

    def active_count(self) -> int:
        statistics = self._run(self.queries.queue_size())
        return sum(int(row.count) for row in statistics if row.entrypoint == ENTRYPOINT)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        connection = getattr(self, "connection", None)
        if connection is not None and not connection.closed:
            self._run(connection.close())
        self.loop.close()


def read_store(directory: Path) -> StoreReading:
    """The judges' reading of the schema, without pgqueuer's code."""
    reading = read_pgqueuer_store(directory)
    return library_reading(
        exists=reading.exists,
        jobs=reading.jobs,
        problems=reading.problems,
        statuses=_STATUS,
        judge="crashqueuelab.judges.readers.pgqueuer (reads pgqueuer's tables with its own SQL)",
    )


#: The heartbeat experiment's retry timer (heartbeat timeout in 1.x), and how often an idle
#: worker looks for work without a notification.
LOOP_RETRY_TIMER = timedelta(seconds=1)
LOOP_DEQUEUE_TIMEOUT = timedelta(milliseconds=50)


def run_queue_manager(
    directory: Path,
    worker_id: str,
    work: Callable[[str], None],
    stop: threading.Event,
    retry_after_s: float,
) -> None:
    """pgqueuer's own worker loop on the store in ``directory``: ``QueueManager.run`` as its
    users start it (default batch size, no concurrency limit), with its own heartbeat task
    and buffers, until ``stop`` is set. The retry timer goes where the release takes it (the
    entrypoint's ``retry_timer`` before 1.0, ``run``'s ``heartbeat_timeout`` from 1.0)."""
    import psycopg
    from pgqueuer.applications import PgQueuer
    from pgqueuer.db import PsycopgDriver

    dsn = server_dsn()
    schema = store_schema(directory, dsn)
    timer = timedelta(seconds=retry_after_s)

    async def main() -> None:
        connection = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, options=f"-c search_path={schema}"
        )
        async with connection:
            manager = PgQueuer(PsycopgDriver(connection)).qm
            run_settings: dict[str, Any] = {"dequeue_timeout": LOOP_DEQUEUE_TIMEOUT}
            entrypoint_settings: dict[str, Any] = {}
            if "heartbeat_timeout" in inspect.signature(manager.run).parameters:
                run_settings["heartbeat_timeout"] = timer
            else:
                entrypoint_settings["retry_timer"] = timer

            @manager.entrypoint(ENTRYPOINT, **entrypoint_settings)
            async def handle(job: Any) -> None:
                await asyncio.to_thread(work, json.loads(bytes(job.payload))["key"])

            async def watch() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                manager.shutdown.set()

            watcher = asyncio.ensure_future(watch())
            try:
                await manager.run(**run_settings)
            finally:
                watcher.cancel()

    asyncio.run(main())


LIBRARY_WORKER = LibraryWorker(
    retry_after_s=LOOP_RETRY_TIMER.total_seconds(),
    run=run_queue_manager,
    describe="pgqueuer's QueueManager.run (its dequeue, heartbeat task and buffers) on its"
    " psycopg driver, default batch size, no concurrency limit",
)


_NO_TOKEN = Documented(
    "no token: pgqueuer logs or heartbeats a job by its id, whoever holds it, and log_jobs"
    " answers nothing, so a stale holder's completion or heartbeat is taken as any other",
    _DOCS,
    explains=(
        "probe acknowledgement_at_the_deadline: *was accepted*",
        "probe stale_holder_after_expiry: *was accepted*",
        "probe heartbeat_after_expiry: *was accepted*",
        "probe batched_acknowledgement_fences_each_item: *was accepted*",
        "model workload: *was accepted (at *",
        "model workload: job *: an acknowledgement was accepted, but the store shows it *",
        # Chaos: a paused holder's late completion is taken, beside its successor's.
        "job *: *, stopped past its lease, had its late acknowledgement accepted",
        "job *: acknowledged * times, by *",
    ),
)
_SERVER_CLOCK = Documented(
    "the retry timer runs on the server's clock: a job whose holder has not sent a"
    " heartbeat for that long is handed out again, whatever lease the holder was given,"
    " and a worker takes at most concurrency_limit jobs",
    _DOCS,
    explains=(
        "model workload: job *: claimed by * while *'s lease * was live until *",
        # The first holder, still at work, finished it; the second runs it again.
        "model workload: job *: claimed by * after an accepted acknowledgement (at *",
        "probe heartbeat_survives_restart: *",
        "probe batched_acknowledgement_fences_each_item: *the queue offered nothing",
        "probe batched_acknowledgement_sees_the_lease_as_it_stands: *the queue offered *",
        "job *: two live leases from * at least: *",
        # The heartbeat experiment: a network fault held the holder's heartbeats.
        "job *: run again * while a * held *'s connection *",
    ),
)
_WORKER_RETRIES = Documented(
    "retries happen inside the worker process (RetryWithBackoffEntrypointExecutor): the"
    " store keeps no attempt count, so a job the retry timer hands out again has no limit",
    _DOCS,
    explains=(
        "model workload: job *: handed out as attempt * of *",
        "probe expired_attempts_run_out: *",
        # Chaos: a job that kills its worker each time is handed out for ever.
        "job * (poison): still * after the run, never dead-lettered*",
        "every other job was acknowledged, but the work did not end within * after: jobs are"
        " left that never reach the dead letter*",
    ),
)


_CONNECTION = Documented(
    "a queue manager whose connection to the server breaks (a server restart, a reset, an"
    " answer lost on the way) raises and stops; pgqueuer starts it again only when asked"
    " (pgq run --restart-on-failure, off by default), as the lab's chaos respawns workers",
    _DOCS,
    explains=(
        "* exited with status 3: *before or while processing the request.*",
        "* exited with status 3: *server closed the connection*",
        "* exited with status 3: *the connection is lost*",
        "* exited with status 3: *the connection is closed*",
        "* exited with status 3: *terminating connection due to administrator command*",
    ),
)


_point = partial(boundary_point, "pgqueuer")


_NEW, _PICKED = ("queued", 0), ("picked", 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs, run the
#: effect job (dequeue, heartbeat, work, log it successful); the flaky job's failure with
#: attempts left changes nothing in the store.
CRASH_POINTS = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("dequeue:before", _NEW, _NEW, 0),
    _point("dequeue:after", _PICKED, _NEW, 0),
    _point("heartbeat:before", _PICKED, _NEW, 0),
    _point("heartbeat:after", _PICKED, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", _PICKED, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", _PICKED, _NEW, 1),
    _point("log_jobs-successful:before", _PICKED, _NEW, 1),
    _point("log_jobs-successful:after", ("successful", 1), _NEW, 1),
)

CAPABILITIES = library_capabilities(heartbeats=True)


def pgqueuer_system() -> System:
    """pgqueuer, as installed, on the run's PostgreSQL server."""
    # Imported here, once: the lab opens systems from several threads at a time, and two
    # threads importing pgqueuer at once meet its modules half initialised.
    import pgqueuer.db
    import pgqueuer.errors
    import pgqueuer.queries  # noqa: F401

    return System(
        name="pgqueuer",
        version=f"pgqueuer {version(DISTRIBUTION)}",
        durability="the server's (synchronous_commit=on); concurrency_limit=1, retry timer"
        f" {RETRY_TIMER.total_seconds():g} s",
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=PgQueuerClient,
        reader=read_store,
        server="postgres",
        documented=(_NO_TOKEN, _SERVER_CLOCK, _WORKER_RETRIES, _CONNECTION),
        distribution=DISTRIBUTION,
        library_worker=LIBRARY_WORKER,
    )
