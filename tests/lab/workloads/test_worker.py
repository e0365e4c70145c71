"""The worker boundary: one place decides success, failure, dead letter or stale lease."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crashqueuelab import DurableQueue, JobState, ManualClock
from crashqueuelab.lab.faults.hooks import InjectedCrash, raise_at
from crashqueuelab.lab.workloads.effects import Destination, EffectLedger
from crashqueuelab.lab.workloads.handlers import (
    SYNTHETIC_EFFECT,
    SYNTHETIC_FLAKY,
    synthetic_handlers,
)
from crashqueuelab.lab.workloads.worker import (
    ClientRaised,
    JobContext,
    Worker,
    WorkOutcome,
    describe_error,
)
from crashqueuelab.systems.contract import Claim
from crashqueuelab.systems.sqlite import SqliteClient
from tests.conftest import LEASE_US, QueueFactory


@pytest.fixture
def ledger(tmp_path: Path, clock: ManualClock) -> Iterator[EffectLedger]:
    with EffectLedger(
        tmp_path / "effects.sqlite", destination=Destination.IDEMPOTENT, clock=clock
    ) as ledger:
        yield ledger


def make_worker(queue: DurableQueue, ledger: EffectLedger, worker_id: str = "w") -> Worker:
    return Worker(
        SqliteClient(queue),
        worker_id=worker_id,
        handlers=synthetic_handlers(ledger),
        lease_duration_us=LEASE_US,
    )


def test_an_idle_queue_gives_an_idle_turn(queue: DurableQueue, ledger: EffectLedger) -> None:
    worker = make_worker(queue, ledger)
    assert worker.run_once().outcome is WorkOutcome.IDLE
    assert worker.run_until_idle(max_jobs=5) == []


def test_a_successful_handler_commits_its_effect_then_acknowledges(
    queue: DurableQueue, ledger: EffectLedger
) -> None:
    job = queue.submit(
        idempotency_key="k",
        job_type=SYNTHETIC_EFFECT,
        payload={"effect_key": "e", "value": 3, "heartbeats": 2},
    ).job
    result = make_worker(queue, ledger).run_once()
    assert (result.outcome, result.job_id, result.attempt) == (WorkOutcome.SUCCEEDED, job.job_id, 1)
    assert ledger.counts_by_key() == {"e": 1}
    assert [e.event_type.value for e in queue.history(job.job_id)] == [
        "SUBMITTED", "CLAIMED", "HEARTBEAT", "HEARTBEAT", "SUCCEEDED",
    ]  # fmt: skip


def test_a_raising_handler_fails_the_attempt_and_the_retry_policy_decides(
    queue: DurableQueue, ledger: EffectLedger, clock: ManualClock
) -> None:
    queue.submit(
        idempotency_key="k",
        job_type=SYNTHETIC_FLAKY,
        payload={"effect_key": "e", "value": 1, "fail_attempts": 5},
        max_attempts=2,
    )
    worker = make_worker(queue, ledger)
    first = worker.run_once()
    assert first.outcome is WorkOutcome.RETRY_SCHEDULED
    assert first.error == "RuntimeError: attempt 1 fails on purpose"
    clock.advance(10_000)
    queue.promote_retries()
    assert worker.run_once().outcome is WorkOutcome.DEAD
    assert ledger.counts_by_key() == {}


def test_an_unknown_job_type_or_bad_payload_fails_the_attempt(
    queue: DurableQueue, ledger: EffectLedger
) -> None:
    queue.submit(idempotency_key="a", job_type="mystery", payload={}, max_attempts=1)
    queue.submit(idempotency_key="b", job_type=SYNTHETIC_EFFECT, payload={"x": 1}, max_attempts=1)
    results = make_worker(queue, ledger).run_until_idle(max_jobs=10)
    assert [r.outcome for r in results] == [WorkOutcome.DEAD, WorkOutcome.DEAD]
    assert results[0].error == "no handler registered for job type 'mystery'"
    assert results[1].error is not None
    assert results[1].error.startswith("ValueError")


def test_a_worker_that_lost_its_lease_is_told_stale_and_changes_nothing(
    make_queue: QueueFactory, ledger: EffectLedger, clock: ManualClock
) -> None:
    queue = make_queue()
    job = queue.submit(idempotency_key="k", job_type="slow", payload={}).job

    def slow(context: JobContext) -> None:
        # While this handler runs, its lease expires and another worker takes the job.
        clock.advance(LEASE_US)
        queue.recover_expired()
        clock.advance(10_000)
        queue.promote_retries()
        assert queue.claim(worker_id="thief", lease_duration_us=LEASE_US) is not None

    worker = Worker(
        SqliteClient(queue), worker_id="w", handlers={"slow": slow}, lease_duration_us=LEASE_US
    )
    result = worker.run_once()
    assert result.outcome is WorkOutcome.STALE
    assert queue.get(job.job_id).lease_worker_id == "thief"
    assert queue.get(job.job_id).state is JobState.LEASED


def test_a_simulated_crash_is_not_swallowed_by_the_worker(
    make_queue: QueueFactory, ledger: EffectLedger
) -> None:
    queue = make_queue()
    queue.submit(
        idempotency_key="k", job_type=SYNTHETIC_EFFECT, payload={"effect_key": "e", "value": 1}
    )
    crashing = EffectLedger(
        ledger.path,
        destination=Destination.IDEMPOTENT,
        hook=raise_at("AFTER_EFFECT_COMMIT"),
    )
    with crashing, pytest.raises(InjectedCrash):
        make_worker(queue, crashing).run_once()
    assert ledger.counts_by_key() == {"e": 1}


def test_error_text_is_cut_to_the_store_bound() -> None:
    text = describe_error(ValueError("x" * 10_000))
    assert len(text) == 8192
    assert text.endswith("...")


class _HeartbeatRaises(SqliteClient):
    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise RuntimeError("the queue's heartbeat is broken")


def test_a_heartbeat_that_raises_is_the_systems_failure_never_the_jobs(
    queue: DurableQueue, ledger: EffectLedger
) -> None:
    job = queue.submit(
        idempotency_key="k",
        job_type=SYNTHETIC_EFFECT,
        payload={"effect_key": "e", "value": 3, "heartbeats": 1},
    ).job
    worker = Worker(
        _HeartbeatRaises(queue),
        worker_id="w",
        handlers=synthetic_handlers(ledger),
        lease_duration_us=LEASE_US,
    )
    with pytest.raises(ClientRaised, match="heartbeat raised RuntimeError: the queue's heartbeat"):
        worker.run_once()
    # Not settled as a failed attempt: the job is still held, nothing was written.
    assert [e.event_type.value for e in queue.history(job.job_id)] == ["SUBMITTED", "CLAIMED"]
    assert ledger.counts_by_key() == {}
