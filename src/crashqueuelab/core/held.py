"""The leases one queue handle granted on the batched path, kept until they are acknowledged.

Acknowledging a batch needs each job's current row: to fence the acknowledgement and to
return the finished record. The handle that leased the batch wrote those rows itself, and
while a (worker, token) pair holds a lease its row changes only by a heartbeat, which moves
the deadline; every other change ends the lease or issues a new token. So the leased copies
kept here can stand in for reading and decoding the rows again, about a tenth of a batched
job's time (docs/performance.md).

They are a hint, never evidence. A kept copy is used only while it shows a live lease for
the acknowledging pair; the acknowledgement's ``UPDATE`` still carries the whole live-lease
guard; and a batch in which any kept copy turns out wrong is rolled back to a savepoint and
fenced again from rows read under the same write lock (batches.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from crashqueuelab.core.models import Job

#: Leases kept at most; beyond it the oldest are dropped (an acknowledgement of a dropped
#: lease reads its row, as one made through another handle does). One batch's worth of
#: the largest batch a caller may claim.
CAPACITY = 10_000


class HeldLeases:
    """Leased copies of jobs by id, oldest first, at most ``capacity`` of them."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"keep room for at least one lease, not {capacity}")
        self.capacity = capacity
        self._jobs: dict[str, Job] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def keep(self, jobs: Iterable[Job]) -> None:
        """Remember ``jobs`` as leased just now (a job leased again replaces its old copy)."""
        for job in jobs:
            self._jobs.pop(job.job_id, None)
            self._jobs[job.job_id] = job
        while len(self._jobs) > self.capacity:
            del self._jobs[next(iter(self._jobs))]

    def refresh(self, job: Job) -> None:
        """Replace the kept copy of ``job`` (its lease extended by a heartbeat), if kept."""
        if job.job_id in self._jobs:
            self._jobs[job.job_id] = job

    def take(self, job_id: str) -> Job | None:
        """The kept copy of ``job_id``, forgotten here: an acknowledgement uses it once."""
        return self._jobs.pop(job_id, None)
