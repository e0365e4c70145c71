"""The SQLite queue's planted bugs: subclasses of ``DurableQueue`` that each break one rule
of the shipped queue (fencing, retries, heartbeats, claims, expiry, backoff, batched
acknowledgements, resubmission, durability). The shipped queue carries no switch for any of
them; ``catalog.py`` opens each as a system of its own and says which evidence must catch it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from crashqueuelab.core import queue as queue_module
from crashqueuelab.core.errors import StaleLease
from crashqueuelab.core.fencing import require_live_lease
from crashqueuelab.core.hooks import Phase
from crashqueuelab.core.models import (
    Acknowledgement,
    AckResult,
    Attempt,
    ClaimedJob,
    Job,
    JobState,
    SubmitResult,
)
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.statements import CLAIM_NEXT
from crashqueuelab.core.submission import submit_in_transaction
from crashqueuelab.lab.mutants.patching import patched


class _OneByOne(DurableQueue):
    """Batched acknowledgements go through ``succeed`` one at a time, so a mutant of the
    single-job path reaches the batched path too."""

    def succeed_many(self, acknowledgements: Sequence[Acknowledgement]) -> list[AckResult]:
        results = []
        for ack in acknowledgements:
            try:
                job = self.succeed(
                    job_id=ack.job_id, worker_id=ack.worker_id, lease_token=ack.lease_token
                )
                results.append(AckResult(ack.job_id, job, None))
            except StaleLease as stale:
                results.append(AckResult(ack.job_id, None, stale.reason.value))
        return results


class NoFencing(_OneByOne):
    """Any acknowledgement of a leased job counts, whoever holds the lease now."""

    def _succeed_live_lease(self, job_id: str, worker_id: str, lease_token: str, now: int) -> Job:
        job = self.get(job_id)
        if job.state is JobState.LEASED and job.lease_worker_id and job.lease_token:
            return super()._succeed_live_lease(job_id, job.lease_worker_id, job.lease_token, now)
        return super()._succeed_live_lease(job_id, worker_id, lease_token, now)


class FenceOffByOne(_OneByOne):
    """An acknowledgement exactly at the deadline is accepted (``>=`` where ``>`` belongs)."""

    def _succeed_live_lease(self, job_id: str, worker_id: str, lease_token: str, now: int) -> Job:
        job = self.get(job_id)
        at_deadline = job.lease_deadline_us == now and job.lease_token == lease_token
        return super()._succeed_live_lease(job_id, worker_id, lease_token, now - at_deadline)


class NoRetries(DurableQueue):
    """The first failed or expired attempt sends the job to the dead letter."""

    def _after_attempt(self, job: Job, now: int) -> tuple[JobState, int | None]:
        return JobState.DEAD, None


class NeverDead(DurableQueue):
    """Attempts never run out: a poison job is retried for ever."""

    def _after_attempt(self, job: Job, now: int) -> tuple[JobState, int | None]:
        return JobState.RETRY_SCHEDULED, now + self._retry.delay_us(job.attempts)


class HeartbeatWithoutEvent(DurableQueue):
    """A heartbeat extends the lease but writes no event: the history misses a transition."""

    def heartbeat(
        self, *, job_id: str, worker_id: str, lease_token: str, lease_duration_us: int
    ) -> ClaimedJob:
        with patched(queue_module, "append_event", lambda *args, **kwargs: None):
            return super().heartbeat(
                job_id=job_id,
                worker_id=worker_id,
                lease_token=lease_token,
                lease_duration_us=lease_duration_us,
            )


class HeartbeatInMemory(DurableQueue):
    """A heartbeat moves the deadline only in the holder's process, which writes it to the
    store when that lease ends there (or its own recovery runs): another process, or this
    one after a restart, still sees the claim's deadline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._extended: dict[tuple[str, str], int] = {}

    def heartbeat(
        self, *, job_id: str, worker_id: str, lease_token: str, lease_duration_us: int
    ) -> ClaimedJob:
        now = self._clock.now_us()
        job = self.get(job_id)
        deadline = self._extended.get((job_id, lease_token), job.lease_deadline_us)
        seen = replace(job, lease_deadline_us=deadline)
        require_live_lease(seen, worker_id=worker_id, lease_token=lease_token, now_us=now)
        self._extended[(job_id, lease_token)] = now + lease_duration_us
        extended = replace(job, lease_deadline_us=now + lease_duration_us)
        self._held.refresh(extended)
        self._hook(Phase.AFTER_HEARTBEAT_COMMIT)
        return ClaimedJob(extended, lease_token, now + lease_duration_us, job.attempts)

    def _write_extension(self, job_id: str, lease_token: str) -> None:
        deadline = self._extended.pop((job_id, lease_token), None)
        if deadline is not None:
            self.connection.execute(
                "UPDATE jobs SET lease_deadline_us = ? WHERE job_id = ? AND lease_token = ?",
                (deadline, job_id, lease_token),
            )

    def _end_live_lease(self, job_id: str, worker_id: str, lease_token: str, **end: Any) -> Job:
        self._write_extension(job_id, lease_token)
        return super()._end_live_lease(job_id, worker_id, lease_token, **end)

    def _acknowledge_batch(
        self, acknowledgements: Sequence[Acknowledgement], now: int
    ) -> list[AckResult]:
        for ack in acknowledgements:
            self._write_extension(ack.job_id, ack.lease_token)
        return super()._acknowledge_batch(acknowledgements, now)

    def recover_expired(self) -> list[str]:
        if self._extended:
            with self._transaction():
                for job_id, lease_token in list(self._extended):
                    self._write_extension(job_id, lease_token)
        return super().recover_expired()


