"""How many jobs a worker's next batch asks for.

A batch shares its two commits (the claim's and the acknowledgement's, each an fsync and a
wait for the write lock) among its jobs, but every job in it waits for the whole batch: its
claim-to-acknowledgement time is the batch's handling time plus both commits. A fixed size
is right for one cost of work only: 32 jobs of 1 ms each make every job wait 32 ms, while
32 jobs that cost nothing leave throughput on the table.

``AdaptiveBatch`` gives each batch a handling budget (5 ms by default) and asks for as many
jobs as fit in it at the handling time per job measured so far (smoothed): 1 ms jobs come
five at a time, jobs that cost nothing come ``ceiling`` at a time. Sizing by the commits'
cost instead was tried and not kept: under contention a commit's time is mostly the wait
for other workers' commits, which bigger batches only lengthen (measured: 16 workers doing
1 ms jobs grew their batches to 71 and then 103 jobs on average, and their p99 to 2.7x and
4.2x the textbook queue's).
"""

from __future__ import annotations

import math
from typing import Protocol

#: The adaptive batch's largest size (the store accepts more; a worker holding many leased
#: jobs makes the others wait for work, and their leases run while it works through them).
CEILING = 256
#: The size of the first batch, before anything is measured.
FIRST = 8
#: How long one batch's handling may take, which bounds how long each of its jobs waits.
BUDGET_S = 0.005
#: Weight of the newest measurement in the smoothed handling time.
SMOOTHING = 0.3


class BatchSizer(Protocol):
    """Chooses the size of the next ``claim_many`` and learns from how the batch went."""

    def next_size(self) -> int: ...

    def observe(self, *, jobs: int, work_s: float) -> None: ...


class FixedBatch:
    """Always the same size (the benchmark's ``--batch N``)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a batch holds at least one job, not {size}")
        self.size = size

    def next_size(self) -> int:
        return self.size

    def observe(self, *, jobs: int, work_s: float) -> None:
        """A fixed size learns nothing."""


class AdaptiveBatch:
    """As many jobs as the measured handling time fits into a budget per batch."""

    def __init__(
        self, *, ceiling: int = CEILING, first: int = FIRST, budget_s: float = BUDGET_S
    ) -> None:
        if ceiling < 1 or not 1 <= first <= ceiling:
            raise ValueError(f"need 1 <= first ({first}) <= ceiling ({ceiling})")
        if budget_s <= 0:
            raise ValueError(f"the handling budget must be positive, not {budget_s}")
        self.ceiling = ceiling
        self.budget_s = budget_s
        self._size = first
        self._work_per_job_s: float | None = None

    def next_size(self) -> int:
        return self._size

    def observe(self, *, jobs: int, work_s: float) -> None:
        """Fold in one batch: ``jobs`` handled in ``work_s`` seconds."""
        if jobs < 1:
            return
        measured = max(work_s, 0.0) / jobs
        if self._work_per_job_s is None:
            self._work_per_job_s = measured
        else:
            self._work_per_job_s += SMOOTHING * (measured - self._work_per_job_s)
        if self._work_per_job_s * self.ceiling <= self.budget_s:
            self._size = self.ceiling
        else:
            self._size = max(1, math.floor(self.budget_s / self._work_per_job_s))


def batch_sizer(size: int | None) -> BatchSizer:
    """``FixedBatch(size)``, or an ``AdaptiveBatch`` when no size is given."""
    return AdaptiveBatch() if size is None else FixedBatch(size)
