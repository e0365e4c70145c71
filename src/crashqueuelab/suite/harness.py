"""One system opened in a fresh directory on a manual clock: what a contract check drives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems.contract import Claim, JobSpec, OpenRequest, QueueClient, System

LEASE_US = 1_000_000
RETRY = RetryPolicy(base_delay_us=100_000, max_delay_us=400_000)
#: The checks' clock starts here (microseconds), far from zero so times read as times.
START_US = 1_000_000_000


def open_client(
    system: System, directory: Path, clock: ManualClock, *, stream: str = "contract"
) -> QueueClient:
    """Each opening stands for a process of its own: give each its own id stream."""
    return system.open(OpenRequest(directory, clock, SeededIds(1, stream), RETRY))


@dataclass
class Harness:
    """One system opened in a fresh directory, on a manual clock."""

    system: System
    directory: Path
    clock: ManualClock
    client: QueueClient

    @classmethod
    def open(cls, system: System, directory: Path) -> Harness:
        clock = ManualClock(START_US)
        return cls(system, directory, clock, open_client(system, directory, clock))

    def close(self) -> None:
        self.client.close()

    def reopen(self) -> None:
        self.client.close()
        self.client = open_client(self.system, self.directory, self.clock, stream="reopened")

    def submit(self, key: str, *, max_attempts: int = 3) -> str:
        return self.client.submit(
            JobSpec(key=key, job_type="t", payload={"k": key}, max_attempts=max_attempts)
        )

    def claim(self, worker: str = "w1", *, holding: Claim | None = None) -> Claim:
        """``worker``'s claim, which must find a job; ``holding``: the lease it holds
        meanwhile, named in the failure (a queue may offer nothing more to a busy worker)."""
        claim = self.client.claim(worker, LEASE_US)
        busy = "" if holding is None else f" while it holds job {holding.key}"
        assert claim is not None, f"{worker} found nothing to claim{busy}"
        return claim

    def expire(self) -> None:
        """Let every lease run out and every retry come due; the system notices each."""
        self.clock.advance(LEASE_US + RETRY.max_delay_us)
        self.client.recover()
        self.clock.advance(RETRY.max_delay_us)
        self.client.recover()
