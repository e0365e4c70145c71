"""Decoding rows into records: the one place that turns stored text back into states."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from crashqueuelab.core.errors import StoreError
from crashqueuelab.core.models import Attempt, AttemptOutcome, Event, EventType, Job, JobState
from crashqueuelab.core.records import filler
from crashqueuelab.core.schema import ATTEMPT_FIELDS

JOB_COLUMNS = (
    "job_id, submit_seq, idempotency_key, job_type, payload_json, payload_sha256, state,"
    " attempts, max_attempts, available_at_us, lease_worker_id, lease_token,"
    " lease_deadline_us, last_error, created_at_us, updated_at_us"
)
ATTEMPT_COLUMNS = ATTEMPT_FIELDS
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


_JOB_FIELDS = tuple(field.name for field in fields(Job))
_JOB_STATES = {state.value: state for state in JobState}
_job_from = filler(Job)


def decode_job(row: tuple[Any, ...]) -> Job:
    values = dict(zip(_JOB_FIELDS, row, strict=True))
    state = _JOB_STATES.get(values["state"])
    if state is None:
        raise StoreError("<row>", f"unknown JobState {values['state']!r} in the store")
    values["state"] = state
    return _job_from(values)


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


def decode_leased(
    row: tuple[Any, ...], *, worker_id: str, token: str, deadline: int, now: int
) -> Job:
    """The job of a QUEUED ``row`` as the claim leasing it leaves it: LEASED to
    ``worker_id``, one more attempt. One record instead of decoding the row and copying it."""
    values = dict(zip(_JOB_FIELDS, row, strict=True))
    values.update(
        state=JobState.LEASED,
        attempts=values["attempts"] + 1,
        lease_worker_id=worker_id,
        lease_token=token,
        lease_deadline_us=deadline,
        updated_at_us=now,
    )
    return _job_from(values)


def finished_copy(job: Job, *, state: JobState, now: int) -> Job:
    """``job`` after its lease ended in ``state`` with the same retry time."""
    values = dict(job.__dict__)
    values.update(
        state=state,
        lease_worker_id=None,
        lease_token=None,
        lease_deadline_us=None,
        updated_at_us=now,
    )
    return _job_from(values)
