"""The lease transitions a queue's calls share, and the checks of a lease holder's arguments.

Every transition here runs inside the caller's transaction and never begins or commits
one: the call that opened the transaction (queue.py), or the writer carrying it
(carrying.py), owns the commit. The argument checks raise InvalidInput before any write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from crashqueuelab.core.batches import acknowledge, lease_ready
from crashqueuelab.core.errors import InvalidInput, StoreError
from crashqueuelab.core.fencing import require_live_lease
from crashqueuelab.core.held import HeldLeases
from crashqueuelab.core.history import append_event
from crashqueuelab.core.hooks import Hook, Phase
from crashqueuelab.core.ids import IdGenerator
from crashqueuelab.core.models import (
    Acknowledgement,
    AckResult,
    ClaimedJob,
    EventType,
    Job,
    JobState,
)
from crashqueuelab.core.reads import QueueReads
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.core.rows import decode_job
from crashqueuelab.core.statements import END_LIVE_LEASE
from crashqueuelab.core.submission import MAX_BATCH
from crashqueuelab.core.validation import MAX_LEASE_US, require_int, require_name


def require_lease_arguments(job_id: str, worker_id: str, lease_token: str) -> None:
    require_name("job_id", job_id)
    require_name("worker_id", worker_id)
    require_name("lease_token", lease_token)


def require_batch_claim(worker_id: str, lease_duration_us: int, limit: int) -> tuple[str, int, int]:
    worker = require_name("worker_id", worker_id)
    lease = require_int("lease_duration_us", lease_duration_us, minimum=1, maximum=MAX_LEASE_US)
    return worker, lease, require_int("limit", limit, minimum=1, maximum=MAX_BATCH)


def require_acknowledgements(acknowledgements: Sequence[Acknowledgement]) -> None:
    if not 1 <= len(acknowledgements) <= MAX_BATCH:
        raise InvalidInput("acknowledgements", f"must hold 1 to {MAX_BATCH} items")
    for ack in acknowledgements:
        require_lease_arguments(ack.job_id, ack.worker_id, ack.lease_token)


class LeaseTransitions(QueueReads):
    """Batched claims and acknowledgements, and the end of a live lease: each changed job
    gets its guarded row update and its one event."""

    # Set by DurableQueue.__init__.
    _ids: IdGenerator
    _retry: RetryPolicy
    _hook: Hook
    _held: HeldLeases

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
