"""The reference queue: the lab's contract in memory, written from docs/systems.md.

Every adapter is tested against it (``test_behaviour.py``, ``test_state_machine.py``), and it
is itself a system under test, so the contract tests prove they can pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.systems import (
    Capabilities,
    Claim,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    System,
    Verdict,
)


@dataclass
class ReferenceJob:
    spec: JobSpec
    status: JobStatus = JobStatus.PENDING
    attempts: int = 0
    available_at: int = 0
    token: str | None = None
    worker: str | None = None
    deadline: int | None = None
    #: The lease ran out and recover() ended it; a system that notices expiry only when it
    #: next claims may still call the job leased.
    expired: bool = False


@dataclass
class ReferenceState:
    """The durable state: it outlives a client, as a store outlives a process."""

    jobs: dict[str, ReferenceJob] = field(default_factory=dict)
    tokens: int = 0


class ReferenceClient:
    def __init__(self, state: ReferenceState, request: OpenRequest) -> None:
        self.state, self.clock, self.retry = state, request.clock, request.retry

    def _live(self, claim: Claim) -> ReferenceJob | None:
        job = self.state.jobs.get(claim.key)
        now = self.clock.now_us()
        if job is None or job.status is not JobStatus.LEASED or job.token != claim.token:
            return None
        return job if job.deadline is not None and now < job.deadline else None

    def claimable(self, *, noticed_at: int) -> tuple[set[str], set[str]]:
        """Keys a claim must consider (ready since the last recover, at ``noticed_at``) and
        keys it may hand out (also ready since, and leases past their deadline)."""
        now = self.clock.now_us()
        required, allowed = set(), set()
        for key, job in self.state.jobs.items():
            if job.status is JobStatus.PENDING and job.available_at <= now:
                allowed.add(key)
                if job.available_at <= noticed_at:
                    required.add(key)
            overdue = job.deadline is not None and job.deadline <= now
            retryable = job.attempts < job.spec.max_attempts
            if job.status is JobStatus.LEASED and overdue and retryable:
                allowed.add(key)
        return required, allowed

    def claim_key(self, key: str, worker_id: str, lease_us: int) -> Claim:
        """Lease exactly the job a system under test chose (ending an overdue lease first)."""
        job = self.state.jobs[key]
        now = self.clock.now_us()
        if job.status is JobStatus.LEASED:
            self._end_lease(job, now)
        self.state.tokens += 1
        job.status, job.attempts, job.expired = JobStatus.LEASED, job.attempts + 1, False
        job.token, job.worker, job.deadline = f"t{self.state.tokens}", worker_id, now + lease_us
        return Claim(job.spec.key, job.spec.key, job.spec.job_type, dict(job.spec.payload),
                     job.attempts, worker_id, job.token)  # fmt: skip

    def _end_lease(self, job: ReferenceJob, available_at: int) -> None:
        dead = job.attempts >= job.spec.max_attempts
        job.status = JobStatus.DEAD if dead else JobStatus.PENDING
        job.available_at, job.token, job.worker, job.deadline = available_at, None, None, None

    def submit(self, job: JobSpec) -> str:
        self.state.jobs.setdefault(job.key, ReferenceJob(job, available_at=self.clock.now_us()))
        return job.key

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        return [self.submit(job) for job in jobs]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claims = self.claim_many(worker_id, lease_us, 1)
        return claims[0] if claims else None

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        now = self.clock.now_us()
        ready = [
            key
            for key, job in self.state.jobs.items()
            if job.status is JobStatus.PENDING and job.available_at <= now
        ][:limit]
        return [self.claim_key(key, worker_id, lease_us) for key in ready]

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        job = self._live(claim)
        if job is not None:
            job.deadline = self.clock.now_us() + lease_us
        return job is not None

    def succeed(self, claim: Claim) -> Verdict:
        job = self._live(claim)
        if job is None:
            return Verdict.STALE
        job.status, job.token, job.worker, job.deadline = JobStatus.SUCCEEDED, None, None, None
        return Verdict.SUCCEEDED

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        return [self.succeed(claim) for claim in claims]

    def fail(self, claim: Claim, error: str) -> Verdict:
        job = self._live(claim)
        if job is None:
            return Verdict.STALE
        self._end_lease(job, self.clock.now_us() + self.retry.delay_us(job.attempts))
        return Verdict.DEAD if job.status is JobStatus.DEAD else Verdict.RETRY

    def recover(self) -> int:
        now, moved = self.clock.now_us(), 0
        for job in self.state.jobs.values():
            if job.status is JobStatus.LEASED and job.deadline is not None and job.deadline <= now:
                self._end_lease(job, now)
                job.expired = True
                moved += 1
        return moved

    def checkpoint(self) -> None:
        return None

    def job(self, key: str) -> JobView | None:
        job = self.state.jobs.get(key)
        if job is None:
            return None
        return JobView(key, job.status, job.attempts, job.status.value)

    def active_count(self) -> int:
        return sum(1 for job in self.state.jobs.values() if not job.status.is_terminal)

    def close(self) -> None:
        return None


def reference_system(client_class: type[ReferenceClient] = ReferenceClient) -> System:
    """A fresh reference queue: one state per directory, shared by every client opened there."""
    states: dict[Path, ReferenceState] = {}

    def open_client(request: OpenRequest) -> Any:
        return client_class(states.setdefault(request.directory, ReferenceState()), request)

    return System(
        name="reference",
        version="tests/systems/contract/model.py",
        durability="memory",
        capabilities=Capabilities(
            fencing_tokens=True,
            heartbeats=True,
            several_processes=False,
            batching=True,
            single_owner=True,
            checkpoint=False,
        ),
        crash_points=(),
        open=open_client,
    )
