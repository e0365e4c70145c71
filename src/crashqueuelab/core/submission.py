"""Submission: validating requests up front, then inserting or matching them by key."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashqueuelab.core.errors import IdempotencyConflict, InvalidInput
from crashqueuelab.core.history import append_event
from crashqueuelab.core.ids import IdGenerator
from crashqueuelab.core.models import EventType, Job, JobState, SubmitResult
from crashqueuelab.core.payloads import canonical_json, payload_digest
from crashqueuelab.core.rows import JOB_COLUMNS, decode_job
from crashqueuelab.core.validation import MAX_ATTEMPTS_LIMIT, require_int, require_name

#: Most requests one ``submit_many`` transaction may carry.
MAX_BATCH = 10_000

_FIELDS = frozenset({"idempotency_key", "job_type", "payload", "max_attempts"})
_INSERT_JOB = (
    "INSERT INTO jobs (job_id, idempotency_key, job_type, payload_json, payload_sha256, state,"
    " attempts, max_attempts, available_at_us, created_at_us, updated_at_us)"
    " VALUES (?, ?, ?, ?, ?, 'QUEUED', 0, ?, ?, ?, ?) RETURNING submit_seq"
)


@dataclass(frozen=True)
class PreparedSubmission:
    """A validated request: its canonical payload and digest are computed once."""

    idempotency_key: str
    job_type: str
    canonical_payload: str
    payload_sha256: str
    max_attempts: int


def prepare(request: Mapping[str, Any]) -> PreparedSubmission:
    """Validate one request; InvalidInput before anything is written."""
    if not isinstance(request, Mapping):
        raise InvalidInput("request", f"must be a mapping, got {type(request).__name__}")
    unknown = sorted(set(request) - _FIELDS)
    if unknown:
        raise InvalidInput("request", f"unknown fields {unknown}")
    for name in ("idempotency_key", "job_type", "payload"):
        if name not in request:
            raise InvalidInput(name, "is required")
    canonical = canonical_json(request["payload"])
    return PreparedSubmission(
        idempotency_key=require_name("idempotency_key", request["idempotency_key"]),
        job_type=require_name("job_type", request["job_type"]),
        canonical_payload=canonical,
        payload_sha256=payload_digest(canonical),
        max_attempts=require_int(
            "max_attempts", request.get("max_attempts", 3), minimum=1, maximum=MAX_ATTEMPTS_LIMIT
        ),
    )


def prepare_batch(requests: object) -> list[PreparedSubmission]:
    """Validate every request of a batch before any of them is written."""
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise InvalidInput("requests", "must be a sequence of request mappings")
    if not 1 <= len(requests) <= MAX_BATCH:
        raise InvalidInput("requests", f"must hold 1 to {MAX_BATCH} requests, got {len(requests)}")
    return [prepare(request) for request in requests]


def submit_in_transaction(
    conn: sqlite3.Connection, item: PreparedSubmission, *, ids: IdGenerator, now: int
) -> SubmitResult:
    """Insert ``item``, or return the job its key names; IdempotencyConflict if it differs."""
    row = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = ?", (item.idempotency_key,)
    ).fetchone()
    if row is not None:
        existing = decode_job(row)
        differing = tuple(
            name
            for name, same in (
                ("job_type", existing.job_type == item.job_type),
                ("payload", existing.payload_sha256 == item.payload_sha256),
                ("max_attempts", existing.max_attempts == item.max_attempts),
            )
            if not same
        )
        if differing:
            raise IdempotencyConflict(item.idempotency_key, existing.job_id, differing)
        return SubmitResult(job=existing, created=False)
    job_id = ids.job_id()
    submit_seq = conn.execute(
        _INSERT_JOB,
        (
            job_id,
            item.idempotency_key,
            item.job_type,
            item.canonical_payload,
            item.payload_sha256,
            item.max_attempts,
            now,
            now,
            now,
        ),
    ).fetchone()[0]
    append_event(
        conn,
        job_id=job_id,
        event_type=EventType.SUBMITTED,
        from_state=None,
        to_state=JobState.QUEUED,
        at_us=now,
        attempt=0,
        available_at_us=now,
        detail={
            "idempotency_key": item.idempotency_key,
            "job_type": item.job_type,
            "max_attempts": item.max_attempts,
            "payload_sha256": item.payload_sha256,
        },
    )
    job = Job(
        job_id=job_id,
        submit_seq=int(submit_seq),
        idempotency_key=item.idempotency_key,
        job_type=item.job_type,
        payload_json=item.canonical_payload,
        payload_sha256=item.payload_sha256,
        state=JobState.QUEUED,
        attempts=0,
        max_attempts=item.max_attempts,
        available_at_us=now,
        lease_worker_id=None,
        lease_token=None,
        lease_deadline_us=None,
        last_error=None,
        created_at_us=now,
        updated_at_us=now,
    )
    return SubmitResult(job=job, created=True)
