"""The worker boundary: claim, run the handler outside every transaction, then settle.

A handler is a trusted in-process callable registered by job type; nothing executable is
ever read from a database. Whatever happens, the outcome of an attempt is decided in one
place (``Worker._settle``): success, failure (the retry policy picks a retry or the dead
letter), or a stale lease (someone else owns the job now and our word no longer counts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crashqueuelab.core.errors import StaleLease
from crashqueuelab.core.models import ClaimedJob, Job, JobState
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.validation import MAX_ERROR_LENGTH, require_int, require_name


class WorkOutcome(StrEnum):
    """What one turn of the worker loop came to."""

    IDLE = "idle"
    SUCCEEDED = "succeeded"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD = "dead"
    STALE = "stale"


@dataclass(frozen=True)
class WorkResult:
    """The outcome of one claimed job (or of finding nothing to claim)."""

    outcome: WorkOutcome
    job_id: str | None = None
    attempt: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class JobContext:
    """What a handler gets: the claimed job, and a way to extend its lease."""

    claimed: ClaimedJob
    worker_id: str
    heartbeat: Callable[[], ClaimedJob]

    @property
    def job(self) -> Job:
        return self.claimed.job

    @property
    def payload(self) -> dict[str, Any]:
        return self.claimed.job.payload


Handler = Callable[[JobContext], None]

_OUTCOMES = {
    JobState.SUCCEEDED: WorkOutcome.SUCCEEDED,
    JobState.RETRY_SCHEDULED: WorkOutcome.RETRY_SCHEDULED,
    JobState.DEAD: WorkOutcome.DEAD,
}


def describe_error(error: BaseException) -> str:
    """The text recorded for a failed attempt, cut to the store's bound."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 3] + "..."


class Worker:
    """Claims jobs from one queue and runs the registered handler for each."""

    def __init__(
        self,
        queue: DurableQueue,
        *,
        worker_id: str,
        handlers: Mapping[str, Handler],
        lease_duration_us: int,
    ) -> None:
        self.queue = queue
        self.worker_id = require_name("worker_id", worker_id)
        self.lease_duration_us = require_int("lease_duration_us", lease_duration_us, minimum=1)
        self._handlers = dict(handlers)

    def run_once(self) -> WorkResult:
        """Claim one job and take it to an outcome; IDLE when nothing is ready."""
        claimed = self.queue.claim(
            worker_id=self.worker_id, lease_duration_us=self.lease_duration_us
        )
        if claimed is None:
            return WorkResult(WorkOutcome.IDLE)
        return self._settle(claimed, self._execute(claimed))

    def run_until_idle(self, *, max_jobs: int) -> list[WorkResult]:
        """Run jobs until none is ready, or ``max_jobs`` were taken (the loop is bounded)."""
        results = []
        for _ in range(max_jobs):
            result = self.run_once()
            if result.outcome is WorkOutcome.IDLE:
                break
            results.append(result)
        return results

    def _execute(self, claimed: ClaimedJob) -> str | None:
        """Run the handler outside any transaction; the error text, or None on success."""
        handler = self._handlers.get(claimed.job.job_type)
        if handler is None:
            return f"no handler registered for job type {claimed.job.job_type!r}"
        context = JobContext(
            claimed=claimed,
            worker_id=self.worker_id,
            heartbeat=lambda: self.queue.heartbeat(
                job_id=claimed.job.job_id,
                worker_id=self.worker_id,
                lease_token=claimed.lease_token,
                lease_duration_us=self.lease_duration_us,
            ),
        )
        try:
            handler(context)
        except Exception as error:  # a handler's failure is data; BaseException is not
            return describe_error(error)
        return None

    def _settle(self, claimed: ClaimedJob, error: str | None) -> WorkResult:
        """The one place where an attempt's outcome is decided."""
        job_id, attempt = claimed.job.job_id, claimed.attempt
        try:
            if error is None:
                job = self.queue.succeed(
                    job_id=job_id, worker_id=self.worker_id, lease_token=claimed.lease_token
                )
            else:
                job = self.queue.fail(
                    job_id=job_id,
                    worker_id=self.worker_id,
                    lease_token=claimed.lease_token,
                    error=error,
                )
        except StaleLease as stale:
            return WorkResult(WorkOutcome.STALE, job_id, attempt, str(stale))
        return WorkResult(_OUTCOMES[job.state], job_id, attempt, error)
