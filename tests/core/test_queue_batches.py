"""The batched paths: one transaction each, and every job still fenced and recorded on its own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crashqueuelab import (
    DurableQueue,
    EventType,
    IdempotencyConflict,
    InvalidInput,
    JobNotFound,
    JobState,
    ManualClock,
    Phase,
    SeededIds,
    StoreError,
)
from crashqueuelab.core.held import HeldLeases
from crashqueuelab.core.models import Acknowledgement, AttemptOutcome, ClaimedJob, Job
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from tests.conftest import LEASE_US, RETRY, START_US, QueueFactory, fingerprint, raw


def requests(count: int, prefix: str = "k") -> list[dict[str, object]]:
    return [
        {"idempotency_key": f"{prefix}{n}", "job_type": "t", "payload": {"n": n}}
        for n in range(count)
    ]


def test_submit_many_creates_every_job_in_order(queue: DurableQueue) -> None:
    results = queue.submit_many(requests(5))
    assert [r.created for r in results] == [True] * 5
    assert [r.job.submit_seq for r in results] == [1, 2, 3, 4, 5]
    again = queue.submit_many(requests(6))
    assert [r.created for r in again] == [False] * 5 + [True]
    assert [r.job.job_id for r in again[:5]] == [r.job.job_id for r in results]


def test_submit_many_applies_idempotency_inside_the_batch(queue: DurableQueue) -> None:
    twice = [requests(1)[0], requests(1)[0]]
    first, second = queue.submit_many(twice)
    assert (first.created, second.created) == (True, False)
    assert first.job.job_id == second.job.job_id


def test_one_conflict_rejects_the_whole_batch(queue: DurableQueue, db_path: Path) -> None:
    queue.submit(idempotency_key="k2", job_type="t", payload={"other": True})
    before = fingerprint(db_path)
    with pytest.raises(IdempotencyConflict):
        queue.submit_many(requests(5))
    assert fingerprint(db_path) == before


@pytest.mark.parametrize(
    "batch",
    [
        [],
        "not a list",
        [*requests(3), {"idempotency_key": "k", "job_type": "t"}],
        [*requests(3), {"idempotency_key": "k", "job_type": "t", "payload": {}, "colour": "red"}],
        [*requests(3), "not a mapping"],
        [*requests(3), {"idempotency_key": "", "job_type": "t", "payload": {}}],
        requests(10_001),
    ],
)
def test_an_invalid_batch_writes_nothing(queue: DurableQueue, db_path: Path, batch: object) -> None:
    queue.submit(idempotency_key="existing", job_type="t", payload={})
    before = fingerprint(db_path)
    with pytest.raises(InvalidInput):
        queue.submit_many(batch)  # type: ignore[arg-type]
    assert fingerprint(db_path) == before


def test_claim_many_leases_the_oldest_jobs_each_with_its_own_token(
    make_queue: QueueFactory,
) -> None:
    phases: list[Phase] = []
    queue = make_queue(hook=phases.append)
    submitted = [r.job.job_id for r in queue.submit_many(requests(5))]
    phases.clear()
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=3)
    assert [c.job.job_id for c in claimed] == submitted[:3]
    assert len({c.lease_token for c in claimed}) == 3
    assert all(c.job.state is JobState.LEASED and c.attempt == 1 for c in claimed)
    assert all(c.job == queue.get(c.job.job_id) for c in claimed)
    assert phases == [Phase.BEFORE_CLAIM_COMMIT, Phase.AFTER_CLAIM_COMMIT]
    rest = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=10)
    assert [c.job.job_id for c in rest] == submitted[3:]
    assert queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=10) == []
    for job_id in submitted:
        assert [e.event_type for e in queue.history(job_id)] == [
            EventType.SUBMITTED,
            EventType.CLAIMED,
        ]
        assert len(queue.attempts(job_id)) == 1
    assert check_database(queue.path).ok
    assert replay_database(queue.path).ok


@pytest.mark.parametrize("limit", [0, -1, 10_001, True])
def test_claim_many_needs_a_sane_limit(queue: DurableQueue, limit: int) -> None:
    with pytest.raises(InvalidInput):
        queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=limit)


def test_succeed_many_fences_each_item_on_its_own(queue: DurableQueue, clock: ManualClock) -> None:
    queue.submit_many(requests(4))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=4)
    acks = [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    acks[1] = Acknowledgement(acks[1].job_id, "intruder", acks[1].lease_token)
    acks[2] = Acknowledgement(acks[2].job_id, "w", "lease-forged")
    acks.append(acks[0])  # the same acknowledgement twice in one batch
    results = queue.succeed_many(acks)
    assert [r.accepted for r in results] == [True, False, False, True, False]
    assert [r.stale_reason for r in results] == [
        None,
        "wrong_worker",
        "wrong_token",
        None,
        "not_leased",
    ]
    assert results[0].job is not None
    assert results[0].job == queue.get(claimed[0].job.job_id)
    assert queue.counts()[JobState.SUCCEEDED] == 2
    assert queue.counts()[JobState.LEASED] == 2
    assert check_database(queue.path).ok
    assert replay_database(queue.path).ok
    clock.advance(LEASE_US)
    expired = queue.succeed_many(
        [Acknowledgement(claimed[1].job.job_id, "w", claimed[1].lease_token)]
    )
    assert expired[0].stale_reason == "lease_expired"


def test_an_all_stale_batch_commits_nothing(make_queue: QueueFactory, db_path: Path) -> None:
    phases: list[Phase] = []
    queue = make_queue(hook=phases.append)
    queue.submit_many(requests(2))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=2)
    phases.clear()
    before = fingerprint(db_path)
    results = queue.succeed_many(
        [Acknowledgement(c.job.job_id, "x", c.lease_token) for c in claimed]
    )
    assert not any(r.accepted for r in results)
    assert phases == []
    assert fingerprint(db_path) == before


def test_succeed_many_refuses_bad_batches(queue: DurableQueue) -> None:
    with pytest.raises(InvalidInput):
        queue.succeed_many([])
    with pytest.raises(InvalidInput):
        queue.succeed_many([Acknowledgement("", "w", "t")])
    with pytest.raises(JobNotFound):
        queue.succeed_many([Acknowledgement("job-none", "w", "t")])


def test_large_acknowledgement_batches_are_read_in_chunks(queue: DurableQueue) -> None:
    queue.submit_many(requests(1200))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=1200)
    results = queue.succeed_many(
        [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    )
    assert all(r.accepted for r in results)
    assert queue.active_count() == 0


def test_succeed_many_and_claim_acknowledges_a_batch_and_leases_the_next_in_one_commit(
    make_queue: QueueFactory, db_path: Path
) -> None:
    phases: list[Phase] = []
    queue = make_queue(hook=phases.append)
    queue.submit_many(requests(5))
    first = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=2)
    acks = [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in first]
    acks.append(Acknowledgement(first[0].job.job_id, "w", "lease-forged"))
    phases.clear()
    results, following = queue.succeed_many_and_claim(
        acks, worker_id="w", lease_duration_us=LEASE_US, limit=2
    )
    assert [r.accepted for r in results] == [True, True, False]
    assert results[2].stale_reason == "not_leased"  # acknowledged earlier in this batch
    assert [c.job.idempotency_key for c in following] == ["k2", "k3"]
    assert [p.value for p in phases] == [
        "BEFORE_SUCCESS_COMMIT",
        "BEFORE_CLAIM_COMMIT",
        "AFTER_SUCCESS_COMMIT",
        "AFTER_CLAIM_COMMIT",
    ]
    # Each transition has its own event, as if claimed and acknowledged one by one.
    for claim in first:
        kinds = [e.event_type for e in queue.history(claim.job.job_id)]
        assert kinds == [EventType.SUBMITTED, EventType.CLAIMED, EventType.SUCCEEDED]
    last, rest = queue.succeed_many_and_claim(
        [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in following],
        worker_id="w",
        lease_duration_us=LEASE_US,
        limit=10,
    )
    assert all(r.accepted for r in last)
    assert len(rest) == 1
    phases.clear()
    done, nothing = queue.succeed_many_and_claim(
        [Acknowledgement(rest[0].job.job_id, "w", rest[0].lease_token)],
        worker_id="w",
        lease_duration_us=LEASE_US,
        limit=10,
    )
    assert (len(done), nothing) == (1, [])
    assert [p.value for p in phases] == ["BEFORE_SUCCESS_COMMIT", "AFTER_SUCCESS_COMMIT"]
    assert queue.counts()[JobState.SUCCEEDED] == 5
    assert check_database(db_path).ok
    assert replay_database(db_path).ok


def test_a_bad_chained_batch_writes_nothing(queue: DurableQueue, db_path: Path) -> None:
    queue.submit_many(requests(2))
    [claim] = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=1)
    ack = Acknowledgement(claim.job.job_id, "w", claim.lease_token)
    before = fingerprint(db_path)
    with pytest.raises(InvalidInput):
        queue.succeed_many_and_claim([], worker_id="w", lease_duration_us=LEASE_US, limit=1)
    with pytest.raises(InvalidInput):
        queue.succeed_many_and_claim([ack], worker_id="w", lease_duration_us=LEASE_US, limit=0)
    with pytest.raises(InvalidInput):
        queue.succeed_many_and_claim([ack], worker_id="", lease_duration_us=LEASE_US, limit=1)
    with pytest.raises(JobNotFound):
        queue.succeed_many_and_claim(
            [ack, Acknowledgement("job-none", "w", "t")],
            worker_id="w",
            lease_duration_us=LEASE_US,
            limit=1,
        )
    assert fingerprint(db_path) == before


def _drain_in_one_batch(queue: DurableQueue, acknowledger: DurableQueue) -> list[bool]:
    queue.submit_many(requests(6))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=4)
    acks = [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    acks.append(acks[1])
    results = acknowledger.succeed_many(acks)
    return [result.accepted for result in results]


def test_a_batch_acknowledged_by_the_handle_that_leased_it_writes_what_any_handle_would(
    tmp_path: Path,
) -> None:
    """The kept leased copies (held.py) change how rows are found, never what is written."""
    dumps = []
    for own_handle in (True, False):
        path = tmp_path / f"own-{own_handle}.sqlite"
        clock = ManualClock(START_US)
        with DurableQueue(path, clock=clock, ids=SeededIds(7, "q"), retry=RETRY) as queue:
            if own_handle:
                accepted = _drain_in_one_batch(queue, queue)
            else:
                with DurableQueue(path, clock=clock, ids=SeededIds(7, "q")) as other:
                    accepted = _drain_in_one_batch(queue, other)
        assert accepted == [True, True, True, True, False]
        assert check_database(path).ok
        assert replay_database(path).ok
        dumps.append(fingerprint(path)[1])
    assert dumps[0] == dumps[1]


def test_a_kept_lease_that_another_handle_ended_is_fenced_from_its_row(
    make_queue: QueueFactory, db_path: Path
) -> None:
    """A handle whose clock lags still believes its leases live; the row decides."""
    queue = make_queue()
    queue.submit_many(requests(3))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=3)
    later = ManualClock(START_US + 2 * LEASE_US)
    with DurableQueue(db_path, clock=later, ids=SeededIds(7, "ahead"), retry=RETRY) as ahead:
        assert len(ahead.recover_expired()) == 3
        later.advance(RETRY.max_delay_us)
        ahead.promote_retries()
        retaken = ahead.claim_many(worker_id="w2", lease_duration_us=LEASE_US, limit=1)
    assert retaken[0].job.job_id == claimed[0].job.job_id
    results = queue.succeed_many(
        [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    )
    assert [r.stale_reason for r in results] == ["wrong_worker", "not_leased", "not_leased"]
    retaken_job = queue.get(retaken[0].job.job_id)
    assert (retaken_job.state, retaken_job.lease_worker_id) == (JobState.LEASED, "w2")
    kinds = [e.event_type for e in queue.history(claimed[0].job.job_id)]
    assert EventType.SUCCEEDED not in kinds
    assert check_database(db_path).ok
    assert replay_database(db_path).ok


def _three_claimed_then(queue: DurableQueue, db_path: Path, tamper: str) -> list[ClaimedJob]:
    """Three jobs leased in one batch, then ``tamper`` run on the middle one's id behind the
    queue's back (a writer the handle never saw)."""
    queue.submit_many(requests(3))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=3)
    conn = raw(db_path)
    try:
        conn.execute(tamper, (claimed[1].job.job_id,))
    finally:
        conn.close()
    return claimed


