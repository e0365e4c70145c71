"""DurableQueue: every transition is one short BEGIN IMMEDIATE transaction.

Each transaction writes the job row and exactly one history event per job it changes
(the events also make the ``attempts`` view), or nothing at all. No transaction ever
contains a handler or an external effect; that is the worker boundary's job.

``DurableQueue`` builds on its read-only views (reads.py), the lease transitions its calls
share (leases.py) and its side of group commit (carrying.py). Submission, the heartbeat and
the single claim stay here: the planted bugs (lab/mutants/sqlite.py) swap this module's
``submit_in_transaction``, ``append_event`` and ``CLAIM_NEXT`` for one call.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core import groupcommit
from crashqueuelab.core.carrying import GroupCommits
from crashqueuelab.core.clock import Clock, SystemClock
from crashqueuelab.core.errors import StoreError
from crashqueuelab.core.fencing import require_live_lease
from crashqueuelab.core.held import HeldLeases
from crashqueuelab.core.history import append_event
from crashqueuelab.core.hooks import Hook, Phase, no_hook
from crashqueuelab.core.ids import IdGenerator, RandomIds
from crashqueuelab.core.leases import (
    require_acknowledgements,
    require_batch_claim,
    require_lease_arguments,
)
from crashqueuelab.core.models import (
    Acknowledgement,
    AckResult,
    ClaimedJob,
    EventType,
    Job,
    JobState,
    SubmitResult,
)
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.rows import decode_job
from crashqueuelab.core.schema import QUEUE_SCHEMA
from crashqueuelab.core.statements import (
    CLAIM_NEXT,
    END_EXPIRED_LEASE,
    EXTEND_LEASE,
    LEASE_EXPIRED_ERROR,
    PROMOTE,
    SELECT_DUE_RETRIES,
    SELECT_EXPIRED,
)
from crashqueuelab.core.storage import DEFAULT_BUSY_TIMEOUT_MS
from crashqueuelab.core.submission import prepare_batch, submit_in_transaction
from crashqueuelab.core.turns import Carried
from crashqueuelab.core.validation import (
    MAX_LEASE_US,
    require_error_text,
    require_int,
    require_name,
)


def _require_applied(cursor: sqlite3.Cursor, what: str) -> None:
    # The guards repeat what was checked under the same write lock, so a miss here is a bug
    # in this module, never a race; fail loudly and roll back.
    if cursor.rowcount != 1:
        raise StoreError("<transaction>", f"guarded {what} changed {cursor.rowcount} rows")


class DurableQueue(GroupCommits):
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
        worker, lease, count = require_batch_claim(worker_id, lease_duration_us, limit)
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
        require_acknowledgements(acknowledgements)
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
        require_acknowledgements(acknowledgements)
        worker, lease, count = require_batch_claim(worker_id, lease_duration_us, limit)
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
        require_lease_arguments(job_id, worker_id, lease_token)
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
        require_lease_arguments(job_id, worker_id, lease_token)
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
        require_lease_arguments(job_id, worker_id, lease_token)
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
        require_lease_arguments(job_id, worker_id, lease_token)
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

    # -- the single claim (runs inside the caller's transaction) ---------------------------

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
