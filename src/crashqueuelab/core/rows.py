"""Decoding rows into records: the one place that turns stored text back into states."""

from __future__ import annotations

from typing import Any, TypeVar

from crashqueuelab.core.errors import StoreError
from crashqueuelab.core.models import Attempt, AttemptOutcome, Event, EventType, Job, JobState

JOB_COLUMNS = (
    "job_id, submit_seq, idempotency_key, job_type, payload_json, payload_sha256, state,"
    " attempts, max_attempts, available_at_us, lease_worker_id, lease_token,"
    " lease_deadline_us, last_error, created_at_us, updated_at_us"
)
ATTEMPT_COLUMNS = (
    "job_id, attempt, worker_id, lease_token, claimed_at_us, lease_deadline_us,"
    " ended_at_us, outcome, error"
)
_E = TypeVar("_E", JobState, EventType, AttemptOutcome)

EVENT_COLUMNS = (
    "seq, job_id, event_type, from_state, to_state, at_us, attempt, worker_id,"
    " lease_token, lease_deadline_us, available_at_us, error"
)


def _enum(kind: type[_E], value: Any) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise StoreError("<row>", f"unknown {kind.__name__} {value!r} in the store") from None


def decode_job(row: tuple[Any, ...]) -> Job:
    values = list(row)
    values[6] = _enum(JobState, values[6])
    return Job(*values)


def decode_attempt(row: tuple[Any, ...]) -> Attempt:
    values = list(row)
    if values[7] is not None:
        values[7] = _enum(AttemptOutcome, values[7])
    return Attempt(*values)


def decode_event(row: tuple[Any, ...]) -> Event:
    values = list(row)
    values[2] = _enum(EventType, values[2])
    if values[3] is not None:
        values[3] = _enum(JobState, values[3])
    values[4] = _enum(JobState, values[4])
    return Event(*values)


# dataclasses.replace re-validates every field through __init__ by keyword; these two
# copies sit on the batched hot path, so they build the record positionally instead.


def leased_copy(job: Job, *, worker_id: str, token: str, deadline: int, now: int) -> Job:
    """``job`` as a claim leaves it: LEASED to ``worker_id``, one more attempt."""
    return Job(
        job.job_id,
        job.submit_seq,
        job.idempotency_key,
        job.job_type,
        job.payload_json,
        job.payload_sha256,
        JobState.LEASED,
        job.attempts + 1,
        job.max_attempts,
        job.available_at_us,
        worker_id,
        token,
        deadline,
        job.last_error,
        job.created_at_us,
        now,
    )


def finished_copy(job: Job, *, state: JobState, now: int) -> Job:
    """``job`` after its lease ended in ``state`` with the same retry time."""
    return Job(
        job.job_id,
        job.submit_seq,
        job.idempotency_key,
        job.job_type,
        job.payload_json,
        job.payload_sha256,
        state,
        job.attempts,
        job.max_attempts,
        job.available_at_us,
        None,
        None,
        None,
        job.last_error,
        job.created_at_us,
        now,
    )