def test_a_copy_kept_wrong_is_undone_and_the_batch_fenced_again(
    make_queue: QueueFactory, db_path: Path
) -> None:
    """When the guarded update misses a row the kept copy vouched for, the rows the same
    statement did change are rolled back to the savepoint before the batch is fenced again."""
    queue = make_queue()
    # Another lease on the middle job, as a writer the handle never saw would leave it.
    claimed = _three_claimed_then(
        queue, db_path, "UPDATE jobs SET lease_token = 'lease-other' WHERE job_id = ?"
    )
    results = queue.succeed_many(
        [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    )
    assert [r.stale_reason for r in results] == [None, "wrong_token", None]
    for claim, finished in zip(claimed, (True, False, True), strict=True):
        kinds = [e.event_type for e in queue.history(claim.job.job_id)]
        assert kinds.count(EventType.SUCCEEDED) == int(finished)
        attempt = queue.attempts(claim.job.job_id)[-1]
        assert (attempt.outcome is not None) == finished
    assert queue.get(claimed[1].job.job_id).state is JobState.LEASED


def test_a_guarded_write_that_misses_a_row_fails_the_batch_and_writes_nothing(
    make_queue: QueueFactory, db_path: Path
) -> None:
    """A guarded write that changes fewer rows than it must is a damaged store, not a stale
    lease: the batch raises and rolls back whole."""
    queue, other = make_queue(), make_queue(stream="other")
    queue.submit_many(requests(3))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=3)
    # A trigger that silently skips the middle job's update: no queue writes that.
    conn = raw(db_path)
    try:
        conn.execute(
            "CREATE TRIGGER skip_middle BEFORE UPDATE ON jobs"
            f" WHEN old.job_id = '{claimed[1].job.job_id}' BEGIN SELECT RAISE(IGNORE); END"
        )
    finally:
        conn.close()
    before = fingerprint(db_path)
    # Through a handle that kept no copies, so the batch is fenced from the rows alone.
    with pytest.raises(StoreError, match="guarded success changed 2 of 3 rows"):
        other.succeed_many([Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed])
    assert fingerprint(db_path) == before


