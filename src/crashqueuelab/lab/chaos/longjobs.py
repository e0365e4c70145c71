"""Long jobs: a few jobs of every chaos run whose handler outlives its lease and keeps it
alive with heartbeats.

Without them a chaos worker never heartbeats, and a queue whose heartbeat moves the deadline
only where the holder can see it (its own memory, an uncommitted write) passes: recovery in
another process still finds the old deadline and hands the job to a second worker while the
first still works on it. A long job's handler runs for ``WORK_LEASES`` leases; its worker
heartbeats every claim it holds a few times a lease and logs each accepted heartbeat with the
moment it was asked (``worklog.py``), which proves the lease live until that moment plus a
lease (``overlaps.py``). A refused heartbeat means the lease is gone (a pause outlived it):
the worker logs the refusal and drops the job, as a real worker abandons a lost lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from crashqueuelab.lab.chaos.worklog import lease_line
from crashqueuelab.systems.contract import Claim, QueueClient

#: Long jobs among a chaos run's jobs unless told otherwise (where the system heartbeats).
DEFAULT_LONG_JOBS = 3
#: How long a long job's handler works, in leases.
WORK_LEASES = 2.5
#: Heartbeats per lease while a long job works.
HEARTBEATS_PER_LEASE = 3
PAYLOAD_FIELD = "work_leases"


def long_indexes(jobs: int, count: int) -> set[int]:
    """Which of ``jobs`` jobs are long: ``count`` of them, spread over the run."""
    count = min(count, jobs)
    return {index * jobs // count for index in range(count)} if count else set()


def long_payload() -> dict[str, float]:
    """What a long job's payload carries besides its effect."""
    return {PAYLOAD_FIELD: WORK_LEASES}


def work_leases(payload: dict[str, Any]) -> float | None:
    value = payload.get(PAYLOAD_FIELD)
    return float(value) if isinstance(value, int | float) and value > 0 else None


def work_long(
    client: QueueClient,
    claims: Sequence[Claim],
    lease_s: float,
    log: TextIO,
    *,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Claim]:
    """Run the long jobs among ``claims``, heartbeating every claim held meanwhile; the
    claims still held at the end (the others were refused a heartbeat)."""
    longest = max((work_leases(claim.payload) or 0.0 for claim in claims), default=0.0)
    if not longest:
        return list(claims)
    held = list(claims)
    every = lease_s / HEARTBEATS_PER_LEASE
    ends = now() + longest * lease_s
    lease_us = round(lease_s * 1_000_000)
    while held and now() < ends:
        sleep(min(every, max(0.0, ends - now())))
        kept = []
        for claim in held:
            asked = now()
            alive = client.heartbeat(claim, lease_us)
            answered = now()
            if alive:
                log.write(lease_line("heartbeat", claim.key, claim.token, answered, asked))
                kept.append(claim)
            else:
                log.write(lease_line("stale", claim.key, claim.token, answered))
        held = kept
    return held
