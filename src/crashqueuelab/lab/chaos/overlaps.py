"""Two live leases on one job at once, proven from the workers' logs alone.

The contract allows at most one live lease per job. A lease a worker was granted is surely
live from the moment its claim returned (it was granted by then) until the earlier of two
moments: its deadline, which is at least the claim call's start plus the lease (the system
cannot have granted it earlier), or the start of its latest accepted heartbeat plus the
lease (an accepted heartbeat found the lease live and moved its deadline), and the moment
the worker began to acknowledge it (from then on it may have ended at any time). A worker
killed while holding it leaves it live until that deadline. If two leases on one job were
each surely live at one same instant, the system granted a second lease while the first was
live, whatever the acknowledgements did afterwards; which was granted first does not matter
(two claim calls in flight at once leave that open).

Every time is the machine's monotonic clock, which all the workers share. A deadline is
counted on the system's own clock, which may drift from it by a few parts per million over
a lease, so a bound that rests on a deadline is taken a margin early.
"""

from __future__ import annotations

from dataclasses import dataclass

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.chaos.worklog import WorkerLog

#: How much earlier than the deadline the monotonic clock can prove a lease still live
#: (seconds): far above the drift between the system's clock and the monotonic clock over a
#: lease, far below a lease.
MARGIN_S = 0.005


@dataclass(frozen=True)
class Grant:
    """One lease as a worker's log bounds it."""

    worker_id: str
    key: str
    token: str
    #: The claim call began; the lease cannot have been granted before.
    asked_at: float
    #: The claim returned; the lease was granted by then.
    returned_at: float
    #: Until then the lease was surely live: neither expired (a margin before the earliest
    #: deadline it can have) nor being acknowledged.
    live_until: float


def grants(logs: dict[str, WorkerLog], lease_s: float) -> list[Grant]:
    """Every lease whose claim line says when its call began (older logs do not)."""
    found = []
    for worker_id, log in logs.items():
        acking = {(key, token): at for at, word, key, token in log.events if word == "acking"}
        for at, word, key, token in log.events:
            asked = log.claim_asked.get((key, token))
            if word != "claim" or asked is None:
                continue
            latest = max(asked, log.extended_asked.get((key, token), asked))
            until = min(latest + lease_s - MARGIN_S, acking.get((key, token), float("inf")))
            found.append(Grant(worker_id, key, token, asked, at, until))
    return found


def overlapping_leases(
    logs: dict[str, WorkerLog], *, lease_s: float, started_s: float = 0.0
) -> list[Anomaly]:
    """One finding per pair of leases on one job that were both surely live at one instant,
    naming both workers, both leases and the job (times in seconds from ``started_s``)."""
    by_key: dict[str, list[Grant]] = {}
    for grant in grants(logs, lease_s):
        by_key.setdefault(grant.key, []).append(grant)
    lines = []
    for key, held in sorted(by_key.items()):
        held.sort(key=lambda grant: (grant.returned_at, grant.worker_id, grant.token))
        for index, first in enumerate(held):
            for second in held[index + 1 :]:
                both_from = max(first.returned_at, second.returned_at)
                both_until = min(first.live_until, second.live_until)
                if both_from >= both_until:
                    continue
                text = (
                    f"job {key}: two live leases from {both_from - started_s:.3f} s to"
                    f" {both_until - started_s:.3f} s at least: {first.worker_id}'s lease"
                    f" {first.token} (claim returned at {first.returned_at - started_s:.3f} s)"
                    f" and {second.worker_id}'s lease {second.token} (claim returned at"
                    f" {second.returned_at - started_s:.3f} s)"
                )
                facts = {"holder": first.worker_id, "worker": second.worker_id}
                lines.append(Anomaly(Kind.OVERLAPPING_LEASES, text, job=key, facts=facts))
    return lines