def test_attempts_are_derived_from_the_events_and_cannot_be_written(
    make_queue: QueueFactory, db_path: Path
) -> None:
    """The attempt rows are a view over the history: nothing can make them disagree with it."""
    queue = make_queue()
    queue.submit_many(requests(2))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=2)
    queue.succeed_many([Acknowledgement(claimed[0].job.job_id, "w", claimed[0].lease_token)])
    before = fingerprint(db_path)
    conn = raw(db_path)
    try:
        for statement in (
            "UPDATE attempts SET outcome = 'FAILED'",
            "DELETE FROM attempts",
            "INSERT INTO attempts (job_id, attempt) VALUES ('job-x', 1)",
        ):
            with pytest.raises(sqlite3.OperationalError, match="attempts because it is a view"):
                conn.execute(statement)
    finally:
        conn.close()
    assert fingerprint(db_path) == before
    done, live = (queue.attempts(claim.job.job_id) for claim in claimed)
    assert [(a.attempt, a.lease_token, a.outcome) for a in done] == [
        (1, claimed[0].lease_token, AttemptOutcome.SUCCEEDED)
    ]
    assert [(a.lease_deadline_us, a.ended_at_us, a.outcome) for a in live] == [
        (claimed[1].lease_deadline_us, None, None)
    ]


