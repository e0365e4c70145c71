"""pgqueuer's client: the lab's calls, made through its persistence API.

The adapter drives pgqueuer's ``Queries`` (its documented persistence API, the one its
``QueueManager`` calls) as a worker configured with ``concurrency_limit=1`` and a retry
timer (the heartbeat timeout of 1.x) of ``RETRY_TIMER``: ``enqueue`` with the job's key as
its ``dedupe_key``, ``dequeue`` under one queue manager id per worker and client (a
restarted worker is a new queue manager, as in pgqueuer), ``update_heartbeat`` and
``log_jobs``. A failed attempt with attempts left is retried as the release retries: from
1.0 in the database (``retry_job``, what ``DatabaseRetryEntrypointExecutor`` calls), before
1.0 in the worker's process (``RetryWithBackoffEntrypointExecutor``). Each store is a schema
of its own (``search_path``), where ``install`` puts pgqueuer's tables.

The job ids the adapter was given are kept in ``keys.jsonl`` beside the store descriptor
(synced), as a producer keeps the ids it enqueued: pgqueuer's log holds no key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import time
import uuid
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from crashqueuelab.judges.readers.pgqueuer import FINAL, KEYS_FILE
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim
from crashqueuelab.systems.postgres import WAIT_FOR_STANDBYS, server_dsn, store_schema

T = TypeVar("T")
ENTRYPOINT = "crashqueuelab"
CONCURRENCY_LIMIT = 1
#: pgqueuer's retry timer runs on the server's clock, whatever the lab's lease says.
RETRY_TIMER = timedelta(milliseconds=400)
#: Where a job stands (pgqueuer's statuses), in the lab's words.
STATUS = {
    "queued": JobStatus.PENDING,
    "picked": JobStatus.LEASED,
    "successful": JobStatus.SUCCEEDED,
    "exception": JobStatus.DEAD,
    "canceled": JobStatus.DEAD,
    "deleted": JobStatus.DEAD,
}


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


class PgQueuerClient(LibraryClient):
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
        #: Whether the release retries in the database (1.0 on) or in the worker's process.
        self.retries_in_store = hasattr(self.queries, "retry_job")
        #: Each worker's failed job, to run again at its next claim (retries in the process).
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
                # Processes opening one new store at once install it once, the schema too
                # (two sessions' CREATE SCHEMA IF NOT EXISTS at once both find none, and the
                # second fails on the first's row).
                await cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))
                await cursor.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
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

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        return [self._submit(job, None) for job in jobs]

    def schedule(self, job: JobSpec, execute_after: timedelta) -> str:
        """Enqueue ``job`` with pgqueuer's ``execute_after``: no worker picks it before the
        server's clock passed its enqueue time and that delay."""
        return self._submit(job, execute_after)

    def _submit(self, job: JobSpec, execute_after: timedelta | None) -> str:
        from pgqueuer.errors import DuplicateJobError

        known = self._keys().get(job.key)
        if known is not None:
            return known
        payload = json.dumps(
            {
                "key": job.key,
                "job_type": job.job_type,
                "payload": job.payload,
                "max_attempts": job.max_attempts,
            }
        ).encode()

        # Only a scheduled job names execute_after: every other call is the one each release
        # the lab pins takes.
        later = {} if execute_after is None else {"execute_after": execute_after}

        def enqueue() -> str:
            try:
                created = self._run(
                    self.queries.enqueue(ENTRYPOINT, payload, dedupe_key=job.key, **later)
                )
            except DuplicateJobError:
                # Queued or picked under this key already, by a producer that died or lost
                # its answer before it noted the id: pgqueuer says no more than that, and
                # the row it saw may not be on the standbys yet (WAIT_FOR_STANDBYS).
                self._run(self.connection.execute(WAIT_FOR_STANDBYS))
                found = self._run(self._queued_under(job.key))
                if found is None:
                    return job.key  # finished meanwhile: its id is no longer by its key
                _append_synced(self.keys_file, {"key": job.key, "id": found})
                return found
            _append_synced(self.keys_file, {"key": job.key, "id": str(created[0])})
            return str(created[0])

        return around(self.hook, "enqueue", enqueue)

    async def _queued_under(self, key: str) -> str | None:
        """The id of the job queued or picked under ``key`` (the judges' reader finds a
        finished job's key by its id, in the keys file)."""
        cursor = await self.connection.execute(
            "SELECT id FROM pgqueuer WHERE dedupe_key = %s", (key,)
        )
        row = await cursor.fetchone()
        return None if row is None else str(row[0])

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
        return tokenless_claim(
            job_id=str(job.id),
            key=item["key"],
            job_type=item["job_type"],
            payload=item["payload"],
            attempt=attempt,
            worker_id=worker_id,
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
        job, max_attempts = _held(claim)
        if claim.attempt >= max_attempts:
            self._log_job(claim, "exception")
            return Verdict.DEAD
        if self.retries_in_store:
            # Queued again for any worker, its attempts counted. The delay would run on the
            # server's clock (execute_after), which the lab's clock does not move: none.
            retry = partial(self.queries.retry_job, job, timedelta(0), None)
            around(self.hook, "retry_job", lambda: self._run(retry()))
            return Verdict.RETRY
        # Before 1.0 the job stays picked and this worker's next claim runs it again. Should
        # the worker die first, the retry timer hands it to another.
        self.retrying[claim.worker_id] = claim
        return Verdict.RETRY

    def recover(self) -> int:
        # The retry timer runs on the server's clock: a stale pick is offered again only
        # once that much real time has passed since its last heartbeat.
        time.sleep(RETRY_TIMER.total_seconds())
        return 0

    def job(self, key: str) -> JobView | None:
        job_id = self._keys().get(key)
        if job_id is None:
            return None
        statuses = self._log(job_id)
        if not statuses:
            return None
        state = _state(statuses)
        if state == "picked" and self.retries_in_store:
            # A retry queues a picked job again: where it stands is its latest log row, as
            # pgqueuer's own job_status reads it.
            [(_, latest)] = self._run(self.queries.job_status([int(job_id)]))
            state = str(latest)
        return JobView(key, STATUS[state], statuses.count("picked"), state)

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
