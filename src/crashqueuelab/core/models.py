"""The persisted states and the immutable records that cross module boundaries."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """The five durable states of a job."""

    QUEUED = "QUEUED"
    LEASED = "LEASED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    SUCCEEDED = "SUCCEEDED"
    DEAD = "DEAD"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.DEAD)


class EventType(StrEnum):
    """What an appended history event records."""

    SUBMITTED = "SUBMITTED"
    CLAIMED = "CLAIMED"
    HEARTBEAT = "HEARTBEAT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    PROMOTED = "PROMOTED"


class AttemptOutcome(StrEnum):
    """How an attempt ended; an open attempt has none yet."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"


@dataclass(frozen=True)
class Job:
    """The materialised current state of one job (a row of ``jobs``)."""

    job_id: str
    submit_seq: int
    idempotency_key: str
    job_type: str
    payload_json: str
    payload_sha256: str
    state: JobState
    attempts: int
    max_attempts: int
    available_at_us: int
    lease_worker_id: str | None
    lease_token: str | None
    lease_deadline_us: int | None
    last_error: str | None
    created_at_us: int
    updated_at_us: int

    @property
    def payload(self) -> dict[str, Any]:
        """A fresh copy of the payload object."""
        value: dict[str, Any] = json.loads(self.payload_json)
        return value


@dataclass(frozen=True)
class Attempt:
    """One execution attempt (a row of ``attempts``)."""

    job_id: str
    attempt: int
    worker_id: str
    lease_token: str
    claimed_at_us: int
    lease_deadline_us: int
    ended_at_us: int | None
    outcome: AttemptOutcome | None
    error: str | None


@dataclass(frozen=True)
class Event:
    """One appended transition (a row of ``events``)."""

    seq: int
    job_id: str
    event_type: EventType
    from_state: JobState | None
    to_state: JobState
    at_us: int
    attempt: int
    worker_id: str | None
    lease_token: str | None
    lease_deadline_us: int | None
    available_at_us: int | None
    error: str | None


@dataclass(frozen=True)
class SubmitResult:
    """What ``submit`` returns: the job, and whether this call created it."""

    job: Job
    created: bool


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to the caller, with the token that fences every later operation."""

    job: Job
    lease_token: str
    lease_deadline_us: int
    attempt: int


@dataclass(frozen=True)
class Acknowledgement:
    """One item of ``succeed_many``: which lease acknowledges which job."""

    job_id: str
    worker_id: str
    lease_token: str


@dataclass(frozen=True)
class AckResult:
    """How one acknowledgement of a batch ended: the finished job, or why it was fenced off."""

    job_id: str
    job: Job | None
    stale_reason: str | None

    @property
    def accepted(self) -> bool:
        return self.job is not None


def to_json(record: object) -> dict[str, Any]:
    """A JSON-ready dict of a record; nested records become nested dicts."""
    result: dict[str, Any] = {}
    for field in fields(record):  # type: ignore[arg-type]
        value = getattr(record, field.name)
        if hasattr(value, "__dataclass_fields__"):
            value = to_json(value)
        result[field.name] = value
    if isinstance(record, Job):
        result["payload"] = record.payload
        del result["payload_json"]
    return result
