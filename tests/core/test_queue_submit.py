"""Idempotent submission: the key is permanent, conflicts write nothing."""

from __future__ import annotations

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
)
from crashqueuelab.judges.invariants import check_database
from tests.conftest import LEASE_US, START_US, fingerprint


def test_submit_creates_a_queued_job_with_canonical_payload(queue: DurableQueue) -> None:
    result = queue.submit(idempotency_key="k1", job_type="t", payload={"b": 1, "a": [1, 2]})
    assert result.created is True
    job = result.job
    assert job.state is JobState.QUEUED
    assert job.payload_json == '{"a":[1,2],"b":1}'
    assert job.payload == {"a": [1, 2], "b": 1}
    assert job.attempts == 0
    assert job.max_attempts == 3
    assert job.available_at_us == START_US
    assert queue.get(job.job_id) == job
    assert [e.event_type for e in queue.history(job.job_id)] == [EventType.SUBMITTED]


def test_resubmitting_the_same_request_returns_the_existing_job(queue: DurableQueue) -> None:
    first = queue.submit(idempotency_key="k", job_type="t", payload={"x": 1})
    again = queue.submit(idempotency_key="k", job_type="t", payload={"x": 1})
    assert again.created is False
    assert again.job == first.job
    assert len(queue.history(first.job.job_id)) == 1


def test_resubmitting_never_resurrects_a_finished_job(queue: DurableQueue) -> None:
    job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    claimed = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
    assert claimed is not None
    queue.succeed(job_id=job.job_id, worker_id="w", lease_token=claimed.lease_token)
    again = queue.submit(idempotency_key="k", job_type="t", payload={})
    assert again.created is False
    assert again.job.state is JobState.SUCCEEDED
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is None


@pytest.mark.parametrize(
    ("job_type", "payload", "max_attempts", "differing"),
    [
        ("other", {"x": 1}, 3, ("job_type",)),
        ("t", {"x": 2}, 3, ("payload",)),
        ("t", {"x": 1}, 4, ("max_attempts",)),
        ("u", {"y": 1}, 1, ("job_type", "payload", "max_attempts")),
    ],
)
def test_reusing_a_key_for_a_different_request_conflicts_and_writes_nothing(
    queue: DurableQueue,
    db_path: Path,
    job_type: str,
    payload: dict[str, int],
    max_attempts: int,
    differing: tuple[str, ...],
) -> None:
    original = queue.submit(idempotency_key="k", job_type="t", payload={"x": 1}).job
    before = fingerprint(db_path)
    with pytest.raises(IdempotencyConflict) as caught:
        queue.submit(
            idempotency_key="k", job_type=job_type, payload=payload, max_attempts=max_attempts
        )
    assert caught.value.differing == differing
    assert caught.value.job_id == original.job_id
    assert fingerprint(db_path) == before


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "   "}, "idempotency_key"),
        ({"idempotency_key": "x" * 513}, "idempotency_key"),
        ({"idempotency_key": "a\x00b"}, "idempotency_key"),
        ({"idempotency_key": 5}, "idempotency_key"),
        ({"job_type": ""}, "job_type"),
        ({"payload": []}, "payload"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"payload": {"x": float("inf")}}, "payload"),
        ({"payload": {1: "int key"}}, "payload"),
        ({"payload": {"t": (1, 2)}}, "payload"),
        ({"payload": {"big": "x" * 70_000}}, "payload"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": 1001}, "max_attempts"),
    ],
)
def test_invalid_submissions_are_refused_before_any_write(
    queue: DurableQueue, db_path: Path, arguments: dict[str, object], field: str
) -> None:
    queue.submit(idempotency_key="existing", job_type="t", payload={})
    before = fingerprint(db_path)
    request: dict[str, object] = {"idempotency_key": "new", "job_type": "t", "payload": {}}
    request.update(arguments)
    with pytest.raises(InvalidInput) as caught:
        queue.submit(**request)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert fingerprint(db_path) == before


def test_unknown_job_ids_raise_job_not_found(queue: DurableQueue) -> None:
    with pytest.raises(JobNotFound):
        queue.get("job-missing")
    with pytest.raises(JobNotFound):
        queue.history("job-missing")
    with pytest.raises(JobNotFound):
        queue.attempts("job-missing")


def test_two_queues_on_one_file_share_idempotency(db_path: Path) -> None:
    clock = ManualClock(START_US)
    with DurableQueue(db_path, clock=clock) as one, DurableQueue(db_path, clock=clock) as two:
        first = one.submit(idempotency_key="shared", job_type="t", payload={"v": 1})
        second = two.submit(idempotency_key="shared", job_type="t", payload={"v": 1})
    assert second.created is False
    assert second.job.job_id == first.job.job_id
    assert check_database(db_path).ok
