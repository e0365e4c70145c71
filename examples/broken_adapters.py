"""Two deliberately broken TinyQueues, to show what the lab says about a queue that is wrong.

- ``stale_ack_system``: an acknowledgement is accepted from anyone while the job is leased,
  whoever holds the lease now and whenever it expired (no fencing);
- ``losing_system``: recovery deletes a job whose lease expired instead of retrying it
  (as huey's storage deletes a job when it is taken);
- ``raising_system``: every claim raises;
- ``open_raising_system`` and ``recover_raising_system``: opening the store, or recovery,
  raises (an ``OSError``, a ``RuntimeError``);
- ``racy_claim_system``: a claim reads the oldest ready job, then marks it leased in a second
  step without checking it is still ready, so two workers can hold live leases on one job
  (fencing by token still refuses the first one's acknowledgement: nothing is lost and
  nothing acknowledged twice, and only the workers' logs show the two leases).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from functools import partial
from typing import Any

from tiny_adapter import TinyClient, tiny_system
from tiny_queue import TinyQueue

from crashqueuelab.systems import Claim, CrashPoint, ExpectedState, OpenRequest, System


class UnfencedQueue(TinyQueue):
    def ack(self, key: str, token: str, now: int) -> bool:
        # The planted bug: no token, no deadline. Whoever asks finishes the job.
        changed = self._write(
            "UPDATE jobs SET state = 'done', owner = NULL, token = NULL, deadline = NULL"
            " WHERE key = ? AND state IN ('leased', 'ready')",
            (key,),
        )
        return changed == 1


class LosingQueue(TinyQueue):
    def expire(self, now: int) -> int:
        # The planted bug: an expired job is dropped instead of being offered again.
        return self._write("DELETE FROM jobs WHERE state = 'leased' AND deadline <= ?", (now,))


def stale_ack_system() -> System:
    return replace(
        tiny_system(),
        name="tinyqueue-unfenced",
        open=partial(TinyClient, queue_class=UnfencedQueue),
    )


def losing_system() -> System:
    return replace(
        tiny_system(), name="tinyqueue-losing", open=partial(TinyClient, queue_class=LosingQueue)
    )


class RaisingClient(TinyClient):
    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        raise RuntimeError("the queue's claim is broken")


def raising_system() -> System:
    """A queue whose every claim raises: the lab reports it and stops, never hangs."""
    return replace(tiny_system(), name="tinyqueue-raising", open=RaisingClient)


class RacyClaimQueue(TinyQueue):
    def claim(self, owner: str, now: int, lease: int) -> dict[str, Any] | None:
        # The planted bug: read, then write, with nothing between them held.
        row = self.db.execute(
            "SELECT key FROM jobs WHERE state = 'ready' AND available_at <= ?"
            " ORDER BY available_at, key LIMIT 1",
            (now,),
        ).fetchone()
        if row is None:
            return None
        token = uuid.uuid4().hex
        # It does not take a finished job back, but it takes a leased one: the read said ready.
        changed = self._write(
            "UPDATE jobs SET state = 'leased', attempts = attempts + 1, owner = ?, token = ?,"
            " deadline = ? WHERE key = ? AND state IN ('ready', 'leased')",
            (owner, token, now + lease, row[0]),
        )
        return {**self.get(row[0]), "token": token} if changed == 1 else None


def racy_claim_system() -> System:
    """A claim in two steps without exclusion: two live leases on one job."""
    return replace(
        tiny_system(),
        name="tinyqueue-racy-claim",
        open=partial(TinyClient, queue_class=RacyClaimQueue),
    )


class OpenRaisingClient(TinyClient):
    def __init__(self, request: OpenRequest) -> None:
        raise OSError(5, "Input/output error", "the queue's file")


def open_raising_system() -> System:
    """A queue whose open fails: every call the lab makes is the system's failure."""
    return replace(tiny_system(), name="tinyqueue-open-raises", open=OpenRaisingClient)


class RecoverRaisingClient(TinyClient):
    def recover(self) -> int:
        raise RuntimeError("the queue's recovery is broken")


def recover_raising_system() -> System:
    """A queue whose recovery raises."""
    return replace(tiny_system(), name="tinyqueue-recover-raises", open=RecoverRaisingClient)


def unreached_point_system() -> System:
    """An adapter that declares a crash point its client never passes to the hook (TinyQueue
    has no compaction): the campaign says so, and names the points that were reached."""
    shipped = tiny_system()
    phantom = CrashPoint("compact:after", "after a compaction TinyQueue never runs",
                         ExpectedState(None, None, 0))  # fmt: skip
    return replace(
        shipped, name="tinyqueue-unreached-point", crash_points=(*shipped.crash_points, phantom)
    )
