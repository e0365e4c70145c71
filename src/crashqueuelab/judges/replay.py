"""Independent replay: rebuild every job from its events alone and compare with the rows.

This is a second, separately written state machine. It knows the five states, the seven
event types and the legal transitions from the documentation (docs/state-machine.md), not
from the queue's code, and it reports every place where the history and the materialised
``jobs``/``attempts`` rows disagree, or where the history itself makes an illegal move.
From schema version 3 the store's ``attempts`` are a view over its events; replay holds
its own reading of the events against what that view answers, as it held it against the
stored rows of versions 1 and 2.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readonly import open_read_only

_ENDS_LEASE = {"SUCCEEDED": "SUCCEEDED", "FAILED": "FAILED", "LEASE_EXPIRED": "EXPIRED"}


@dataclass(frozen=True)
class Mismatch:
    """One disagreement: ``expected`` is what replay derived, ``actual`` what is stored."""

    job_id: str
    field: str
    expected: Any
    actual: Any

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "field": self.field,
            "expected": self.expected,
            "actual": self.actual,
        }


@dataclass(frozen=True)
class ReplayReport:
    """The verdict of one replay."""

    ok: bool
    jobs_replayed: int
    events_replayed: int
    mismatches: tuple[Mismatch, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "jobs_replayed": self.jobs_replayed,
            "events_replayed": self.events_replayed,
            "mismatches": [m.to_json() for m in self.mismatches],
        }


@dataclass
class _ModelAttempt:
    worker_id: str | None
    lease_token: str | None
    claimed_at_us: int
    lease_deadline_us: int | None
    ended_at_us: int | None = None
    outcome: str | None = None
    error: str | None = None


@dataclass
class _ModelJob:
    job_id: str
    idempotency_key: Any
    job_type: Any
    payload_sha256: Any
    max_attempts: int
    available_at_us: int | None
    state: str = "QUEUED"
    attempts: int = 0
    lease_worker_id: str | None = None
    lease_token: str | None = None
    lease_deadline_us: int | None = None
    last_error: str | None = None
    log: dict[int, _ModelAttempt] = field(default_factory=dict)


class _Replayer:
    def __init__(self) -> None:
        self.jobs: dict[str, _ModelJob] = {}
        self.mismatches: list[Mismatch] = []
        self.events = 0

    def flag(self, job_id: str, name: str, expected: Any, actual: Any) -> None:
        self.mismatches.append(Mismatch(job_id, name, expected, actual))

    def apply(self, event: dict[str, Any]) -> None:
        self.events += 1
        job_id = event["job_id"]
        kind = event["event_type"]
        model = self.jobs.get(job_id)
        if kind == "SUBMITTED":
            if model is not None:
                self.flag(
                    job_id, "history", "one SUBMITTED event", f"another at seq {event['seq']}"
                )
                return
            detail = json.loads(event["detail"] or "{}")
            self.jobs[job_id] = _ModelJob(
                job_id=job_id,
                idempotency_key=detail.get("idempotency_key"),
                job_type=detail.get("job_type"),
                payload_sha256=detail.get("payload_sha256"),
                max_attempts=int(detail.get("max_attempts", 0)),
                available_at_us=event["available_at_us"],
            )
            self._expect_states(job_id, event, None, "QUEUED")
            return
        if model is None:
            self.flag(job_id, "history", "SUBMITTED first", f"{kind} at seq {event['seq']}")
            return
        handler = getattr(self, f"_on_{kind.lower()}", None)
        if handler is None:
            self.flag(job_id, "event_type", "a known event type", kind)
            return
        handler(model, event)

    def _expect_states(
        self, job_id: str, event: dict[str, Any], from_state: str | None, to_state: str
    ) -> None:
        if event["from_state"] != from_state:
            self.flag(job_id, f"seq {event['seq']} from_state", from_state, event["from_state"])
        if event["to_state"] != to_state:
            self.flag(job_id, f"seq {event['seq']} to_state", to_state, event["to_state"])

    def _require_state(self, model: _ModelJob, event: dict[str, Any], *states: str) -> bool:
        if model.state in states:
            return True
        self.flag(
            model.job_id,
            f"seq {event['seq']} {event['event_type']}",
            f"job in {' or '.join(states)}",
            model.state,
        )
        return False

    def _require_holder(
        self, model: _ModelJob, event: dict[str, Any], *, before_deadline: bool
    ) -> None:
        where = f"seq {event['seq']} {event['event_type']}"
        if event["worker_id"] != model.lease_worker_id:
            self.flag(model.job_id, f"{where} worker_id", model.lease_worker_id, event["worker_id"])
        if event["lease_token"] != model.lease_token:
            self.flag(model.job_id, f"{where} lease_token", model.lease_token, event["lease_token"])
        if event["attempt"] != model.attempts:
            self.flag(model.job_id, f"{where} attempt", model.attempts, event["attempt"])
        deadline = model.lease_deadline_us
        if deadline is not None:
            in_time = event["at_us"] < deadline
            if in_time != before_deadline:
                relation = "before" if before_deadline else "at or after"
                self.flag(
                    model.job_id,
                    f"{where} at_us",
                    f"{relation} deadline {deadline}",
                    event["at_us"],
                )

    def _on_claimed(self, model: _ModelJob, event: dict[str, Any]) -> None:
        if not self._require_state(model, event, "QUEUED"):
            return
        self._expect_states(model.job_id, event, "QUEUED", "LEASED")
        model.attempts += 1
        if event["attempt"] != model.attempts:
            self.flag(model.job_id, f"seq {event['seq']} attempt", model.attempts, event["attempt"])
        if model.attempts > model.max_attempts:
            self.flag(model.job_id, "attempts", f"<= {model.max_attempts}", model.attempts)
        model.state = "LEASED"
        model.lease_worker_id = event["worker_id"]
        model.lease_token = event["lease_token"]
        model.lease_deadline_us = event["lease_deadline_us"]
        model.log[model.attempts] = _ModelAttempt(
            worker_id=event["worker_id"],
            lease_token=event["lease_token"],
            claimed_at_us=event["at_us"],
            lease_deadline_us=event["lease_deadline_us"],
        )

    def _on_heartbeat(self, model: _ModelJob, event: dict[str, Any]) -> None:
        if not self._require_state(model, event, "LEASED"):
            return
        self._expect_states(model.job_id, event, "LEASED", "LEASED")
        self._require_holder(model, event, before_deadline=True)
        model.lease_deadline_us = event["lease_deadline_us"]
        model.log[model.attempts].lease_deadline_us = event["lease_deadline_us"]

    def _on_succeeded(self, model: _ModelJob, event: dict[str, Any]) -> None:
        self._end_lease(model, event, "SUCCEEDED", before_deadline=True)

    def _on_failed(self, model: _ModelJob, event: dict[str, Any]) -> None:
        self._end_lease(model, event, self._retry_or_dead(model), before_deadline=True)

    def _on_lease_expired(self, model: _ModelJob, event: dict[str, Any]) -> None:
        self._end_lease(model, event, self._retry_or_dead(model), before_deadline=False)

    def _on_promoted(self, model: _ModelJob, event: dict[str, Any]) -> None:
        if not self._require_state(model, event, "RETRY_SCHEDULED"):
            return
        self._expect_states(model.job_id, event, "RETRY_SCHEDULED", "QUEUED")
        if model.available_at_us is not None and event["at_us"] < model.available_at_us:
            self.flag(
                model.job_id,
                f"seq {event['seq']} at_us",
                f"not before retry time {model.available_at_us}",
                event["at_us"],
            )
        model.state = "QUEUED"

    @staticmethod
    def _retry_or_dead(model: _ModelJob) -> str:
        return "DEAD" if model.attempts >= model.max_attempts else "RETRY_SCHEDULED"

    def _end_lease(
        self, model: _ModelJob, event: dict[str, Any], to_state: str, *, before_deadline: bool
    ) -> None:
        if not self._require_state(model, event, "LEASED"):
            return
        self._expect_states(model.job_id, event, "LEASED", to_state)
        self._require_holder(model, event, before_deadline=before_deadline)
        attempt = model.log[model.attempts]
        attempt.ended_at_us = event["at_us"]
        attempt.outcome = _ENDS_LEASE[event["event_type"]]
        attempt.error = event["error"]
        if event["error"] is not None:
            model.last_error = event["error"]
        if to_state == "RETRY_SCHEDULED":
            model.available_at_us = event["available_at_us"]
        model.state = to_state
        model.lease_worker_id = model.lease_token = model.lease_deadline_us = None


_JOB_FIELDS = (
    "idempotency_key",
    "job_type",
    "payload_sha256",
    "max_attempts",
    "state",
    "attempts",
    "available_at_us",
    "lease_worker_id",
    "lease_token",
    "lease_deadline_us",
    "last_error",
)
_ATTEMPT_FIELDS = (
    "worker_id",
    "lease_token",
    "claimed_at_us",
    "lease_deadline_us",
    "ended_at_us",
    "outcome",
    "error",
)


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, args)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def _compare(
    replayer: _Replayer, jobs: list[dict[str, Any]], attempts: list[dict[str, Any]]
) -> None:
    stored = {row["job_id"]: row for row in jobs}
    for job_id in sorted(set(stored) - set(replayer.jobs)):
        replayer.flag(job_id, "row", "no job without a SUBMITTED event", "a jobs row")
    stored_attempts: dict[str, dict[int, dict[str, Any]]] = {}
    for row in attempts:
        stored_attempts.setdefault(row["job_id"], {})[row["attempt"]] = row
    for job_id, model in replayer.jobs.items():
        stored_row = stored.get(job_id)
        if stored_row is None:
            replayer.flag(job_id, "row", "a jobs row", None)
            continue
        for name in _JOB_FIELDS:
            if getattr(model, name) != stored_row[name]:
                replayer.flag(job_id, name, getattr(model, name), stored_row[name])
        rows = stored_attempts.get(job_id, {})
        if sorted(rows) != sorted(model.log):
            replayer.flag(job_id, "attempt rows", sorted(model.log), sorted(rows))
        for number, derived in model.log.items():
            actual = rows.get(number)
            if actual is None:
                continue
            for name in _ATTEMPT_FIELDS:
                if getattr(derived, name) != actual[name]:
                    replayer.flag(
                        job_id, f"attempt {number} {name}", getattr(derived, name), actual[name]
                    )


def replay_database(path: str | Path, *, job_id: str | None = None) -> ReplayReport:
    """Replay the history of every job (or of ``job_id`` alone) and compare with the rows."""
    conn = open_read_only(path)
    try:
        where, args = ("WHERE job_id = ?", (job_id,)) if job_id is not None else ("", ())
        # One read transaction, so rows and events come from the same committed snapshot.
        conn.execute("BEGIN")
        events = _rows(conn, f"SELECT * FROM events {where} ORDER BY seq", args)
        jobs = _rows(conn, f"SELECT * FROM jobs {where}", args)
        attempts = _rows(conn, f"SELECT * FROM attempts {where}", args)
        conn.execute("COMMIT")
    finally:
        conn.close()
    replayer = _Replayer()
    for event in events:
        replayer.apply(event)
    _compare(replayer, jobs, attempts)
    mismatches = tuple(replayer.mismatches)
    return ReplayReport(
        ok=not mismatches,
        jobs_replayed=len(replayer.jobs),
        events_replayed=replayer.events,
        mismatches=mismatches,
    )
