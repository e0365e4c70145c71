"""Functions that run inside spawned test processes (they must be importable by name)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path

from crashqueuelab import DurableQueue
from crashqueuelab.core import requestslots, turns
from crashqueuelab.core.hooks import Phase
from crashqueuelab.core.turns import TurnLock
from crashqueuelab.lab.faults.hooks import CRASH_EXIT_CODE

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


def _announce_ticket(in_line: Event) -> None:
    """Set ``in_line`` once this process holds a ticket (and has posted its request); and
    never skip the test's turn as stuck, however long it holds the line while the other
    processes start."""
    turns.STUCK_AFTER_S = 3600.0
    take = TurnLock._take_ticket

    def announcing(
        lock: TurnLock, request: Callable[[], bytes] | None, deadline: float
    ) -> tuple[int, bool]:
        taken = take(lock, request, deadline)
        in_line.set()
        return taken

    setattr(TurnLock, "_take_ticket", announcing)  # noqa: B010 (this spawned child only)


def claim_one(database: str, worker_id: str, record: str, in_line: Event) -> None:
    """Claim one job and record it (without a hook, the claim is posted for a carrier)."""
    _announce_ticket(in_line)
    with DurableQueue(database) as queue:
        claimed = queue.claim(worker_id=worker_id, lease_duration_us=60_000_000)
        held = (
            None
            if claimed is None
            else {"job_id": claimed.job.job_id, "token": claimed.lease_token}
        )
        Path(record).write_text(json.dumps(held))


def carry_and_die(database: str, worker_id: str, slots_record: str, in_line: Event) -> None:
    """Claim one job, and die with ``os._exit`` just before COMMIT, after recording how the
    request slots of the line stand then (what this carrier took into its transaction)."""

    def hook(phase: str) -> None:
        if phase == Phase.BEFORE_CLAIM_COMMIT:
            fd = os.open(f"{database}-turns", os.O_RDONLY)
            taken = int.from_bytes(os.pread(fd, 8, 0), "little")
            headers = [requestslots.read_header(fd, ticket) for ticket in range(taken)]
            os.close(fd)
            slots = [[h.ticket, h.state.name, h.result_length] for h in headers]
            Path(slots_record).write_text(json.dumps(slots))
            os._exit(CRASH_EXIT_CODE)

    _announce_ticket(in_line)
    # A hooked queue posts nothing: it runs its own transaction and carries those behind it.
    with DurableQueue(database, hook=hook) as queue:
        queue.claim(worker_id=worker_id, lease_duration_us=60_000_000)
