"""A small in-memory reference queue, written from the documented state machine.

The stateful test runs it beside DurableQueue and demands the same answers after every step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelJob:
    key: str
    job_type: str
    payload: str
    max_attempts: int
    seq: int
    state: str = "QUEUED"
    attempts: int = 0
    available_at: int = 0
    worker: str | None = None
    token: str | None = None
    deadline: int | None = None


class ModelQueue:
    """Reference semantics: which job a claim gets, which operations are stale, retry times."""

    def __init__(self, base_delay: int, max_delay: int) -> None:
        self.jobs: dict[str, ModelJob] = {}
        self.by_key: dict[str, str] = {}
        self.base_delay = base_delay
        self.max_delay = max_delay

    def submit(
        self, job_id: str, key: str, job_type: str, payload: str, max_attempts: int, now: int
    ) -> str:
        """'created', 'existing' or 'conflict'."""
        existing = self.by_key.get(key)
        if existing is not None:
            job = self.jobs[existing]
            same = (job.job_type, job.payload, job.max_attempts) == (
                job_type,
                payload,
                max_attempts,
            )
            return "existing" if same else "conflict"
        self.jobs[job_id] = ModelJob(
            key, job_type, payload, max_attempts, len(self.jobs), "QUEUED", 0, now
        )
        self.by_key[key] = job_id
        return "created"

    def next_ready(self, now: int) -> str | None:
        ready = [
            (job.available_at, job.seq, job_id)
            for job_id, job in self.jobs.items()
            if job.state == "QUEUED" and job.available_at <= now
        ]
        return min(ready)[2] if ready else None

    def claim(self, job_id: str, worker: str, token: str, deadline: int) -> None:
        job = self.jobs[job_id]
        job.state, job.attempts = "LEASED", job.attempts + 1
        job.worker, job.token, job.deadline = worker, token, deadline

    def stale_reason(self, job_id: str, worker: str, token: str, now: int) -> str | None:
        job = self.jobs[job_id]
        if job.state != "LEASED":
            return "not_leased"
        if job.worker != worker:
            return "wrong_worker"
        if job.token != token:
            return "wrong_token"
        assert job.deadline is not None
        return "lease_expired" if now >= job.deadline else None

    def _end(self, job: ModelJob, state: str) -> None:
        job.state = state
        job.worker = job.token = job.deadline = None

    def _retry_or_dead(self, job: ModelJob, now: int) -> None:
        if job.attempts >= job.max_attempts:
            self._end(job, "DEAD")
        else:
            job.available_at = now + min(self.base_delay * 2 ** (job.attempts - 1), self.max_delay)
            self._end(job, "RETRY_SCHEDULED")

    def succeed(self, job_id: str) -> None:
        self._end(self.jobs[job_id], "SUCCEEDED")

    def fail(self, job_id: str, now: int) -> None:
        self._retry_or_dead(self.jobs[job_id], now)

    def recover(self, now: int) -> set[str]:
        expired = {
            job_id
            for job_id, job in self.jobs.items()
            if job.state == "LEASED" and job.deadline is not None and job.deadline <= now
        }
        for job_id in expired:
            self._retry_or_dead(self.jobs[job_id], now)
        return expired

    def promote(self, now: int) -> set[str]:
        due = {
            job_id
            for job_id, job in self.jobs.items()
            if job.state == "RETRY_SCHEDULED" and job.available_at <= now
        }
        for job_id in due:
            self.jobs[job_id].state = "QUEUED"
        return due
