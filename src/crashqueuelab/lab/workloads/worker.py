"""The worker boundary: claim, run the handler outside every transaction, then settle.

A handler is a trusted in-process callable registered by job type; nothing executable is
ever read from a queue. Whatever happens, the outcome of an attempt is decided in one place
(``Worker._settle``) from the system's verdict: success, failure (the system's retry policy
picks a retry or the dead letter), or a stale lease (someone else owns the job now and our
word no longer counts). The worker speaks only the system-under-test contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crashqueuelab.core.validation import MAX_ERROR_LENGTH, require_int, require_name
from crashqueuelab.lab.runs.systemcalls import SystemRaised
from crashqueuelab.systems.contract import Claim, QueueClient, Verdict


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


class LeaseLost(Exception):
    """Raised inside a handler when a heartbeat finds the lease gone."""


class ClientRaised(Exception):
    """Raised inside a handler when the system's own heartbeat call raised: the system's
    failure, which must reach whoever runs the worker, never a failure of the job."""

    def __init__(self, call: str, error: Exception) -> None:
        self.call = call
        self.error = error
        super().__init__(f"the system's {call} raised {type(error).__name__}: {error}")


@dataclass(frozen=True)
class JobContext:
    """What a handler gets: the claim, and a way to extend its lease where the system can."""

    claim: Claim
    heartbeat: Callable[[], None] | None

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def worker_id(self) -> str:
        return self.claim.worker_id

    @property
    def payload(self) -> dict[str, Any]:
        return self.claim.payload


Handler = Callable[[JobContext], None]

_OUTCOMES = {
    Verdict.SUCCEEDED: WorkOutcome.SUCCEEDED,
    Verdict.RETRY: WorkOutcome.RETRY_SCHEDULED,
    Verdict.DEAD: WorkOutcome.DEAD,
    Verdict.STALE: WorkOutcome.STALE,
}


def describe_error(error: BaseException) -> str:
    """The text recorded for a failed attempt, cut to the store's bound."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 3] + "..."


class Worker:
    """Claims jobs from one queue and runs the registered handler for each."""

    def __init__(
        self,
        client: QueueClient,
        *,
        worker_id: str,
        handlers: Mapping[str, Handler],
        lease_duration_us: int,
        heartbeats: bool = True,
        before_heartbeat: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        #: Called before each heartbeat: a scripted workload's handler works this long.
        self.before_heartbeat = before_heartbeat
        self.worker_id = require_name("worker_id", worker_id)
        self.lease_duration_us = require_int("lease_duration_us", lease_duration_us, minimum=1)
        self.heartbeats = heartbeats
        self._handlers = dict(handlers)

    def run_once(self) -> WorkResult:
        """Claim one job and take it to an outcome; IDLE when nothing is ready."""
        claim = self.client.claim(self.worker_id, self.lease_duration_us)
        if claim is None:
            return WorkResult(WorkOutcome.IDLE)
        return self.settle(claim, self.execute(claim))

    def run_until_idle(self, *, max_jobs: int) -> list[WorkResult]:
        """Run jobs until none is ready, or ``max_jobs`` were taken (the loop is bounded)."""
        results = []
        for _ in range(max_jobs):
            result = self.run_once()
            if result.outcome is WorkOutcome.IDLE:
                break
            results.append(result)
        return results

    def _heartbeat(self, claim: Claim) -> None:
        if self.before_heartbeat is not None:
            self.before_heartbeat()
        try:
            live = self.client.heartbeat(claim, self.lease_duration_us)
        except SystemRaised:
            raise  # named already
        except Exception as error:
            raise ClientRaised("heartbeat", error) from error
        if not live:
            raise LeaseLost(f"{claim.job_id}: lease {claim.token} is no longer live")

    def execute(self, claim: Claim) -> str | None:
        """Run the handler outside any transaction; the error text, or None on success."""
        handler = self._handlers.get(claim.job_type)
        if handler is None:
            return f"no handler registered for job type {claim.job_type!r}"
        heartbeat = (lambda: self._heartbeat(claim)) if self.heartbeats else None
        try:
            handler(JobContext(claim=claim, heartbeat=heartbeat))
        except (ClientRaised, SystemRaised):
            raise
        except Exception as error:  # a handler's failure is data; BaseException is not
            return describe_error(error)
        return None

    def settle(self, claim: Claim, error: str | None) -> WorkResult:
        """The one place where an attempt's outcome is decided."""
        verdict = self.client.succeed(claim) if error is None else self.client.fail(claim, error)
        if verdict is Verdict.STALE:
            stale = f"{claim.job_id}: the lease of attempt {claim.attempt} no longer counts"
            return WorkResult(WorkOutcome.STALE, claim.job_id, claim.attempt, stale)
        return WorkResult(_OUTCOMES[verdict], claim.job_id, claim.attempt, error)
