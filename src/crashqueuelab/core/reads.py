"""The queue's read-only views: one job (by id or idempotency key), its history and
attempts, and how many jobs are in each state.

None takes the write lock; called inside a transition's transaction (``fail`` reads the
row it ends, ``_explain_stale`` the row whose guard missed), a view sees that transaction's
own writes.
"""

from __future__ import annotations

from crashqueuelab.core.errors import JobNotFound
from crashqueuelab.core.handle import DatabaseHandle
from crashqueuelab.core.models import Attempt, Event, Job, JobState
from crashqueuelab.core.rows import (
    ATTEMPT_COLUMNS,
    EVENT_COLUMNS,
    JOB_COLUMNS,
    decode_attempt,
    decode_event,
    decode_job,
)
from crashqueuelab.core.schema import ACTIVE_JOBS
from crashqueuelab.core.statements import SELECT_JOB


class QueueReads(DatabaseHandle):
    """The views of a queue database that change nothing."""

    def get(self, job_id: str) -> Job:
        """The current state of one job."""
        rows = self._read(SELECT_JOB, (job_id,))
        if not rows:
            raise JobNotFound(job_id)
        return decode_job(rows[0])

    def get_by_key(self, idempotency_key: str) -> Job:
        """The job an idempotency key names (JobNotFound carries the key)."""
        rows = self._read(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = ?", (idempotency_key,)
        )
        if not rows:
            raise JobNotFound(idempotency_key)
        return decode_job(rows[0])

    def history(self, job_id: str) -> list[Event]:
        """Every event of one job, oldest first."""
        self.get(job_id)
        rows = self._read(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? ORDER BY seq", (job_id,)
        )
        return [decode_event(row) for row in rows]

    def attempts(self, job_id: str) -> list[Attempt]:
        """Every attempt of one job, first attempt first."""
        self.get(job_id)
        rows = self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,)
        )
        return [decode_attempt(row) for row in rows]

    def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state listed, zeros included)."""
        result = dict.fromkeys(JobState, 0)
        for state, count in self._read("SELECT state, count(*) FROM jobs GROUP BY state"):
            result[JobState(state)] = int(count)
        return result

    def active_count(self) -> int:
        """Jobs not yet finished (QUEUED, LEASED or RETRY_SCHEDULED), from the live index."""
        return int(self._read(f"SELECT count(*) FROM jobs WHERE {ACTIVE_JOBS}")[0][0])
