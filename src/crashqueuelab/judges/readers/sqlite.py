"""Reading a SQLite queue's store directory for the lab: every job, the last event, and the
judges' verdict (replay and invariants), through the judges' own read-only opener.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.readonly import open_read_only
from crashqueuelab.judges.replay import replay_database

#: The queue's file inside a store directory.
QUEUE_FILE = "queue.sqlite"
#: At most this many replay mismatches are quoted in a reading's problems.
MAX_QUOTED_MISMATCHES = 20


@dataclass(frozen=True)
class QueueStoreReading:
    """Jobs by idempotency key as ``(state, attempts)``, their events, and the verdict."""

    exists: bool
    jobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: The lease deadline of every leased job, by idempotency key.
    deadlines: dict[str, int] = field(default_factory=dict)
    events: dict[str, list[str]] = field(default_factory=dict)
    event_count: int = 0
    last_event: str | None = None
    problems: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    replay_ok: bool = True
    invariants_ok: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems


def read_queue_store(directory: Path) -> QueueStoreReading:
    """Observe and judge ``directory/queue.sqlite``; an absent file holds no job."""
    path = directory / QUEUE_FILE
    if not path.is_file():
        return QueueStoreReading(exists=False)
    conn = open_read_only(path)
    try:
        conn.execute("BEGIN")
        jobs: dict[str, tuple[str, int]] = {}
        events: dict[str, list[str]] = {}
        deadlines: dict[str, int] = {}
        for key, job_id, state, attempts, deadline in conn.execute(
            "SELECT idempotency_key, job_id, state, attempts, lease_deadline_us FROM jobs"
            " ORDER BY submit_seq"
        ).fetchall():
            jobs[key] = (state, int(attempts))
            if state == "LEASED" and deadline is not None:
                deadlines[key] = int(deadline)
            events[key] = [
                row[0]
                for row in conn.execute(
                    "SELECT event_type FROM events WHERE job_id = ? ORDER BY seq", (job_id,)
                )
            ]
        cursor = conn.execute("SELECT * FROM events ORDER BY seq")
        names = [column[0] for column in cursor.description]
        history = [dict(zip(names, row, strict=True)) for row in cursor]
        conn.execute("COMMIT")
    finally:
        conn.close()
    replay = replay_database(path)
    invariants = check_database(path)
    problems = [
        f"replay: job {mismatch.job_id}: {mismatch.field} should be {mismatch.expected!s},"
        f" the store has {mismatch.actual!s}"
        for mismatch in replay.mismatches[:MAX_QUOTED_MISMATCHES]
    ]
    problems += [f"invariant failed: {name}" for name in invariants.failed()]
    return QueueStoreReading(
        exists=True,
        jobs=jobs,
        deadlines=deadlines,
        events=events,
        event_count=len(history),
        last_event=history[-1]["event_type"] if history else None,
        problems=problems,
        history=history,
        replay_ok=replay.ok,
        invariants_ok=invariants.ok,
    )
