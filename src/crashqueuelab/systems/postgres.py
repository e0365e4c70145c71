"""The PostgreSQL queue as a system under test, and everything the lab knows of its crash
points: the one place where that knowledge lives.

A store is a schema on the server; its directory holds ``store.json`` naming the schema (and
the server, without a password), so the store travels with the run directory as any other
system's does. The server comes from ``CRASHQUEUELAB_POSTGRES_DSN``, which the command line
sets for a run (a throwaway server it started, or ``--dsn``) and every child inherits.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.postgres import DESCRIPTOR_FILE, read_postgres_store
from crashqueuelab.postgres.queue import (
    DURABLE_SETTINGS,
    PgAck,
    PgJob,
    PostgresQueue,
    create_store,
)
from crashqueuelab.postgres.statements import REPLICATION_BARRIER
from crashqueuelab.servers.postgres import DSN_VARIABLE, LEVEL_VARIABLE
from crashqueuelab.systems.contract import (
    Capabilities,
    Claim,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    StoredJob,
    StoreReading,
    System,
    Verdict,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
    id_reused_point,
    open_commit_point,
    reply_lost_point,
)
from crashqueuelab.systems.sqlite import CRASH_POINTS as SQLITE_CRASH_POINTS

_STATUS = {
    "QUEUED": JobStatus.PENDING,
    "RETRY_SCHEDULED": JobStatus.PENDING,
    "LEASED": JobStatus.LEASED,
    "SUCCEEDED": JobStatus.SUCCEEDED,
    "DEAD": JobStatus.DEAD,
}
_FAILED = {"RETRY_SCHEDULED": Verdict.RETRY, "DEAD": Verdict.DEAD}


def _claim(job: PgJob) -> Claim:
    assert job.lease_worker_id is not None
    assert job.lease_token is not None
    return Claim(
        job_id=job.job_id,
        key=job.key,
        job_type=job.job_type,
        payload=json.loads(job.payload_json),
        attempt=job.attempts,
        worker_id=job.lease_worker_id,
        token=job.lease_token,
    )


def _ack(claim: Claim) -> PgAck:
    return PgAck(claim.job_id, claim.worker_id, claim.token)


class PostgresClient:
    """``QueueClient`` over one ``PostgresQueue``."""

    def __init__(self, queue: PostgresQueue) -> None:
        self.queue = queue

    def submit(self, job: JobSpec) -> str:
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        results = self.queue.submit_many(
            [
                {
                    "idempotency_key": job.key,
                    "job_type": job.job_type,
                    "payload": job.payload,
                    "max_attempts": job.max_attempts,
                }
                for job in jobs
            ]
        )
        return [job_id for job_id, _ in results]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claimed = self.claim_many(worker_id, lease_us, 1)
        return claimed[0] if claimed else None

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        return [_claim(job) for job in self.queue.claim_many(worker_id, lease_us, limit)]

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        return self.queue.heartbeat(_ack(claim), lease_us)

    def succeed(self, claim: Claim) -> Verdict:
        return self.succeed_many([claim])[0]

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        accepted = self.queue.succeed_many([_ack(claim) for claim in claims])
        return [Verdict.SUCCEEDED if ok else Verdict.STALE for ok in accepted]

    def fail(self, claim: Claim, error: str) -> Verdict:
        state = self.queue.fail(_ack(claim), error)
        return Verdict.STALE if state is None else _FAILED[state]

    def recover(self) -> int:
        return self.queue.recover_expired() + self.queue.promote_retries()

    def checkpoint(self) -> None:
        # The server checkpoints by itself; no step of the queue's is a crash point here.
        return None

    def job(self, key: str) -> JobView | None:
        found = self.queue.job_by_key(key)
        if found is None:
            return None
        return JobView(key, _STATUS[found.state], found.attempts, found.state)

    def active_count(self) -> int:
        return self.queue.active_count()

    def close(self) -> None:
        self.queue.close()


def _public_server(dsn: str) -> str:
    """The DSN without its password, to write beside the store."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "password"}
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def store_schema(directory: Path, dsn: str) -> str:
    """The schema of the store in ``directory``, naming a new one the first time (atomically:
    racing processes agree on the first name written)."""
    descriptor = directory / DESCRIPTOR_FILE
    if not descriptor.exists():
        directory.mkdir(parents=True, exist_ok=True)
        content = {
            "system": "postgres",
            "schema": f"cql_{secrets.token_hex(8)}",
            "server": _public_server(dsn),
        }
        # A draft of its own for each caller: threads of one process race too.
        draft = directory / f".{DESCRIPTOR_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        with draft.open("w") as handle:
            json.dump(content, handle)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(draft, descriptor)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
        handle_fd = os.open(directory, flags)
        try:
            os.fsync(handle_fd)
        finally:
            os.close(handle_fd)
    return str(json.loads(descriptor.read_text())["schema"])


