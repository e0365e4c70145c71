"""Lease fencing: only the live lease holder may heartbeat, succeed or fail a job.

A worker can outlive its lease (paused, slow, partitioned). Expiry lets recovery hand the
job to someone else; it does not stop the old process. So every lease-holder operation
presents the worker id and the opaque lease token it was given, and is accepted only while
the job is still LEASED to exactly that pair and the deadline has not passed.
"""

from __future__ import annotations

from crashqueuelab.core.errors import StaleLease, StaleReason
from crashqueuelab.core.models import Job, JobState


def live_lease_guard(worker_id: str = "?", lease_token: str = "?") -> str:
    """The live-lease rule as SQL, for ``UPDATE jobs ... WHERE <key> AND <guard>``.

    The pair is two parameters by default, or two columns of a list of rows being
    acknowledged together (multirow.py); the time is always a parameter, the last one.
    """
    return (
        f"state = 'LEASED' AND lease_worker_id = {worker_id} AND lease_token = {lease_token}"
        " AND lease_deadline_us > ?"
    )


#: The same rule as ``stale_lease`` for one job; its parameters are (worker_id, lease_token,
#: now_us). The queue applies it inside the write transaction and calls
#: ``require_live_lease`` only to explain a guard that did not match.
LIVE_LEASE_GUARD = live_lease_guard()


def stale_lease(job: Job, *, worker_id: str, lease_token: str, now_us: int) -> StaleLease | None:
    """Why (worker_id, lease_token) holds no live lease on ``job``; None when it does."""
    if job.state is not JobState.LEASED:
        return StaleLease(
            job.job_id, worker_id, StaleReason.NOT_LEASED, f"job is {job.state.value}"
        )
    if job.lease_worker_id != worker_id:
        return StaleLease(
            job.job_id,
            worker_id,
            StaleReason.WRONG_WORKER,
            f"leased to {job.lease_worker_id!r}, not {worker_id!r}",
        )
    if job.lease_token != lease_token:
        return StaleLease(
            job.job_id, worker_id, StaleReason.WRONG_TOKEN, "lease token is not the current one"
        )
    deadline = job.lease_deadline_us
    if deadline is None or now_us >= deadline:
        return StaleLease(
            job.job_id,
            worker_id,
            StaleReason.LEASE_EXPIRED,
            f"lease deadline {deadline} is not after now {now_us}",
        )
    return None


def require_live_lease(job: Job, *, worker_id: str, lease_token: str, now_us: int) -> None:
    """Raise StaleLease unless (worker_id, lease_token) holds an unexpired lease on ``job``."""
    stale = stale_lease(job, worker_id=worker_id, lease_token=lease_token, now_us=now_us)
    if stale is not None:
        raise stale