def test_a_heartbeat_through_another_handle_keeps_the_batch_lease_live(
    make_queue: QueueFactory, clock: ManualClock
) -> None:
    queue, other = make_queue(), make_queue(stream="other")
    queue.submit_many(requests(3))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=3)
    clock.advance(LEASE_US // 2)
    other.heartbeat(
        job_id=claimed[0].job.job_id,
        worker_id="w",
        lease_token=claimed[0].lease_token,
        lease_duration_us=LEASE_US,
    )
    queue.heartbeat(
        job_id=claimed[1].job.job_id,
        worker_id="w",
        lease_token=claimed[1].lease_token,
        lease_duration_us=LEASE_US,
    )
    clock.advance(LEASE_US // 2)
    results = queue.succeed_many(
        [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    )
    assert [r.stale_reason for r in results] == [None, None, "lease_expired"]
    assert results[0].job == queue.get(claimed[0].job.job_id)
    assert results[1].job == queue.get(claimed[1].job.job_id)


def test_held_leases_keep_the_newest_copies_up_to_their_capacity() -> None:
    def job(job_id: str, token: str) -> Job:
        return Job(
            submit_seq=1,
            job_id=job_id,
            idempotency_key=job_id,
            job_type="t",
            payload_json="{}",
            payload_sha256="0" * 64,
            state=JobState.LEASED,
            attempts=1,
            max_attempts=3,
            available_at_us=0,
            lease_worker_id="w",
            lease_token=token,
            lease_deadline_us=10,
            last_error=None,
            created_at_us=0,
            updated_at_us=0,
        )

    with pytest.raises(ValueError, match="at least one lease"):
        HeldLeases(capacity=0)
    held = HeldLeases(capacity=2)
    held.keep([job("a", "t1"), job("b", "t1"), job("a", "t2"), job("c", "t1")])
    assert len(held) == 2
    assert held.take("b") is None  # the oldest, dropped for "c"
    held.refresh(job("c", "t3"))
    held.refresh(job("d", "t1"))  # never kept: nothing to refresh
    assert len(held) == 2
    kept = held.take("c")
    assert kept is not None
    assert kept.lease_token == "t3"
    assert held.take("c") is None
    a = held.take("a")
    assert a is not None
    assert a.lease_token == "t2"


def test_a_heartbeat_that_shortened_the_lease_elsewhere_is_not_outlived_by_the_kept_copy(
    make_queue: QueueFactory, clock: ManualClock
) -> None:
    """A heartbeat may set a nearer deadline than the claim's. The kept copy still shows the
    claim's deadline as live, so the guard in the update has to check the row's."""
    queue, other = make_queue(), make_queue(stream="other")
    queue.submit_many(requests(2))
    claimed = queue.claim_many(worker_id="w", lease_duration_us=LEASE_US, limit=2)
    other.heartbeat(
        job_id=claimed[0].job.job_id,
        worker_id="w",
        lease_token=claimed[0].lease_token,
        lease_duration_us=LEASE_US // 10,
    )
    clock.advance(LEASE_US // 2)
    results = queue.succeed_many(
        [Acknowledgement(c.job.job_id, "w", c.lease_token) for c in claimed]
    )
    assert [r.stale_reason for r in results] == ["lease_expired", None]
    assert queue.get(claimed[0].job.job_id).state is JobState.LEASED
    assert queue.get(claimed[1].job.job_id).state is JobState.SUCCEEDED
