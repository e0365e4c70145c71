"""PostgresQueue: the SQLite queue's contract on a PostgreSQL server, through psycopg 3.

Every transition is one statement in one short transaction (``statements.py``): the job rows
and their events are written together or not at all, and a holder's operation is fenced by
its worker id, lease token and deadline inside that statement. Times come from the injected
clock, ids from the injected generator, and the hook sees the same phases as the SQLite
queue's (``BEFORE_*`` inside the open transaction, ``AFTER_*`` once COMMIT returned).

A server that restarts, or a session that is terminated, costs a reconnection, never the
worker: the transaction is tried again on a new connection (bounded). A transaction whose
connection broke after its COMMIT was sent (the answer was lost on the way back) is not
simply tried again: the queue asks the server, on a new session, whether that transaction
id committed (``pg_xact_status``), and answers what it did; only when the server cannot be
asked in time does it raise ``OutcomeUnknown``. A server that restarted meanwhile cannot
say (it may have handed the id out again), and the transaction is tried again as before:
an acknowledgement whose commit survived the crash then answers stale. Nothing is ever
applied twice. An answer that rests on a commit the client did not see end (found committed,
found by a retry, or a job found under its key) waits until the server's synchronous
standbys hold it: a session ended while its COMMIT waited for them leaves the commit on the
primary alone, and a failover would take it away.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import DeadlockDetected

from crashqueuelab.core.clock import Clock
from crashqueuelab.core.errors import (
    DurabilityUnavailable,
    HistoryUnprotected,
    IdempotencyConflict,
    OutcomeUnknown,
    SchemaMismatch,
    StoreError,
)
from crashqueuelab.core.hooks import Hook, Phase, no_hook
from crashqueuelab.core.ids import IdGenerator
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.submission import PreparedSubmission, prepare_batch
from crashqueuelab.core.validation import MAX_LEASE_US, require_int
from crashqueuelab.postgres import statements
from crashqueuelab.postgres.schema import (
    APPEND_ONLY_TRIGGERS,
    SCHEMA_MARK,
    SCHEMA_NAME,
    create_statements,
)

T = TypeVar("T")

#: How long an operation keeps trying to reach a server that went away (restarting).
RECONNECT_TIMEOUT_S = 60.0
RECONNECT_PAUSE_S = 0.05
#: Deadlocks between batched acknowledgements are retried this often.
MAX_DEADLOCK_RETRIES = 20
#: The server settings a durable queue needs; a server with other values is refused.
DURABLE_SETTINGS = {"fsync": "on", "synchronous_commit": "on"}


@dataclass(frozen=True)
class PgJob:
    """One job row as the queue reads it."""

    job_id: str
    key: str
    job_type: str
    payload_json: str
    state: str
    attempts: int
    max_attempts: int
    available_at_us: int
    lease_worker_id: str | None
    lease_token: str | None
    lease_deadline_us: int | None
    last_error: str | None


@dataclass(frozen=True)
class PgAck:
    job_id: str
    worker_id: str
    lease_token: str


def _job(row: Sequence[Any]) -> PgJob:
    return PgJob(*row)


def while_server_restarts(action: Callable[[], T], what: str) -> T:
    """``action()``, tried again while the server is unreachable (bounded: a server that is
    restarting comes back within seconds; one that does not is an error)."""
    give_up = time.monotonic() + RECONNECT_TIMEOUT_S
    while True:
        try:
            return action()
        except psycopg.OperationalError as error:
            if time.monotonic() >= give_up:
                raise StoreError(what, f"server unreachable: {error}") from None
            time.sleep(RECONNECT_PAUSE_S)


def create_store(dsn: str, schema: str) -> None:
    """Create the store's schema, once, however many processes race to do it."""
    while_server_restarts(lambda: _create_store(dsn, schema), schema)


