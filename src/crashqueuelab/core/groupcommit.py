"""Group commit across processes: what a waiting writer posts, and what its carrier notes.

SQLite commits one transaction at a time, each with its own fsync; under contention a
single claim or acknowledgement spends most of its turn in that fsync. So a writer waiting
in line posts its request (turns.py, requestslots.py), and the writer being served runs
the requests posted right behind it inside its own transaction (``DurableQueue._carry``).
A carried transition runs the same code as its writer would have and writes the same job
row and single event, under the same guards; only the COMMIT is shared.

A claim's result is the claimed job's row (its writer needs the job as the claim left it,
and the row may change as soon as the lease ends); an acknowledgement's is empty (a
SUCCEEDED row never changes again, so its writer reads it back); an acknowledgement with
the next claim (``succeed_and_claim``) has the claim's. Requests carry the
writer's own lease token and clock reading, so a carried transition records exactly what
its writer's own transaction would have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from crashqueuelab.core.models import ClaimedJob, Job
from crashqueuelab.core.requestslots import RESULT_MAX
from crashqueuelab.core.rows import decode_job

_CLAIM = "claim"
_SUCCESS = "succeed"
_CHAIN = "succeed_and_claim"
_JOB_FIELDS = tuple(field.name for field in fields(Job))
_STATE = _JOB_FIELDS.index("state")
_NO_JOB = b"null"
#: A carried acknowledgement's result once its transitions ran: never empty, so a writer
#: whose carrier vanished tells "ran, maybe committed" from "taken, never run" (a slot
#: taken and not noted reads as empty), and judges its request by its own result.
APPLIED = b"applied"


@dataclass
class SharedCommits:
    """What group commit did for one queue handle since it opened, for reports (the chaos
    workers log it): the evidence that the commits were shared, and that the window where
    a carrier vanishes with a request taken was crossed, and how each such request ended."""

    #: Other writers' transitions that this handle's commits carried.
    carried_for_others: int = 0
    #: This handle's transitions that another writer's commit carried.
    carried_by_others: int = 0
    #: This handle's requests taken by a carrier that then vanished (died, or was skipped
    #: as stuck) before finishing them: found committed by the carrier, or run again here.
    carrier_vanished_applied: int = 0
    carrier_vanished_rerun: int = 0


@dataclass(frozen=True)
class ClaimRequest:
    worker_id: str
    lease_token: str
    lease_us: int
    now_us: int


@dataclass(frozen=True)
class SuccessRequest:
    job_id: str
    worker_id: str
    lease_token: str
    now_us: int


@dataclass(frozen=True)
class ChainRequest:
    """An acknowledgement and the same worker's next claim, in one transaction."""

    job_id: str
    worker_id: str
    lease_token: str
    next_token: str
    lease_us: int
    now_us: int


Request = ClaimRequest | SuccessRequest | ChainRequest


def _encode(values: list[Any]) -> bytes:
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def claim_request(worker_id: str, lease_token: str, lease_us: int, now_us: int) -> bytes:
    return _encode([_CLAIM, worker_id, lease_token, lease_us, now_us])


def success_request(job_id: str, worker_id: str, lease_token: str, now_us: int) -> bytes:
    return _encode([_SUCCESS, job_id, worker_id, lease_token, now_us])


def chain_request(
    job_id: str, worker_id: str, lease_token: str, next_token: str, lease_us: int, now_us: int
) -> bytes:
    return _encode([_CHAIN, job_id, worker_id, lease_token, next_token, lease_us, now_us])


def _typed(values: list[Any], kinds: tuple[type, ...]) -> bool:
    return len(values) == len(kinds) and all(
        type(value) is kind for value, kind in zip(values, kinds, strict=True)
    )


def decode_request(data: bytes) -> Request | None:
    """The request ``data`` holds, or None for anything else (a damaged slot, or a request
    of another version): the carrier gives it back and its writer runs it itself."""
    try:
        kind, *values = json.loads(data)
    except (ValueError, TypeError):
        return None
    if kind == _CLAIM and _typed(values, (str, str, int, int)):
        return ClaimRequest(*values)
    if kind == _SUCCESS and _typed(values, (str, str, str, int)):
        return SuccessRequest(*values)
    if kind == _CHAIN and _typed(values, (str, str, str, str, int, int)):
        return ChainRequest(*values)
    return None


def encode_claim(claimed: ClaimedJob | None) -> bytes | None:
    """A carried claim's result: the claimed row, or None when it does not fit its slot."""
    if claimed is None:
        return _NO_JOB
    job = claimed.job
    row = [getattr(job, name) for name in _JOB_FIELDS]
    row[_STATE] = job.state.value
    encoded = _encode(row)
    return encoded if len(encoded) <= RESULT_MAX else None


def decode_claim(result: bytes, lease_token: str) -> ClaimedJob | None:
    """The claim ``result`` describes (None: there was no job to claim)."""
    row = json.loads(result)
    if row is None:
        return None
    job = decode_job(tuple(row))
    if job.lease_token != lease_token or job.lease_deadline_us is None:
        raise ValueError("a carried claim's row names another lease")
    return ClaimedJob(
        job=job,
        lease_token=lease_token,
        lease_deadline_us=job.lease_deadline_us,
        attempt=job.attempts,
    )
