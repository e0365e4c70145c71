"""Every system under the same contract tests: the reference queue and every adapter.

A defect the lab has measured in a third-party queue is marked as an expected failure with
the measurement as its reason (strict: if the queue gets fixed, the test says so).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems import Claim, JobSpec, OpenRequest, QueueClient, System, resolve_system
from tests.contract.model import reference_system

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LEASE_US = 1_000_000
RETRY = RetryPolicy(base_delay_us=100_000, max_delay_us=400_000)

NO_EXPIRY = "measured: persist-queue has no lease expiry; a task returns only on reopen"
NO_FENCING = "measured: persist-queue accepts any acknowledgement of a task id"
NO_DELAY = "measured: persist-queue's nack makes a task ready at once (no retry delay)"
RESUMES_ALL = "measured: reopening persist-queue resumes every unacknowledged task"
#: (system, test) -> why the lab expects it to fail.
EXPECTED_DEFECTS = {
    ("persist-queue", "test_an_expired_holder_is_refused_and_the_job_goes_to_another"): NO_EXPIRY,
    ("persist-queue", "test_an_acknowledgement_at_the_deadline_is_refused"): NO_FENCING,
    ("persist-queue", "test_the_live_holder_acknowledges_once"): NO_FENCING,
    ("persist-queue", "test_a_failure_waits_its_delay_then_the_dead_letter_takes_it"): NO_DELAY,
    ("persist-queue", "test_a_reopened_store_keeps_every_job_and_lease"): RESUMES_ALL,
    ("persist-queue", "test_the_state_machine_agrees_with_the_reference"): NO_EXPIRY,
}


def _tinyqueue() -> System:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return resolve_system("tiny_adapter:tiny_system")


FACTORIES: dict[str, Callable[[], System]] = {
    "reference": reference_system,
    "sqlite": lambda: resolve_system("sqlite"),
    "postgres": lambda: resolve_system("postgres"),
    "walqueue": lambda: resolve_system("walqueue"),
    "persist-queue": lambda: resolve_system("persist-queue"),
    "tinyqueue": _tinyqueue,
}


@dataclass
class Harness:
    """One system opened in a fresh directory, on a manual clock."""

    system: System
    directory: Path
    clock: ManualClock
    client: QueueClient

    def reopen(self) -> None:
        self.client.close()
        self.client = open_client(self.system, self.directory, self.clock, stream="reopened")

    def submit(self, key: str, *, max_attempts: int = 3) -> str:
        return self.client.submit(
            JobSpec(key=key, job_type="t", payload={"k": key}, max_attempts=max_attempts)
        )

    def claim(self, worker: str = "w1") -> Claim:
        claim = self.client.claim(worker, LEASE_US)
        assert claim is not None, f"{worker} found nothing to claim"
        return claim

    def expire(self) -> None:
        """Let every lease run out and every retry come due; the system notices each."""
        self.clock.advance(LEASE_US + RETRY.max_delay_us)
        self.client.recover()
        self.clock.advance(RETRY.max_delay_us)
        self.client.recover()


def open_client(
    system: System, directory: Path, clock: ManualClock, *, stream: str = "contract"
) -> QueueClient:
    """Each opening stands for a process of its own: give each its own id stream."""
    return system.open(OpenRequest(directory, clock, SeededIds(1, stream), RETRY))


def systems_with(capability: str | None = None) -> list[str]:
    if capability is None:
        return list(FACTORIES)
    return [name for name in FACTORIES if _capabilities(name)[capability]]


def _capabilities(name: str) -> dict[str, bool]:
    # Collection must not need a server: the PostgreSQL system's capabilities are static.
    if name == "postgres":
        from crashqueuelab.systems.postgres import CAPABILITIES

        return CAPABILITIES.to_json()
    return FACTORIES[name]().capabilities.to_json()


@pytest.fixture
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    name = request.param
    reason = EXPECTED_DEFECTS.get((name, request.node.originalname))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    if name == "postgres":
        request.getfixturevalue("postgres_dsn")
    system = FACTORIES[name]()
    clock = ManualClock(1_000_000_000)
    harness = Harness(
        system, tmp_path / "store", clock, open_client(system, tmp_path / "store", clock)
    )
    try:
        yield harness
    finally:
        harness.client.close()