#: Run, in a transaction of its own, before an answer read from a row that another
#: session's commit made (a job found under its key, a duplicate key refused): a commit that
#: writes WAL, so that at a waiting ``synchronous_commit`` level it returns only once the
#: synchronous standbys hold everything committed before it. That row may be committed on
#: the primary alone: a session ended while its COMMIT waited for the standbys leaves it so
#: ("committed locally, but might not have been replicated"), other sessions see it at
#: once, and a failover takes it away. A read writes no WAL and waits for nothing.
WAIT_FOR_STANDBYS = REPLICATION_BARRIER


def accepted_settings(
    required: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> Mapping[str, str]:
    """``required``, with the level ``LEVEL_VARIABLE`` names where the run names one."""
    level = environ.get(LEVEL_VARIABLE)
    return required if not level else {**required, "synchronous_commit": level}


def server_dsn() -> str:
    dsn = os.environ.get(DSN_VARIABLE)
    if not dsn:
        raise SystemUnavailable(
            "postgres",
            f"no server: the command line starts one (or give --dsn); {DSN_VARIABLE} is unset",
        )
    return dsn


def open_postgres(
    request: OpenRequest,
    *,
    session_settings: Mapping[str, str] | None = None,
    required_settings: Mapping[str, str] = DURABLE_SETTINGS,
    queue_class: type[PostgresQueue] = PostgresQueue,
) -> PostgresClient:
    """The store of ``request.directory`` on the run's server (``session_settings``,
    ``required_settings`` and ``queue_class``: a variant, as the lab's mutants are)."""
    return open_postgres_at(
        server_dsn(),
        request,
        session_settings=session_settings,
        required_settings=accepted_settings(required_settings),
        queue_class=queue_class,
    )


def open_postgres_at(
    dsn: str,
    request: OpenRequest,
    *,
    session_settings: Mapping[str, str] | None = None,
    required_settings: Mapping[str, str] = DURABLE_SETTINGS,
    queue_class: type[PostgresQueue] = PostgresQueue,
) -> PostgresClient:
    """The store of ``request.directory`` on the server ``dsn`` names (a run that moves its
    clients between servers, as a failover does, names it itself)."""
    schema = store_schema(request.directory, dsn)
    create_store(dsn, schema)
    return PostgresClient(
        queue_class(
            dsn,
            schema,
            clock=request.clock,
            ids=request.ids,
            retry=request.retry,
            hook=request.hook,
            application_name=session_name(os.getpid()),
            session_settings=session_settings or {},
            required_settings=required_settings,
        )
    )


def read_store(directory: Path) -> StoreReading:
    """The judges' reading: replay and invariants with their own SQL."""
    reading = read_postgres_store(directory)
    return StoreReading(
        exists=reading.exists,
        jobs={
            key: StoredJob(state, _STATUS[state], attempts, reading.deadlines.get(key))
            for key, (state, attempts) in reading.jobs.items()
        },
        facts={"last_event": reading.last_event},
        ok=reading.ok,
        problems=reading.problems,
        judge=(
            "crashqueuelab.judges.readers.postgres"
            f" (replay + invariants, own SQL; {reading.source})"
        ),
        history=reading.history,
        checks={"replay": reading.replay_ok, "invariants": reading.invariants_ok},
    )


def session_name(pid: int) -> str:
    """The application_name of every session process ``pid`` opens (terminate_sessions finds
    a process's sessions by it)."""
    return f"crashqueuelab:{pid}"


def terminate_sessions(pid: int) -> int:
    """End every session the process ``pid`` has open on the server (pg_terminate_backend)."""
    import psycopg

    with psycopg.connect(server_dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (session_name(pid),),
        ).fetchone()
    return int(row[0]) if row else 0


#: The PostgreSQL queue keeps the SQLite queue's phases, states and events (one statement
#: per transition instead of one BEGIN IMMEDIATE transaction), so a death at each point must
#: leave exactly what it leaves there: the same table holds for both. Each queue transition
#: also has a point where its COMMIT reached the server and the answer was lost on the way
#: back (the child's connection goes through a fault proxy): the queue must ask the server
#: what happened, and the death after it must leave what the transition's AFTER point does.
_COMMITTED = tuple(
    point
    for point in SQLITE_CRASH_POINTS
    # The effect's COMMIT is the ledger's, which no connection to the server carries.
    if point.name.startswith("AFTER_") and point.name != "AFTER_EFFECT_COMMIT"
)
REPLY_LOST_POINTS = tuple(
    CrashPoint(
        reply_lost_point(point.name),
        f"{point.where}, the answer to its COMMIT lost on the way back",
        point.expected,
        unacknowledged=point.unacknowledged,
    )
    for point in _COMMITTED
)
#: The same transitions, with the COMMIT still in progress on the server when the answer
#: is lost (waiting for a synchronous standby the child holds, ``lab.faults.opencommits``):
#: the queue is told "in progress", must wait for the outcome, and the death after it must
#: leave what the transition's AFTER point does. They run on a primary with a synchronous
#: standby of their own (``servers.syncpair``), never on the run's shared server.
OPEN_COMMIT_POINTS = tuple(
    CrashPoint(
        open_commit_point(point.name),
        f"{point.where}, its COMMIT still waiting for a synchronous standby when the answer"
        " was lost",
        point.expected,
        unacknowledged=point.unacknowledged,
    )
    for point in _COMMITTED
)
#: The server crashes as the COMMIT is on its way (not yet durable), starts again and hands
#: the transaction's id to another session, which commits, before the queue asks
#: (``lab.faults.idreuse``): the queue must not take that commit for its own, and the death
#: after the transition must leave what its AFTER point does. Not for a submission: its
#: BEFORE phase comes before the queue names its transaction, so its COMMIT is never asked
#: about. They run one at a time on a server of their own, which each crashes.
ID_REUSED_POINTS = tuple(
    CrashPoint(
        id_reused_point(point.name),
        f"{point.where}, the server crashed as its COMMIT was sent and gave its transaction id"
        " to another session before the queue asked",
        point.expected,
        unacknowledged=point.unacknowledged,
    )
    for point in _COMMITTED
    if point.name != "AFTER_SUBMIT_COMMIT"
)
CRASH_POINTS = SQLITE_CRASH_POINTS + REPLY_LOST_POINTS + OPEN_COMMIT_POINTS + ID_REUSED_POINTS

CAPABILITIES = Capabilities(
    fencing_tokens=True,
    heartbeats=True,
    several_processes=True,
    batching=True,
    single_owner=False,
    checkpoint=False,
)


def postgres_system() -> System:
    """crashqueuelab's PostgreSQL queue on the run's server."""
    import psycopg

    from crashqueuelab import __version__

    return System(
        name="postgres",
        version=f"crashqueuelab {__version__} (psycopg {psycopg.__version__})",
        durability="synchronous_commit=on, fsync=on (checked at open)",
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=open_postgres,
        reader=read_store,
        terminate_sessions=terminate_sessions,
        server="postgres",
    )