class ChainedStaleAsDone(DurableQueue):
    """The chained acknowledgement takes a refused (stale) acknowledgement for one already
    applied and tells its caller the job succeeded; the plain one still refuses it."""

    def succeed_and_claim(
        self, *, job_id: str, worker_id: str, lease_token: str, lease_duration_us: int
    ) -> tuple[Job, ClaimedJob | None]:
        try:
            return super().succeed_and_claim(
                job_id=job_id,
                worker_id=worker_id,
                lease_token=lease_token,
                lease_duration_us=lease_duration_us,
            )
        except StaleLease:
            return replace(self.get(job_id), state=JobState.SUCCEEDED), None


class CarrierRecoveryTrustsAnyEvent(DurableQueue):
    """When the writer carrying an acknowledgement died, the acknowledgement is judged
    already committed if any event carries its lease token (its own claim does), not only
    its own success: the caller is told the job succeeded while it stays leased, or a
    repeated acknowledgement of an ended lease is told it succeeded."""

    def _committed_by_carrier(self, noted: bytes | None, job_id: str, lease_token: str) -> bool:
        row = self.connection.execute(
            "SELECT 1 FROM events WHERE job_id = ? AND lease_token = ?", (job_id, lease_token)
        ).fetchone()
        return noted is not None and row is not None


class AttemptsLatestDeadlineIsLargest(DurableQueue):
    """The store's own view of attempts reports each lease's deadline as the largest its
    claim and heartbeats ever set, so a heartbeat that shortened the lease is ignored (the
    leases themselves are right: only what the queue says about them is not)."""

    def attempts(self, job_id: str) -> list[Attempt]:
        largest = dict(
            self._read(
                "SELECT attempt, max(lease_deadline_us) FROM events WHERE job_id = ?"
                " AND event_type IN ('CLAIMED', 'HEARTBEAT') GROUP BY attempt",
                (job_id,),
            )
        )
        return [
            replace(one, lease_deadline_us=largest.get(one.attempt, one.lease_deadline_us))
            for one in super().attempts(job_id)
        ]


class ClaimTakesLeasedJobs(DurableQueue):
    """The single-job claim's guard also admits a job whose lease is still live."""

    def _lease_next(self, worker: str, lease: int, now: int, token: str) -> ClaimedJob | None:
        unguarded = CLAIM_NEXT.replace("AND state = 'QUEUED'", "AND state IN ('QUEUED', 'LEASED')")
        with patched(queue_module, "CLAIM_NEXT", unguarded):
            return super()._lease_next(worker, lease, now, token)


