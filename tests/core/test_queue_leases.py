"""Claims, heartbeats, success and failure, and the fencing that guards them."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab import (
    AttemptOutcome,
    ClaimedJob,
    DurableQueue,
    EventType,
    InvalidInput,
    JobNotFound,
    JobState,
    ManualClock,
    Phase,
    StaleLease,
    StaleReason,
)
from tests.conftest import LEASE_US, QueueFactory, fingerprint


def require_claim(claimed: ClaimedJob | None) -> ClaimedJob:
    assert claimed is not None, "expected a job to be claimed"
    return claimed


def test_claim_leases_the_oldest_ready_job(queue: DurableQueue, clock: ManualClock) -> None:
    first = queue.submit(idempotency_key="a", job_type="t", payload={}).job
    clock.advance(1)
    queue.submit(idempotency_key="b", job_type="t", payload={})
    claimed = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
    assert claimed.job.job_id == first.job_id
    assert claimed.attempt == 1
    assert claimed.lease_deadline_us == clock.now_us() + LEASE_US
    assert claimed.job == queue.get(first.job_id)
    [attempt] = queue.attempts(first.job_id)
    assert attempt.worker_id == "w"
    assert attempt.lease_token == claimed.lease_token
    assert attempt.outcome is None


def test_claim_orders_jobs_submitted_at_the_same_instant_by_submission(
    queue: DurableQueue,
) -> None:
    ids = [
        queue.submit(idempotency_key=f"k{i}", job_type="t", payload={}).job.job_id for i in range(5)
    ]
    claimed = [
        require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US)).job.job_id
        for _ in range(5)
    ]
    assert claimed == ids
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is None


def test_each_claim_issues_a_fresh_lease_token(queue: DurableQueue, clock: ManualClock) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    tokens = []
    for _ in range(3):
        claimed = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
        tokens.append(claimed.lease_token)
        queue.fail(job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token, error="boom")
        clock.advance(10_000)
        queue.promote_retries()
    assert len(set(tokens)) == 3
    assert queue.get(job.job_id).state is JobState.DEAD


def test_heartbeat_extends_the_live_lease(queue: DurableQueue, clock: ManualClock) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    claimed = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
    clock.advance(LEASE_US - 1)
    extended = queue.heartbeat(
        job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token, lease_duration_us=500
    )
    assert extended.lease_deadline_us == clock.now_us() + 500
    assert queue.get(job.job_id).lease_deadline_us == extended.lease_deadline_us
    assert queue.attempts(job.job_id)[0].lease_deadline_us == extended.lease_deadline_us
    assert queue.history(job.job_id)[-1].event_type is EventType.HEARTBEAT


def test_succeed_finishes_the_job_and_closes_the_attempt(queue: DurableQueue) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    claimed = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
    done = queue.succeed(job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token)
    assert done == queue.get(job.job_id)
    assert done.state is JobState.SUCCEEDED
    assert (done.lease_token, done.lease_worker_id, done.lease_deadline_us) == (None, None, None)
    assert queue.attempts(job.job_id)[0].outcome is AttemptOutcome.SUCCEEDED


def test_fail_schedules_a_capped_exponential_retry(queue: DurableQueue, clock: ManualClock) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}, max_attempts=6).job
    delays = []
    for _ in range(5):
        claimed = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
        failed = queue.fail(
            job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token, error="boom"
        )
        assert failed.state is JobState.RETRY_SCHEDULED
        assert failed.last_error == "boom"
        delays.append(failed.available_at_us - clock.now_us())
        assert queue.promote_retries() == []
        clock.advance(failed.available_at_us - clock.now_us())
        assert queue.promote_retries() == [job.job_id]
    assert delays == [1_000, 2_000, 4_000, 8_000, 8_000]


def test_the_last_failed_attempt_dead_letters_the_job(queue: DurableQueue) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}, max_attempts=1).job
    claimed = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
    dead = queue.fail(job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token, error="x")
    assert dead.state is JobState.DEAD
    assert queue.attempts(job.job_id)[0].outcome is AttemptOutcome.FAILED


@pytest.fixture
def leased(queue: DurableQueue) -> ClaimedJob:
    queue.submit(idempotency_key="k", job_type="t", payload={})
    return require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))


@pytest.mark.parametrize("operation", ["heartbeat", "succeed", "fail"])
@pytest.mark.parametrize(
    ("worker", "token", "advance", "reason"),
    [
        ("other", None, 0, StaleReason.WRONG_WORKER),
        ("w", "lease-forged", 0, StaleReason.WRONG_TOKEN),
        ("w", None, LEASE_US, StaleReason.LEASE_EXPIRED),
        ("w", None, LEASE_US + 5, StaleReason.LEASE_EXPIRED),
    ],
)
def test_stale_lease_holders_are_fenced_off_without_any_write(
    queue: DurableQueue,
    clock: ManualClock,
    db_path: Path,
    leased: ClaimedJob,
    operation: str,
    worker: str,
    token: str | None,
    advance: int,
    reason: StaleReason,
) -> None:
    clock.advance(advance)
    before = fingerprint(db_path)
    arguments: dict[str, object] = {
        "job_id": leased.job.job_id,
        "worker_id": worker,
        "lease_token": token or leased.lease_token,
    }
    if operation == "heartbeat":
        arguments["lease_duration_us"] = LEASE_US
    if operation == "fail":
        arguments["error"] = "late"
    with pytest.raises(StaleLease) as caught:
        getattr(queue, operation)(**arguments)
    assert caught.value.reason is reason
    assert fingerprint(db_path) == before


def test_a_finished_job_rejects_its_old_lease(queue: DurableQueue, leased: ClaimedJob) -> None:
    job_id = leased.job.job_id
    queue.succeed(job_id=job_id, worker_id="w", lease_token=leased.lease_token)
    with pytest.raises(StaleLease) as caught:
        queue.succeed(job_id=job_id, worker_id="w", lease_token=leased.lease_token)
    assert caught.value.reason is StaleReason.NOT_LEASED


def test_a_recovered_lease_cannot_be_used_by_its_old_holder(
    queue: DurableQueue, clock: ManualClock, leased: ClaimedJob
) -> None:
    clock.advance(LEASE_US)
    assert queue.recover_expired() == [leased.job.job_id]
    clock.advance(10_000)
    queue.promote_retries()
    second = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
    assert second.lease_token != leased.lease_token
    with pytest.raises(StaleLease) as caught:
        queue.succeed(job_id=leased.job.job_id, worker_id="w", lease_token=leased.lease_token)
    assert caught.value.reason is StaleReason.WRONG_TOKEN


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"job_id": ""}, InvalidInput),
        ({"worker_id": ""}, InvalidInput),
        ({"lease_token": ""}, InvalidInput),
        ({"job_id": "job-unknown"}, JobNotFound),
    ],
)
def test_malformed_lease_arguments_are_refused(
    queue: DurableQueue,
    db_path: Path,
    leased: ClaimedJob,
    arguments: dict[str, str],
    error: type[Exception],
) -> None:
    before = fingerprint(db_path)
    request = {"job_id": leased.job.job_id, "worker_id": "w", "lease_token": leased.lease_token}
    request.update(arguments)
    with pytest.raises(error):
        queue.succeed(**request)
    assert fingerprint(db_path) == before


@pytest.mark.parametrize("duration", [0, -1, True, 10**20])
def test_lease_durations_must_be_positive_and_bounded(
    queue: DurableQueue, leased: ClaimedJob, duration: int
) -> None:
    with pytest.raises(InvalidInput):
        queue.claim(worker_id="w", lease_duration_us=duration)
    with pytest.raises(InvalidInput):
        queue.heartbeat(
            job_id=leased.job.job_id,
            worker_id="w",
            lease_token=leased.lease_token,
            lease_duration_us=duration,
        )


def test_fail_rejects_oversized_error_text(queue: DurableQueue, leased: ClaimedJob) -> None:
    with pytest.raises(InvalidInput):
        queue.fail(
            job_id=leased.job.job_id,
            worker_id="w",
            lease_token=leased.lease_token,
            error="e" * 9000,
        )
    with pytest.raises(InvalidInput):
        queue.fail(
            job_id=leased.job.job_id,
            worker_id="w",
            lease_token=leased.lease_token,
            error=None,  # type: ignore[arg-type]
        )


def test_succeed_and_claim_acknowledges_and_leases_the_next_job_in_one_commit(
    make_queue: QueueFactory, clock: ManualClock
) -> None:
    phases: list[Phase] = []
    queue = make_queue(hook=phases.append)
    first = queue.submit(idempotency_key="a", job_type="t", payload={}).job
    second = queue.submit(idempotency_key="b", job_type="t", payload={}).job
    held = require_claim(queue.claim(worker_id="w", lease_duration_us=LEASE_US))
    phases.clear()
    done, following = queue.succeed_and_claim(
        job_id=first.job_id, worker_id="w", lease_token=held.lease_token, lease_duration_us=LEASE_US
    )
    assert done.state is JobState.SUCCEEDED
    following = require_claim(following)
    assert following.job.job_id == second.job_id
    assert [p.value for p in phases] == [
        "BEFORE_SUCCESS_COMMIT",
        "BEFORE_CLAIM_COMMIT",
        "AFTER_SUCCESS_COMMIT",
        "AFTER_CLAIM_COMMIT",
    ]
    done, nothing = queue.succeed_and_claim(
        job_id=second.job_id,
        worker_id="w",
        lease_token=following.lease_token,
        lease_duration_us=LEASE_US,
    )
    assert nothing is None
    assert queue.counts()[JobState.SUCCEEDED] == 2


def test_a_stale_succeed_and_claim_claims_nothing(
    queue: DurableQueue, db_path: Path, leased: ClaimedJob
) -> None:
    queue.submit(idempotency_key="other", job_type="t", payload={})
    before = fingerprint(db_path)
    with pytest.raises(StaleLease):
        queue.succeed_and_claim(
            job_id=leased.job.job_id,
            worker_id="w",
            lease_token="lease-forged",
            lease_duration_us=LEASE_US,
        )
    assert fingerprint(db_path) == before