def _create_store(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        # Serialises creators of the same schema; released with the transaction.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if exists is None:
            for statement in create_statements(schema):
                conn.execute(statement.encode())


class PostgresQueue:
    """A job queue in one schema of a PostgreSQL database, with fenced leases and history."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        clock: Clock,
        ids: IdGenerator,
        retry: RetryPolicy,
        hook: Hook | None = None,
        application_name: str = "crashqueuelab",
        required_settings: Mapping[str, str] = DURABLE_SETTINGS,
        session_settings: Mapping[str, str] | None = None,
    ) -> None:
        if not SCHEMA_NAME.match(schema):
            raise StoreError(schema, "not a queue schema name")
        self.dsn = dsn
        self.schema = schema
        self._clock = clock
        self._ids = ids
        self._retry = retry
        self._hook: Hook = hook if hook is not None else no_hook
        self._application_name = application_name
        self._required = dict(required_settings)
        self._session = "".join(
            f" -c {name}={value}" for name, value in (session_settings or {}).items()
        )
        self._conn: psycopg.Connection[Any] | None = None
        self._reconnect()

    # -- connection ------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        # The DSN's own options (a user's settings) are kept; the store's schema is added.
        given = conninfo_to_dict(self.dsn).get("options") or ""
        conn = psycopg.connect(
            self.dsn,
            autocommit=True,
            application_name=self._application_name[:63],
            options=f"{given}{self._session} -c search_path={self.schema}".strip(),
        )
        try:
            self._check(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse a foreign schema, unprotected history, or a server that may lose commits."""
        mark = conn.execute(
            "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
            (self.schema,),
        ).fetchone()
        if mark is None:
            raise StoreError(self.schema, "no such schema on the server")
        if mark[0] != SCHEMA_MARK:
            raise SchemaMismatch(self.schema, 0, 1, f"schema comment {mark[0]!r}")
        present = {
            row[0]
            for row in conn.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgenabled <> 'D'",
                (f"{self.schema}.events",),
            )
        }
        missing = tuple(name for name in APPEND_ONLY_TRIGGERS if name not in present)
        if missing:
            raise HistoryUnprotected(self.schema, missing)
        for name, wanted in self._required.items():
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            got = str(row[0]) if row else ""
            if got != wanted:
                raise DurabilityUnavailable(self.schema, name, wanted, got)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            return self._reconnect()
        return self._conn

    def _reconnect(self) -> psycopg.Connection[Any]:
        """A new session, waiting (bounded) for a server that is restarting."""
        self._drop()
        return while_server_restarts(self._connect, self.schema)

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _transact(
        self, body: Callable[[psycopg.Connection[Any]], T], before: Phase | None = None
    ) -> T:
        """Run ``body`` in one transaction; the hook's BEFORE phase fires when it changed
        something (a truthy result), inside the transaction."""
        deadlocks = 0
        resumed = False
        while True:
            conn = self._connection()
            xid: tuple[str, str] | None = None
            try:
                with conn.transaction():
                    result = body(conn)
                    if result and resumed:
                        # What it finds may be an earlier try's commit that no synchronous
                        # standby holds yet (its session ended while it waited, or the server
                        # restarted): this COMMIT waits for them before the answer.
                        self._barrier(conn)
                    if result:
                        # Named before COMMIT, so a lost answer can be asked about later.
                        xid = self._xid(conn)
                    if result and before is not None:
                        self._hook(before)
                return result
            except DeadlockDetected:
                deadlocks += 1
                if deadlocks > MAX_DEADLOCK_RETRIES:
                    raise
            except psycopg.OperationalError:
                # The session or the server went away. Before COMMIT was sent, the server
                # rolls back and the transaction is tried again; after, it may have happened.
                if xid is not None and self._committed(xid):
                    return result
                resumed = resumed or xid is not None
                self._reconnect()

    @staticmethod
    def _xid(conn: psycopg.Connection[Any]) -> tuple[str, str]:
        """The running transaction's id, and when the server that gave it started."""
        row = conn.execute(statements.CURRENT_XID).fetchone()
        assert row is not None
        return str(row[0]), str(row[1])

    def _committed(self, named: tuple[str, str]) -> bool:
        """Whether transaction ``named`` committed, asked on a new session (bounded).

        Only a server that has not restarted since can say: after a crash, an id whose
        commit was not made durable is handed out again, and its status is then another
        transaction's. Across a restart the answer is False, and the transaction is tried
        again: a commit that did survive makes the retry find its work done (an
        acknowledgement then answers stale), so nothing is applied twice. A commit that did
        happen is answered once the synchronous standbys hold it too
        (``_wait_for_replication``)."""
        xid, started = named
        give_up = time.monotonic() + RECONNECT_TIMEOUT_S
        while True:
            try:
                conn = self._reconnect()
                now_started = conn.execute(statements.SERVER_STARTED).fetchone()
                if now_started is None or str(now_started[0]) != started:
                    return False
                row = conn.execute(statements.XACT_STATUS, (xid,)).fetchone()
            except (psycopg.OperationalError, StoreError) as error:
                if time.monotonic() >= give_up:
                    raise OutcomeUnknown(self.schema, f"transaction {xid}: {error}") from None
                continue
            status = row[0] if row else None
            if status == "committed":
                try:
                    self._wait_for_replication(conn)
                except psycopg.OperationalError:
                    continue  # asked again: on a server that failed over, the answer is no
                return True
            if status != "in progress":
                return False
            # Its session has not yet noticed that the client is gone.
            if time.monotonic() >= give_up:
                raise OutcomeUnknown(self.schema, f"transaction {xid} still in progress")
            time.sleep(RECONNECT_PAUSE_S)

    @staticmethod
    def _barrier(conn: psycopg.Connection[Any]) -> None:
        """Make the open transaction's COMMIT wait for the synchronous standbys."""
        conn.execute(statements.REPLICATION_BARRIER)

    def _wait_for_replication(self, conn: psycopg.Connection[Any]) -> None:
        """Return once the server's synchronous standbys hold everything committed so far.

        A commit found committed after its answer was lost may never have reached them: its
        session was ended while it waited for them (PostgreSQL then keeps it "committed
        locally, but might not have been replicated to the standby"), and a failover would
        take it away. A transaction that writes WAL commits after it and waits for the
        standbys as every commit at the server's level does; on a server without synchronous
        standbys it returns at once."""
        with conn.transaction():
            self._barrier(conn)

    def close(self) -> None:
        self._drop()

    # -- producer --------------------------------------------------------------------------

    def submit_many(self, requests: Sequence[Mapping[str, Any]]) -> list[tuple[str, bool]]:
        """(job id, created) per request, all in one transaction; idempotent per key."""
        prepared = prepare_batch(requests)
        now = self._clock.now_us()

        def body(conn: psycopg.Connection[Any]) -> list[tuple[str, bool]]:
            results = [self._submit_one(conn, item, self._ids.job_id(), now) for item in prepared]
            if not all(created for _, created in results):
                # A job found under its key is answered as submitted: its row may be a commit
                # no synchronous standby holds yet (visible once its session ended, or after
                # a restart); this COMMIT waits for them first.
                self._barrier(conn)
            if any(created for _, created in results):
                self._hook(Phase.BEFORE_SUBMIT_COMMIT)
            return results

        results = self._transact(body, before=None)
        if any(created for _, created in results):
            self._hook(Phase.AFTER_SUBMIT_COMMIT)
        return results

    def _submit_one(
        self, conn: psycopg.Connection[Any], item: PreparedSubmission, job_id: str, now: int
    ) -> tuple[str, bool]:
        row = conn.execute(
            statements.SUBMIT,
            {
                "job_id": job_id,
                "key": item.idempotency_key,
                "job_type": item.job_type,
                "payload": item.canonical_payload,
                "sha256": item.payload_sha256,
                "max_attempts": item.max_attempts,
                "now": now,
            },
        ).fetchone()
        if row is not None:
            return str(row[0]), True
        existing = conn.execute(statements.SUBMITTED_AS, (item.idempotency_key,)).fetchone()
        if existing is None:
            raise StoreError(self.schema, f"key {item.idempotency_key!r} conflicted, then vanished")
        differing = tuple(
            name
            for name, same in (
                ("job_type", existing[1] == item.job_type),
                ("payload", existing[2] == item.payload_sha256),
                ("max_attempts", existing[3] == item.max_attempts),
            )
            if not same
        )
        if differing:
            raise IdempotencyConflict(item.idempotency_key, str(existing[0]), differing)
        return str(existing[0]), False

    # -- lease holder ----------------------------------------------------------------------

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[PgJob]:
        """Lease up to ``limit`` ready jobs, oldest first, skipping rows others are claiming."""
        lease = require_int("lease_duration_us", lease_us, minimum=1, maximum=MAX_LEASE_US)
        count = require_int("limit", limit, minimum=1, maximum=1000)
        now = self._clock.now_us()
        arguments = {"now": now, "limit": count, "worker": worker_id, "deadline": now + lease}

        def body(conn: psycopg.Connection[Any]) -> list[PgJob]:
            # Fresh tokens on every try: a try whose COMMIT reached the server before the
            # connection broke has leased its jobs with the tokens it carried.
            tokens = [self._ids.lease_token() for _ in range(count)]
            return [
                _job(row) for row in conn.execute(statements.CLAIM, arguments | {"tokens": tokens})
            ]

        claimed = self._transact(body, before=Phase.BEFORE_CLAIM_COMMIT)
        if claimed:
            self._hook(Phase.AFTER_CLAIM_COMMIT)
        return claimed

    def heartbeat(self, ack: PgAck, lease_us: int) -> bool:
        lease = require_int("lease_duration_us", lease_us, minimum=1, maximum=MAX_LEASE_US)
        now = self._clock.now_us()
        arguments = {
            "job_id": ack.job_id,
            "worker": ack.worker_id,
            "token": ack.lease_token,
            "now": now,
            "deadline": now + lease,
        }

        def body(conn: psycopg.Connection[Any]) -> bool:
            return conn.execute(statements.HEARTBEAT, arguments).fetchone() is not None

        extended = self._transact(body, before=Phase.BEFORE_HEARTBEAT_COMMIT)
        if extended:
            self._hook(Phase.AFTER_HEARTBEAT_COMMIT)
        return extended

    def succeed_many(self, acks: Sequence[PgAck]) -> list[bool]:
        """Acknowledge each claim on its own lease; True where it was the live holder."""
        now = self._clock.now_us()
        arguments = {
            "job_ids": [ack.job_id for ack in acks],
            "workers": [ack.worker_id for ack in acks],
            "tokens": [ack.lease_token for ack in acks],
            "now": now,
        }

        def body(conn: psycopg.Connection[Any]) -> set[PgAck]:
            return self._acknowledged(conn, arguments)

        done = self._transact(body, before=Phase.BEFORE_SUCCESS_COMMIT)
        if done:
            self._hook(Phase.AFTER_SUCCESS_COMMIT)
        # Each item is answered by its own lease: a batch may name one job under an old and
        # under its live lease, and only the live one was accepted. An item repeated within
        # the batch is accepted once.
        answered: set[PgAck] = set()
        results = []
        for ack in acks:
            results.append(ack in done and ack not in answered)
            answered.add(ack)
        return results

    def _acknowledged(
        self, conn: psycopg.Connection[Any], arguments: Mapping[str, Any]
    ) -> set[PgAck]:
        """The acknowledgements the fenced statement applied (each on its live lease)."""
        return {PgAck(*row) for row in conn.execute(statements.SUCCEED, arguments)}

    def fail(self, ack: PgAck, error: str) -> str | None:
        """The job's new state (RETRY_SCHEDULED or DEAD), or None when the claim is stale."""
        arguments = {
            "job_id": ack.job_id,
            "worker": ack.worker_id,
            "token": ack.lease_token,
            "now": self._clock.now_us(),
            "error": error,
            "base": self._retry.base_delay_us,
            "max": self._retry.max_delay_us,
        }

        def body(conn: psycopg.Connection[Any]) -> str | None:
            row = conn.execute(statements.FAIL, arguments).fetchone()
            return None if row is None else str(row[0])

        state = self._transact(body, before=Phase.BEFORE_FAILURE_COMMIT)
        if state is not None:
            self._hook(Phase.AFTER_FAILURE_COMMIT)
        return state

    # -- maintenance -----------------------------------------------------------------------

    def recover_expired(self) -> int:
        return self._maintain(
            statements.RECOVER_EXPIRED, Phase.BEFORE_RECOVERY_COMMIT, Phase.AFTER_RECOVERY_COMMIT
        )

    def promote_retries(self) -> int:
        return self._maintain(
            statements.PROMOTE, Phase.BEFORE_PROMOTION_COMMIT, Phase.AFTER_PROMOTION_COMMIT
        )

    def _maintain(self, statement: bytes, before: Phase, after: Phase) -> int:
        arguments = {
            "now": self._clock.now_us(),
            "base": self._retry.base_delay_us,
            "max": self._retry.max_delay_us,
        }

        def body(conn: psycopg.Connection[Any]) -> int:
            return len(conn.execute(statement, arguments).fetchall())

        moved = self._transact(body, before=before)
        if moved:
            self._hook(after)
        return moved

    # -- reads -----------------------------------------------------------------------------

    def job_by_key(self, key: str) -> PgJob | None:
        def body(conn: psycopg.Connection[Any]) -> PgJob | None:
            row = conn.execute(statements.JOB_BY_KEY, (key,)).fetchone()
            return None if row is None else _job(row)

        return self._transact(body)

    def active_count(self) -> int:
        def body(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(statements.ACTIVE_COUNT).fetchone()
            return int(row[0]) if row else 0

        return self._transact(body)
