"""DurableQueue: every transition is one short BEGIN IMMEDIATE transaction.

Each transaction writes the job row and exactly one history event per job it changes
(the events also make the ``attempts`` view), or nothing at all. No transaction ever
contains a handler or an external effect; that is the worker boundary's job.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NoReturn

from crashqueuelab.core import groupcommit
from crashqueuelab.core.batches import acknowledge, lease_ready
from crashqueuelab.core.clock import Clock, SystemClock
from crashqueuelab.core.errors import InvalidInput, JobNotFound, StaleLease, StoreError
from crashqueuelab.core.fencing import require_live_lease
from crashqueuelab.core.handle import DatabaseHandle
from crashqueuelab.core.held import HeldLeases
from crashqueuelab.core.history import append_event
from crashqueuelab.core.hooks import Hook, Phase, no_hook
from crashqueuelab.core.ids import IdGenerator, RandomIds
from crashqueuelab.core.models import (
    Acknowledgement,
    AckResult,
    Attempt,
    ClaimedJob,
    Event,
    EventType,
    Job,
    JobState,
    SubmitResult,
)
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.rows import (
    ATTEMPT_COLUMNS,
    EVENT_COLUMNS,
    JOB_COLUMNS,
    decode_attempt,
    decode_event,
    decode_job,
)
from crashqueuelab.core.schema import ACTIVE_JOBS, QUEUE_SCHEMA
from crashqueuelab.core.statements import (
    CLAIM_NEXT,
    END_EXPIRED_LEASE,
    END_LIVE_LEASE,
    EXTEND_LEASE,
    LEASE_EXPIRED_ERROR,
    PROMOTE,
    SELECT_DUE_RETRIES,
    SELECT_EXPIRED,
    SELECT_JOB,
)
from crashqueuelab.core.storage import DEFAULT_BUSY_TIMEOUT_MS, write_transaction
from crashqueuelab.core.submission import MAX_BATCH, prepare_batch, submit_in_transaction
from crashqueuelab.core.turns import Carried, Served
from crashqueuelab.core.validation import (
    MAX_LEASE_US,
    require_error_text,
    require_int,
    require_name,
)


def _require_lease_arguments(job_id: str, worker_id: str, lease_token: str) -> None:
    require_name("job_id", job_id)
    require_name("worker_id", worker_id)
    require_name("lease_token", lease_token)


def _require_batch_claim(
    worker_id: str, lease_duration_us: int, limit: int
) -> tuple[str, int, int]:
    worker = require_name("worker_id", worker_id)
    lease = require_int("lease_duration_us", lease_duration_us, minimum=1, maximum=MAX_LEASE_US)
    return worker, lease, require_int("limit", limit, minimum=1, maximum=MAX_BATCH)


def _require_acknowledgements(acknowledgements: Sequence[Acknowledgement]) -> None:
    if not 1 <= len(acknowledgements) <= MAX_BATCH:
        raise InvalidInput("acknowledgements", f"must hold 1 to {MAX_BATCH} items")
    for ack in acknowledgements:
        _require_lease_arguments(ack.job_id, ack.worker_id, ack.lease_token)


def _require_applied(cursor: sqlite3.Cursor, what: str) -> None:
    # The guards repeat what was checked under the same write lock, so a miss here is a bug
    # in this module, never a race; fail loudly and roll back.
    if cursor.rowcount != 1:
        raise StoreError("<transaction>", f"guarded {what} changed {cursor.rowcount} rows")


class DurableQueue(DatabaseHandle):
    """A SQLite-WAL job queue with leased, fenced claims and an append-only history."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        retry: RetryPolicy | None = None,
        hook: Hook | None = None,
        create: bool = True,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        group_commit: bool | None = None,
    ) -> None:
        """``group_commit``: whether single claims and acknowledgements may be carried by
        the transaction of the writer ahead in line (groupcommit.py). A carried transition
        fires its ``AFTER_*`` phase in this process but no ``BEFORE_*`` phase, since its
        transaction is another process's; so the default (None) is on without a ``hook``
        and off with one, and every fault point of a hooked queue fires where it is named.
        """
        super().__init__(
            path,
            spec=QUEUE_SCHEMA,
            create=create,
            busy_timeout_ms=busy_timeout_ms,
            what="queue",
        )
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._ids: IdGenerator = ids if ids is not None else RandomIds(self._clock)
        self._retry = retry if retry is not None else RetryPolicy()
        self._hook: Hook = hook if hook is not None else no_hook
        self._held = HeldLeases()
        self._group_commit = hook is None if group_commit is None else group_commit
        self._shared = groupcommit.SharedCommits()

    # -- producer --------------------------------------------------------------------------

    def submit(
        self,
        *,
        idempotency_key: str,
        job_type: str,
        payload: dict[str, Any],
        max_attempts: int = 3,
    ) -> SubmitResult:
        """Create a job, or return the job this idempotency key already names."""
        [result] = self.submit_many(
            [
                {
                    "idempotency_key": idempotency_key,
                    "job_type": job_type,
                    "payload": payload,
                    "max_attempts": max_attempts,
                }
            ]
        )
        return result

    def submit_many(self, requests: Sequence[Mapping[str, Any]]) -> list[SubmitResult]:
        """Submit every request in one transaction: all of them, or (on any error) none.

        Each request is a mapping with ``idempotency_key``, ``job_type``, ``payload`` and
        optionally ``max_attempts``; idempotency applies per item, also between items.
        """
        prepared = prepare_batch(requests)
        conn = self.connection
        now = self._clock.now_us()
        with self._transaction():
            results = [
                submit_in_transaction(conn, item, ids=self._ids, now=now) for item in prepared
            ]
            created = any(result.created for result in results)
            if created:
                self._hook(Phase.BEFORE_SUBMIT_COMMIT)
        if created:
            self._hook(Phase.AFTER_SUBMIT_COMMIT)
        return results

    # -- lease holder ----------------------------------------------------------------------

    def claim(self, *, worker_id: str, lease_duration_us: int) -> ClaimedJob | None:
        """Lease the oldest ready QUEUED job to ``worker_id``, or return None when none is ready."""
        worker = require_name("worker_id", worker_id)
        lease = require_int("lease_duration_us", lease_duration_us, minimum=1, maximum=MAX_LEASE_US)
        now = self._clock.now_us()
        token = self._ids.lease_token()
        served = None
        if self._group_commit:
            entry = self._enter(lambda: groupcommit.claim_request(worker, token, lease, now))
            if isinstance(entry, Carried):
                claimed = groupcommit.decode_claim(entry.result, token)
                if claimed is not None:
                    self._hook(Phase.AFTER_CLAIM_COMMIT)
                return claimed
            served = entry
        with self._transaction(served):
            noted = self._reclaim(served)
            claimed = None if noted is None else self._claim_committed(noted, token)
            self._count_vanished(noted, applied=claimed is not None)
            if claimed is None:
                claimed = self._lease_next(worker, lease, now, token)
                if claimed is None:
                    return None
                self._hook(Phase.BEFORE_CLAIM_COMMIT)
        self._hook(Phase.AFTER_CLAIM_COMMIT)
        return claimed

    def claim_many(self, *, worker_id: str, lease_duration_us: int, limit: int) -> list[ClaimedJob]:
        """Lease up to ``limit`` ready jobs to ``worker_id`` in one transaction.

        Each job gets its own lease token and CLAIMED event (its attempt), exactly as if it
        had been claimed alone; only the commit (and its fsync) is shared.
        """
        worker, lease, count = _require_batch_claim(worker_id, lease_duration_us, limit)
        now = self._clock.now_us()
        with self._transaction():
            claimed = self._lease_batch(worker, lease, count, now)
        self._held.keep(one.job for one in claimed)
        if claimed:
            self._hook(Phase.AFTER_CLAIM_COMMIT)
        return claimed

    def succeed_many(self, acknowledgements: Sequence[Acknowledgement]) -> list[AckResult]:
        """Acknowledge a batch in one transaction; each item is fenced on its own.

        A stale item is reported (``stale_reason``) and writes nothing; the others commit.
        """
        _require_acknowledgements(acknowledgements)
        now = self._clock.now_us()
        with self._transaction():
            results = self._acknowledge_batch(acknowledgements, now)
        if any(result.accepted for result in results):
            self._hook(Phase.AFTER_SUCCESS_COMMIT)
        return results

    def succeed_many_and_claim(
        self,
        acknowledgements: Sequence[Acknowledgement],
        *,
        worker_id: str,
        lease_duration_us: int,
        limit: int,
    ) -> tuple[list[AckResult], list[ClaimedJob]]:
        """Acknowledge a batch and lease ``worker_id``'s next one in a single transaction.

        The same transitions and events as ``succeed_many`` then ``claim_many``, with one
        commit (one fsync, one turn at the write lock) instead of two. Stale items are
        reported as by ``succeed_many``; the claim does not depend on them.
        """
        _require_acknowledgements(acknowledgements)
        worker, lease, count = _require_batch_claim(worker_id, lease_duration_us, limit)
        now = self._clock.now_us()
        with self._transaction():
            results = self._acknowledge_batch(acknowledgements, now)
            claimed = self._lease_batch(worker, lease, count, now)
        self._held.keep(one.job for one in claimed)
        if any(result.accepted for result in results):
            self._hook(Phase.AFTER_SUCCESS_COMMIT)
        if claimed:
            self._hook(Phase.AFTER_CLAIM_COMMIT)
        return results, claimed

    def succeed_and_claim(
        self, *, job_id: str, worker_id: str, lease_token: str, lease_duration_us: int
    ) -> tuple[Job, ClaimedJob | None]:
        """Acknowledge the caller's job and lease its next one in a single transaction.

        The same two transitions as ``succeed`` then ``claim``, with their own events, but one
        commit (one fsync) instead of two. If the acknowledgement is stale nothing is claimed.
        """
        _require_lease_arguments(job_id, worker_id, lease_token)
        lease = require_int("lease_duration_us", lease_duration_us, minimum=1, maximum=MAX_LEASE_US)
        now = self._clock.now_us()
        token = self._ids.lease_token()
        served = None
        if self._group_commit:
            entry = self._enter(
                lambda: groupcommit.chain_request(job_id, worker_id, lease_token, token, lease, now)
            )
            if isinstance(entry, Carried):
                done, claimed = self.get(job_id), groupcommit.decode_claim(entry.result, token)
                self._after_chain(claimed)
                return done, claimed
            served = entry
        with self._transaction(served):
            noted = self._reclaim(served)
            applied = self._committed_by_carrier(noted, job_id, lease_token)
            self._count_vanished(noted, applied=applied)
            if noted is not None and applied:
                done, claimed = self.get(job_id), self._claim_committed(noted, token)
            else:
                done = self._succeed_live_lease(job_id, worker_id, lease_token, now)
                self._hook(Phase.BEFORE_SUCCESS_COMMIT)
                claimed = self._lease_next(worker_id, lease, now, token)
                if claimed is not None:
                    self._hook(Phase.BEFORE_CLAIM_COMMIT)
        self._after_chain(claimed)
        return done, claimed

    def _after_chain(self, claimed: ClaimedJob | None) -> None:
        self._hook(Phase.AFTER_SUCCESS_COMMIT)
        if claimed is not None:
            self._hook(Phase.AFTER_CLAIM_COMMIT)

    def heartbeat(
        self, *, job_id: str, worker_id: str, lease_token: str, lease_duration_us: int
    ) -> ClaimedJob:
        """Extend the caller's live lease to now + ``lease_duration_us``."""
        _require_lease_arguments(job_id, worker_id, lease_token)
        lease = require_int("lease_duration_us", lease_duration_us, minimum=1, maximum=MAX_LEASE_US)
        conn = self.connection
        now = self._clock.now_us()
        deadline = now + lease
        with self._transaction():
            row = conn.execute(
                EXTEND_LEASE, (deadline, now, job_id, worker_id, lease_token, now)
            ).fetchone()
            if row is None:
                self._explain_stale(job_id, worker_id, lease_token, now)
            job = decode_job(row)
            append_event(
                conn,
                job_id=job.job_id,
                event_type=EventType.HEARTBEAT,
                from_state=JobState.LEASED,
                to_state=JobState.LEASED,
                at_us=now,
                attempt=job.attempts,
                worker_id=worker_id,
                lease_token=lease_token,
                lease_deadline_us=deadline,
            )
            self._hook(Phase.BEFORE_HEARTBEAT_COMMIT)
        self._held.refresh(job)
        self._hook(Phase.AFTER_HEARTBEAT_COMMIT)
        return ClaimedJob(
            job=job, lease_token=lease_token, lease_deadline_us=deadline, attempt=job.attempts
        )

    def succeed(self, *, job_id: str, worker_id: str, lease_token: str) -> Job:
        """Acknowledge the caller's attempt: the job becomes SUCCEEDED for good."""
        _require_lease_arguments(job_id, worker_id, lease_token)
        now = self._clock.now_us()
        served = None
        if self._group_commit:
            entry = self._enter(
                lambda: groupcommit.success_request(job_id, worker_id, lease_token, now)
            )
            if isinstance(entry, Carried):
                # SUCCEEDED is final: the row reads as the carrier's commit left it.
                done = self.get(job_id)
                self._hook(Phase.AFTER_SUCCESS_COMMIT)
                return done
            served = entry
        with self._transaction(served):
            noted = self._reclaim(served)
            applied = self._committed_by_carrier(noted, job_id, lease_token)
            self._count_vanished(noted, applied=applied)
            if applied:
                done = self.get(job_id)
            else:
                done = self._succeed_live_lease(job_id, worker_id, lease_token, now)
                self._hook(Phase.BEFORE_SUCCESS_COMMIT)
        self._hook(Phase.AFTER_SUCCESS_COMMIT)
        return done

    def fail(self, *, job_id: str, worker_id: str, lease_token: str, error: str) -> Job:
        """Record the caller's attempt as failed: retry later, or DEAD once attempts run out."""
        _require_lease_arguments(job_id, worker_id, lease_token)
        text = require_error_text(error)
        now = self._clock.now_us()
        with self._transaction():
            # The retry time depends on the attempt number, so read the row first; the
            # guarded update below still re-checks the lease under the same write lock.
            job = self.get(job_id)
            require_live_lease(job, worker_id=worker_id, lease_token=lease_token, now_us=now)
            to_state, available = self._after_attempt(job, now)
            done = self._end_live_lease(
                job_id,
                worker_id,
                lease_token,
                now=now,
                to_state=to_state,
                available_at_us=available,
                error=text,
            )
            self._hook(Phase.BEFORE_FAILURE_COMMIT)
        self._hook(Phase.AFTER_FAILURE_COMMIT)
        return done

    # -- maintenance -----------------------------------------------------------------------

    def recover_expired(self) -> list[str]:
        """End every lease whose deadline has passed; return the ids of the jobs it touched."""
        conn = self.connection
        now = self._clock.now_us()
        with self._transaction():
            expired = [decode_job(row) for row in conn.execute(SELECT_EXPIRED, (now,))]
            if not expired:
                return []
            for job in expired:
                to_state, available = self._after_attempt(job, now)
                arguments = (to_state.value, available, LEASE_EXPIRED_ERROR, now, job.submit_seq)
                row = conn.execute(END_EXPIRED_LEASE, (*arguments, job.lease_token, now)).fetchone()
                if row is None:
                    raise StoreError(self.path, f"expired lease of {job.job_id} vanished")
                self._record_lease_end(
                    decode_job(row),
                    worker_id=job.lease_worker_id,
                    lease_token=job.lease_token,
                    event_type=EventType.LEASE_EXPIRED,
                    error=LEASE_EXPIRED_ERROR,
                    now=now,
                )
            self._hook(Phase.BEFORE_RECOVERY_COMMIT)
        self._hook(Phase.AFTER_RECOVERY_COMMIT)
        return [job.job_id for job in expired]

    def promote_retries(self) -> list[str]:
        """Move every RETRY_SCHEDULED job whose retry time has come back to QUEUED."""
        conn = self.connection
        now = self._clock.now_us()
        with self._transaction():
            due = [decode_job(row) for row in conn.execute(SELECT_DUE_RETRIES, (now,))]
            if not due:
                return []
            for job in due:
                _require_applied(conn.execute(PROMOTE, (now, job.submit_seq)), "promotion")
                append_event(
                    conn,
                    job_id=job.job_id,
                    event_type=EventType.PROMOTED,
                    from_state=JobState.RETRY_SCHEDULED,
                    to_state=JobState.QUEUED,
                    at_us=now,
                    attempt=job.attempts,
                    available_at_us=job.available_at_us,
                )
            self._hook(Phase.BEFORE_PROMOTION_COMMIT)
        self._hook(Phase.AFTER_PROMOTION_COMMIT)
        return [job.job_id for job in due]

    # -- group commit ------------------------------------------------------------------------

    def _transaction(
        self, served: Served | None = None
    ) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(
            self.connection,
            timeout_ms=self._timeout_ms,
            turns=self._turns,
            served=served,
            carrier=self._carry,
            shared=self._shared,
        )

    def _enter(self, request: Callable[[], bytes]) -> Served | Carried:
        _ = self.connection  # a closed queue, or one opened in another process, is refused first
        entry = self._turns.enter(request, timeout_s=self._timeout_ms / 1000)
        if isinstance(entry, Carried):
            self._shared.carried_by_others += 1
        return entry

    def _count_vanished(self, noted: bytes | None, *, applied: bool) -> None:
        if noted is None:
            return
        if applied:
            self._shared.carrier_vanished_applied += 1
        else:
            self._shared.carrier_vanished_rerun += 1

    @property
    def shared_commits(self) -> groupcommit.SharedCommits:
        """A copy of the group-commit counts of this handle since it opened."""
        return dataclasses.replace(self._shared)

    def _carry(self, taken: list[tuple[int, bytes]]) -> list[bytes | None]:
        """Run the requests of the writers behind this one, in this transaction.

        After the first one given back, the rest are given back too, unrun: the line can
        then move past exactly the run of carried writers right behind this turn.
        """
        results: list[bytes | None] = []
        for _, request in taken:
            results.append(None if None in results else self._run_carried(request))
        return results

    def _run_carried(self, request: bytes) -> bytes | None:
        """One waiting writer's request, inside a savepoint: its result, or None (and
        nothing written) when it is given back to its writer."""
        decoded = groupcommit.decode_request(request)
        if decoded is None:
            return None
        conn = self.connection
        conn.execute("SAVEPOINT carried")
        try:
            result = self._carried_transitions(decoded)
        except (StaleLease, JobNotFound):
            result = None  # the writer's own call explains it
        if result is None:
            conn.execute("ROLLBACK TO carried")
        conn.execute("RELEASE carried")
        return result

    def _carried_transitions(self, request: groupcommit.Request) -> bytes | None:
        """The transitions of ``request``, as its writer's own call would run them; a
        claimed row too large for the result slot is given back (None)."""
        if isinstance(request, groupcommit.SuccessRequest):
            self._succeed_live_lease(
                request.job_id, request.worker_id, request.lease_token, request.now_us
            )
            return groupcommit.APPLIED
        if isinstance(request, groupcommit.ChainRequest):
            self._succeed_live_lease(
                request.job_id, request.worker_id, request.lease_token, request.now_us
            )
            token = request.next_token
        else:
            token = request.lease_token
        claimed = self._lease_next(request.worker_id, request.lease_us, request.now_us, token)
        return groupcommit.encode_claim(claimed)

    def _reclaim(self, served: Served | None) -> bytes | None:
        """What a vanished carrier noted for this writer's request (None: no carrier took
        it). Called holding the write lock, so the carrier's transaction has ended."""
        if served is None or not served.taken:
            return None
        return self._turns.reclaim(served.ticket, timeout_s=self._timeout_ms / 1000)

    def _claim_committed(self, noted: bytes, token: str) -> ClaimedJob | None:
        """The claim a vanished carrier noted, if its transaction committed it."""
        claimed = groupcommit.decode_claim(noted, token) if noted else None
        if claimed is None:
            return None
        row = self.connection.execute(
            "SELECT 1 FROM events WHERE job_id = ? AND lease_token = ? AND event_type = ?",
            (claimed.job.job_id, token, EventType.CLAIMED.value),
        ).fetchone()
        return claimed if row is not None else None

    def _committed_by_carrier(self, noted: bytes | None, job_id: str, lease_token: str) -> bool:
        """Whether a vanished carrier committed this writer's acknowledgement: it ran it
        (noted a result: a slot taken and never run reads as empty) and the attempt holding
        ``lease_token`` has ended in success. It ran, so the lease was live then, and that
        success can only be this request's own, never an earlier acknowledgement's."""
        return bool(noted) and self._succeeded_by(job_id, lease_token)

    def _succeeded_by(self, job_id: str, lease_token: str) -> bool:
        """Whether the attempt holding ``lease_token`` already ended in success (as a
        vanished carrier of this acknowledgement may have committed)."""
        row = self.connection.execute(
            "SELECT 1 FROM events WHERE job_id = ? AND lease_token = ? AND event_type = ?",
            (job_id, lease_token, EventType.SUCCEEDED.value),
        ).fetchone()
        return row is not None

    # -- reads -----------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The current state of one job."""
        rows = self._read(SELECT_JOB, (job_id,))
        if not rows:
            raise JobNotFound(job_id)
        return decode_job(rows[0])

    def get_by_key(self, idempotency_key: str) -> Job:
        """The job an idempotency key names (JobNotFound carries the key)."""
        rows = self._read(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = ?", (idempotency_key,)
        )
        if not rows:
            raise JobNotFound(idempotency_key)
        return decode_job(rows[0])

    def history(self, job_id: str) -> list[Event]:
        """Every event of one job, oldest first."""
        self.get(job_id)
        rows = self._read(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? ORDER BY seq", (job_id,)
        )
        return [decode_event(row) for row in rows]

    def attempts(self, job_id: str) -> list[Attempt]:
        """Every attempt of one job, first attempt first."""
        self.get(job_id)
        rows = self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,)
        )
        return [decode_attempt(row) for row in rows]

    def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state listed, zeros included)."""
        result = dict.fromkeys(JobState, 0)
        for state, count in self._read("SELECT state, count(*) FROM jobs GROUP BY state"):
            result[JobState(state)] = int(count)
        return result

    def active_count(self) -> int:
        """Jobs not yet finished (QUEUED, LEASED or RETRY_SCHEDULED), from the live index."""
        return int(self._read(f"SELECT count(*) FROM jobs WHERE {ACTIVE_JOBS}")[0][0])

    # -- transition helpers (run inside the caller's transaction) ----------------------------

    def _lease_next(self, worker: str, lease: int, now: int, token: str) -> ClaimedJob | None:
        conn = self.connection
        deadline = now + lease
        row = conn.execute(CLAIM_NEXT, (worker, token, deadline, now, now)).fetchone()
        if row is None:
            return None
        job = decode_job(row)
        append_event(
            conn,
            job_id=job.job_id,
            event_type=EventType.CLAIMED,
            from_state=JobState.QUEUED,
            to_state=JobState.LEASED,
            at_us=now,
            attempt=job.attempts,
            worker_id=worker,
            lease_token=token,
            lease_deadline_us=deadline,
        )
        return ClaimedJob(
            job=job, lease_token=token, lease_deadline_us=deadline, attempt=job.attempts
        )

    def _lease_batch(self, worker: str, lease: int, count: int, now: int) -> list[ClaimedJob]:
        claimed = lease_ready(
            self.connection, worker_id=worker, lease_us=lease, limit=count, now=now, ids=self._ids
        )
        if claimed:
            self._hook(Phase.BEFORE_CLAIM_COMMIT)
        return claimed

    def _acknowledge_batch(
        self, acknowledgements: Sequence[Acknowledgement], now: int
    ) -> list[AckResult]:
        results = acknowledge(self.connection, acknowledgements, now=now, held=self._held)
        if any(result.accepted for result in results):
            self._hook(Phase.BEFORE_SUCCESS_COMMIT)
        return results

    def _explain_stale(self, job_id: str, worker_id: str, lease_token: str, now: int) -> NoReturn:
        """Raise the StaleLease (or JobNotFound) that explains why a lease guard did not match."""
        job = self.get(job_id)
        require_live_lease(job, worker_id=worker_id, lease_token=lease_token, now_us=now)
        raise StoreError(self.path, f"lease guard of {job_id} failed for no known reason")

    def _after_attempt(self, job: Job, now: int) -> tuple[JobState, int | None]:
        """Where an attempt that did not succeed leads: a later retry, or the dead letter."""
        if job.attempts >= job.max_attempts:
            return JobState.DEAD, None
        return JobState.RETRY_SCHEDULED, now + self._retry.delay_us(job.attempts)

    def _succeed_live_lease(self, job_id: str, worker_id: str, lease_token: str, now: int) -> Job:
        return self._end_live_lease(
            job_id,
            worker_id,
            lease_token,
            now=now,
            to_state=JobState.SUCCEEDED,
            available_at_us=None,
            error=None,
        )

    def _end_live_lease(
        self,
        job_id: str,
        worker_id: str,
        lease_token: str,
        *,
        now: int,
        to_state: JobState,
        available_at_us: int | None,
        error: str | None,
    ) -> Job:
        row = self.connection.execute(
            END_LIVE_LEASE,
            (to_state.value, available_at_us, error, now, job_id, worker_id, lease_token, now),
        ).fetchone()
        if row is None:
            self._explain_stale(job_id, worker_id, lease_token, now)
        return self._record_lease_end(
            decode_job(row),
            worker_id=worker_id,
            lease_token=lease_token,
            event_type=EventType.SUCCEEDED if to_state is JobState.SUCCEEDED else EventType.FAILED,
            error=error,
            now=now,
        )

    def _record_lease_end(
        self,
        job: Job,
        *,
        worker_id: str | None,
        lease_token: str | None,
        event_type: EventType,
        error: str | None,
        now: int,
    ) -> Job:
        """Append the event for a lease that ``job`` (as updated) left; it ends the attempt."""
        append_event(
            self.connection,
            job_id=job.job_id,
            event_type=event_type,
            from_state=JobState.LEASED,
            to_state=job.state,
            at_us=now,
            attempt=job.attempts,
            worker_id=worker_id,
            lease_token=lease_token,
            available_at_us=job.available_at_us,
            error=error,
        )
        return job
