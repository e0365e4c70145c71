"""Functions that run inside spawned test processes (they must be importable by name)."""

from __future__ import annotations

import json
from multiprocessing.synchronize import Barrier
from pathlib import Path

from crashqueuelab import DurableQueue

BARRIER_TIMEOUT_S = 60


def claim_until_empty(database: str, worker_id: str, barrier: Barrier, record: str) -> None:
    """Open a connection of our own, wait for everyone, then claim and succeed until empty."""
    claims = []
    with DurableQueue(database) as queue:
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        while (
            claimed := queue.claim(worker_id=worker_id, lease_duration_us=60_000_000)
        ) is not None:
            claims.append({"job_id": claimed.job.job_id, "token": claimed.lease_token})
            queue.succeed(
                job_id=claimed.job.job_id, worker_id=worker_id, lease_token=claimed.lease_token
            )
    Path(record).write_text(json.dumps(claims))
