"""Expired-lease recovery, retry promotion, the dead letter, and the hooks around commits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from crashqueuelab import (
    AttemptOutcome,
    ClaimedJob,
    DurableQueue,
    EventType,
    JobState,
    ManualClock,
    Phase,
    StoreError,
)
from crashqueuelab.core.statements import LEASE_EXPIRED_ERROR
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from tests.conftest import LEASE_US, QueueFactory, fingerprint


def test_recovery_waits_for_the_deadline(queue: DurableQueue, clock: ManualClock) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is not None
    clock.advance(LEASE_US - 1)
    assert queue.recover_expired() == []
    clock.advance(1)
    assert queue.recover_expired() == [job.job_id]
    recovered = queue.get(job.job_id)
    assert recovered.state is JobState.RETRY_SCHEDULED
    assert recovered.available_at_us == clock.now_us() + 1_000
    assert recovered.last_error == LEASE_EXPIRED_ERROR
    assert queue.attempts(job.job_id)[0].outcome is AttemptOutcome.EXPIRED
    assert queue.history(job.job_id)[-1].event_type is EventType.LEASE_EXPIRED


def test_recovery_dead_letters_exhausted_jobs(queue: DurableQueue, clock: ManualClock) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}, max_attempts=1).job
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is not None
    clock.advance(LEASE_US)
    queue.recover_expired()
    assert queue.get(job.job_id).state is JobState.DEAD
    clock.advance(10**9)
    assert queue.promote_retries() == []
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is None


def test_recovery_and_promotion_handle_many_jobs_in_one_transaction(
    queue: DurableQueue, clock: ManualClock
) -> None:
    for index in range(10):
        queue.submit(idempotency_key=f"k{index}", job_type="t", payload={})
        assert queue.claim(worker_id=f"w{index}", lease_duration_us=LEASE_US + index) is not None
    clock.advance(LEASE_US + 9)
    assert len(queue.recover_expired()) == 10
    clock.advance(1_000)
    assert len(queue.promote_retries()) == 10
    assert queue.counts()[JobState.QUEUED] == 10
    assert check_database(queue.path).ok
    assert replay_database(queue.path).ok


def test_hooks_fire_before_and_after_each_committing_transaction(
    make_queue: QueueFactory, clock: ManualClock
) -> None:
    phases: list[Phase] = []
    queue = make_queue(hook=phases.append)
    job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    claimed = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
    assert claimed is not None
    queue.heartbeat(
        job_id=job.job_id,
        worker_id="w",
        lease_token=claimed.lease_token,
        lease_duration_us=LEASE_US,
    )
    queue.fail(job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token, error="x")
    clock.advance(1_000)
    queue.promote_retries()
    claimed = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
    assert claimed is not None
    clock.advance(LEASE_US)
    queue.recover_expired()
    clock.advance(10_000)
    queue.promote_retries()
    claimed = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
    assert claimed is not None
    queue.succeed(job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token)
    # Transactions that change nothing do not commit anything, so they fire no hook.
    queue.submit(idempotency_key="k", job_type="t", payload={})
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is None
    assert queue.recover_expired() == []
    assert queue.promote_retries() == []
    pairs = [(phases[i], phases[i + 1]) for i in range(0, len(phases), 2)]
    assert [p[0].value.split("_")[1] for p in pairs] == [
        "SUBMIT",
        "CLAIM",
        "HEARTBEAT",
        "FAILURE",
        "PROMOTION",
        "CLAIM",
        "RECOVERY",
        "PROMOTION",
        "CLAIM",
        "SUCCESS",
    ]
    assert all(
        a.value.startswith("BEFORE_") and b.value == a.value.replace("BEFORE_", "AFTER_")
        for a, b in pairs
    )


class HookFailure(Exception):
    pass


Action = Callable[[DurableQueue, ManualClock, ClaimedJob], object]

# For each BEFORE phase: an optional step that sets the scene, then the action whose
# transaction the raising hook must roll back.
_SCENES: dict[Phase, tuple[Action | None, Action]] = {
    Phase.BEFORE_SUBMIT_COMMIT: (
        None,
        lambda q, c, held: q.submit(idempotency_key="new", job_type="t", payload={}),
    ),
    Phase.BEFORE_CLAIM_COMMIT: (
        None,
        lambda q, c, held: q.claim(worker_id="w2", lease_duration_us=LEASE_US),
    ),
    Phase.BEFORE_HEARTBEAT_COMMIT: (
        None,
        lambda q, c, held: q.heartbeat(
            job_id=held.job.job_id,
            worker_id="w",
            lease_token=held.lease_token,
            lease_duration_us=LEASE_US,
        ),
    ),
    Phase.BEFORE_SUCCESS_COMMIT: (
        None,
        lambda q, c, held: q.succeed(
            job_id=held.job.job_id, worker_id="w", lease_token=held.lease_token
        ),
    ),
    Phase.BEFORE_FAILURE_COMMIT: (
        None,
        lambda q, c, held: q.fail(
            job_id=held.job.job_id, worker_id="w", lease_token=held.lease_token, error="x"
        ),
    ),
    Phase.BEFORE_RECOVERY_COMMIT: (
        lambda q, c, held: c.advance(LEASE_US),
        lambda q, c, held: q.recover_expired(),
    ),
    Phase.BEFORE_PROMOTION_COMMIT: (
        lambda q, c, held: (
            q.fail(job_id=held.job.job_id, worker_id="w", lease_token=held.lease_token, error="x"),
            c.advance(10_000),
        ),
        lambda q, c, held: q.promote_retries(),
    ),
}


@pytest.mark.parametrize("phase", list(_SCENES))
def test_a_hook_raising_inside_a_transaction_leaves_no_partial_rows(
    make_queue: QueueFactory, clock: ManualClock, db_path: Path, phase: Phase
) -> None:
    armed: list[Phase] = []

    def hook(seen: Phase) -> None:
        if seen in armed:
            raise HookFailure(seen)

    queue = make_queue(hook=hook)
    queue.submit(idempotency_key="k1", job_type="t", payload={})
    queue.submit(idempotency_key="k2", job_type="t", payload={})
    held = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
    assert held is not None
    scene, action = _SCENES[phase]
    if scene is not None:
        scene(queue, clock, held)
    before = fingerprint(db_path)
    armed.append(phase)
    with pytest.raises(HookFailure):
        action(queue, clock, held)
    assert fingerprint(db_path) == before
    assert check_database(db_path).ok
    assert replay_database(db_path).ok


def test_a_closed_queue_refuses_work(queue: DurableQueue) -> None:
    queue.close()
    queue.close()
    with pytest.raises(StoreError):
        queue.get("job-x")