class _Expiring(DurableQueue):
    """A queue whose expired leases end somewhere else than a failed attempt's would."""

    #: Where an expired lease sends its job, whatever attempts it has left.
    after_expiry = JobState.RETRY_SCHEDULED
    _expiring = False

    def recover_expired(self) -> list[str]:
        self._expiring = True
        try:
            return super().recover_expired()
        finally:
            self._expiring = False

    def _after_attempt(self, job: Job, now: int) -> tuple[JobState, int | None]:
        if not self._expiring:
            return super()._after_attempt(job, now)
        if self.after_expiry is JobState.DEAD:
            return JobState.DEAD, None
        return JobState.RETRY_SCHEDULED, now + self._retry.delay_us(job.attempts)


class ExpiryWithoutAttempt(_Expiring):
    """An expired lease never uses up an attempt: a job whose every holder dies (a poison
    job that crashes its worker) comes back for ever instead of reaching the dead letter."""


class ExpiryDropsJob(_Expiring):
    """Recovery of an expired lease drops the job (to the dead letter) instead of
    scheduling its retry."""

    after_expiry = JobState.DEAD


class UncappedBackoff(DurableQueue):
    """The retry delay doubles with every attempt and never stops at the policy's cap."""

    def _after_attempt(self, job: Job, now: int) -> tuple[JobState, int | None]:
        if job.attempts >= job.max_attempts:
            return JobState.DEAD, None
        return JobState.RETRY_SCHEDULED, now + self._retry.base_delay_us * 2 ** (job.attempts - 1)


class BatchFencesFirstOnly(DurableQueue):
    """A batched acknowledgement checks the lease of its first item only; the others count
    for whoever holds them now."""

    def succeed_many(self, acknowledgements: Sequence[Acknowledgement]) -> list[AckResult]:
        first, *rest = acknowledgements
        unfenced = [first]
        for ack in rest:
            job = self.get(ack.job_id)
            if job.state is JobState.LEASED and job.lease_worker_id and job.lease_token:
                unfenced.append(Acknowledgement(ack.job_id, job.lease_worker_id, job.lease_token))
            else:
                unfenced.append(ack)
        return super().succeed_many(unfenced)


class GrantTimeFencing(DurableQueue):
    """A batched acknowledgement fences each job its handle claimed as of the moment the
    lease was granted (a time taken at the claim and reused), so a lease that a heartbeat
    shortened since, or one past its deadline, still counts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._granted_at: dict[str, int] = {}

    def claim_many(self, *, worker_id: str, lease_duration_us: int, limit: int) -> list[ClaimedJob]:
        claimed = super().claim_many(
            worker_id=worker_id, lease_duration_us=lease_duration_us, limit=limit
        )
        self._granted_at.update((one.job.job_id, one.job.updated_at_us) for one in claimed)
        return claimed

    def _acknowledge_batch(
        self, acknowledgements: Sequence[Acknowledgement], now: int
    ) -> list[AckResult]:
        results = []
        for ack in acknowledgements:
            granted = self._granted_at.pop(ack.job_id, now)
            results.extend(super()._acknowledge_batch([ack], granted))
        return results


class ResubmissionCreatesJob(DurableQueue):
    """Submitting the key of a finished job creates a new job (the key is only checked
    against unfinished ones), so a retried producer runs finished work again."""

    def submit_many(self, requests: Sequence[Mapping[str, Any]]) -> list[SubmitResult]:
        def fresh_if_finished(conn: Any, item: Any, *, ids: Any, now: int) -> SubmitResult:
            row = conn.execute(
                "SELECT state FROM jobs WHERE idempotency_key = ?", (item.idempotency_key,)
            ).fetchone()
            if row is not None and row[0] in (JobState.SUCCEEDED.value, JobState.DEAD.value):
                item = replace(item, idempotency_key=f"{item.idempotency_key}#again-{now}")
            return submit_in_transaction(conn, item, ids=ids, now=now)

        with patched(queue_module, "submit_in_transaction", fresh_if_finished):
            return super().submit_many(requests)


class SynchronousNormal(DurableQueue):
    """Commits return before the WAL is synced: durable only until the power goes."""

    def __init__(self, path: str | Path, **options: Any) -> None:
        super().__init__(path, **options)
        self.connection.execute("PRAGMA synchronous = NORMAL")
