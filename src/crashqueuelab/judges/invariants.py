"""Database-wide invariants, each with a stable name documented in docs/correctness.md.

The checker loads one consistent read-only snapshot of the tables and evaluates every
invariant on it, reporting each with pass/fail and its violations (the first
``MAX_LISTED`` of them, with the total count).

A store of schema version 1 or 2 keeps an ``attempts`` table beside the events, and the
invariants hold the two against each other. From version 3 the store only derives its
attempts from the events (a view); the checker then derives them itself, from the events
alone, and never reads the store's view: what it holds against the jobs is its own reading
of the history.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readonly import open_read_only

#: Violations listed per invariant; the count is always complete.
MAX_LISTED = 20

_STATES = frozenset({"QUEUED", "LEASED", "RETRY_SCHEDULED", "SUCCEEDED", "DEAD"})
_TERMINAL = frozenset({"SUCCEEDED", "DEAD"})
# (event type, from state) -> the states it may lead to.
_LEGAL: dict[tuple[str, str | None], frozenset[str]] = {
    ("SUBMITTED", None): frozenset({"QUEUED"}),
    ("CLAIMED", "QUEUED"): frozenset({"LEASED"}),
    ("HEARTBEAT", "LEASED"): frozenset({"LEASED"}),
    ("SUCCEEDED", "LEASED"): frozenset({"SUCCEEDED"}),
    ("FAILED", "LEASED"): frozenset({"RETRY_SCHEDULED", "DEAD"}),
    ("LEASE_EXPIRED", "LEASED"): frozenset({"RETRY_SCHEDULED", "DEAD"}),
    ("PROMOTED", "RETRY_SCHEDULED"): frozenset({"QUEUED"}),
}
_TRIGGERS = {"events_no_update": "UPDATE", "events_no_delete": "DELETE"}
# How an event that ends an attempt names the attempt's outcome.
_OUTCOME = {"SUCCEEDED": "SUCCEEDED", "FAILED": "FAILED", "LEASE_EXPIRED": "EXPIRED"}


@dataclass(frozen=True)
class InvariantResult:
    """The verdict on one invariant."""

    name: str
    ok: bool
    violation_count: int
    violations: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "violation_count": self.violation_count,
            "violations": list(self.violations),
        }


@dataclass(frozen=True)
class InvariantReport:
    """Every invariant's verdict on one database."""

    ok: bool
    jobs: int
    events: int
    results: tuple[InvariantResult, ...]

    def failed(self) -> list[str]:
        return [result.name for result in self.results if not result.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "jobs": self.jobs,
            "events": self.events,
            "failed": self.failed(),
            "invariants": [result.to_json() for result in self.results],
        }


@dataclass(frozen=True)
class _Snapshot:
    jobs: list[dict[str, Any]]
    attempts: dict[str, list[dict[str, Any]]]
    events: list[dict[str, Any]]
    events_by_job: dict[str, list[dict[str, Any]]]
    triggers: dict[str, str]
    integrity: list[str]
    unique_indexes: set[str]


def _integrity(snapshot: _Snapshot) -> Iterator[str]:
    if snapshot.integrity != ["ok"]:
        yield from snapshot.integrity


def _triggers(snapshot: _Snapshot) -> Iterator[str]:
    for name, operation in _TRIGGERS.items():
        sql = " ".join(snapshot.triggers.get(name, "").upper().split())
        if not sql:
            yield f"trigger {name} is missing"
        elif f"BEFORE {operation} ON EVENTS" not in sql or "RAISE(ABORT" not in sql:
            yield f"trigger {name} does not abort {operation} on events"


def _contiguous(snapshot: _Snapshot) -> Iterator[str]:
    for expected, event in enumerate(snapshot.events, start=1):
        if event["seq"] != expected:
            yield f"event seq {event['seq']} where {expected} was expected"
            return


def _references(snapshot: _Snapshot) -> Iterator[str]:
    known = {job["job_id"] for job in snapshot.jobs}
    for job_id in sorted(set(snapshot.events_by_job) - known):
        yield f"events for unknown job {job_id}"
    for job_id in sorted(known - set(snapshot.events_by_job)):
        yield f"job {job_id} has no events"


def _first_event(snapshot: _Snapshot) -> Iterator[str]:
    for job_id, events in snapshot.events_by_job.items():
        if events[0]["event_type"] != "SUBMITTED":
            yield f"job {job_id} starts with {events[0]['event_type']}"
        submissions = sum(1 for event in events if event["event_type"] == "SUBMITTED")
        if submissions != 1:
            yield f"job {job_id} has {submissions} SUBMITTED events"


def _legal(snapshot: _Snapshot) -> Iterator[str]:
    for job_id, events in snapshot.events_by_job.items():
        previous: str | None = None
        for event in events:
            allowed = _LEGAL.get((event["event_type"], event["from_state"]), frozenset())
            if event["to_state"] not in allowed:
                yield (
                    f"job {job_id} seq {event['seq']}: {event['event_type']} "
                    f"{event['from_state']} -> {event['to_state']} is not a legal transition"
                )
            if event["from_state"] != previous:
                yield (
                    f"job {job_id} seq {event['seq']}: from_state {event['from_state']} "
                    f"but the job was {previous}"
                )
            previous = event["to_state"]


def _state_matches(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        if job["state"] not in _STATES:
            yield f"job {job['job_id']} has unknown state {job['state']!r}"
            continue
        events = snapshot.events_by_job.get(job["job_id"])
        if events and events[-1]["to_state"] != job["state"]:
            yield (
                f"job {job['job_id']} is {job['state']} "
                f"but its last event leads to {events[-1]['to_state']}"
            )


def _attempts_match(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        job_id = job["job_id"]
        claims = [e for e in snapshot.events_by_job.get(job_id, []) if e["event_type"] == "CLAIMED"]
        numbers = [row["attempt"] for row in snapshot.attempts.get(job_id, [])]
        if job["attempts"] != len(claims):
            yield f"job {job_id} counts {job['attempts']} attempts but has {len(claims)} claims"
        if numbers != list(range(1, len(claims) + 1)):
            yield f"job {job_id} has attempt rows {numbers} for {len(claims)} claims"
        if [claim["attempt"] for claim in claims] != list(range(1, len(claims) + 1)):
            yield f"job {job_id} claims are not numbered 1..{len(claims)}"


def _within_max(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        if not 0 <= job["attempts"] <= job["max_attempts"]:
            yield f"job {job['job_id']} has {job['attempts']} of {job['max_attempts']} attempts"


def _single_open(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        rows = snapshot.attempts.get(job["job_id"], [])
        open_numbers = [row["attempt"] for row in rows if row["outcome"] is None]
        if job["state"] == "LEASED":
            if open_numbers != [job["attempts"]]:
                yield f"job {job['job_id']} is LEASED with open attempts {open_numbers}"
        elif open_numbers:
            yield f"job {job['job_id']} is {job['state']} with open attempts {open_numbers}"


def _lease_fields(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        fields = (job["lease_worker_id"], job["lease_token"], job["lease_deadline_us"])
        if job["state"] != "LEASED":
            if any(value is not None for value in fields):
                yield f"job {job['job_id']} is {job['state']} but holds lease fields {fields}"
            continue
        if any(value is None for value in fields):
            yield f"job {job['job_id']} is LEASED without a complete lease {fields}"
            continue
        current = [r for r in snapshot.attempts.get(job["job_id"], []) if r["outcome"] is None]
        for row in current:
            held = (row["worker_id"], row["lease_token"], row["lease_deadline_us"])
            if held != fields:
                yield f"job {job['job_id']} lease {fields} differs from its open attempt {held}"


def _tokens_unique(snapshot: _Snapshot) -> Iterator[str]:
    tokens: Counter[str] = Counter()
    for rows in snapshot.attempts.values():
        for row in rows:
            if row["lease_token"] is None:
                # Only a claim forged into the history (a derived attempt) can lack one.
                yield f"job {row['job_id']} attempt {row['attempt']} was claimed without a token"
            else:
                tokens[row["lease_token"]] += 1
    for token, count in sorted(tokens.items()):
        if count > 1:
            yield f"lease token {token} was issued {count} times"


def _terminal_final(snapshot: _Snapshot) -> Iterator[str]:
    for job_id, events in snapshot.events_by_job.items():
        for index, event in enumerate(events[:-1]):
            if event["to_state"] in _TERMINAL:
                later = events[index + 1]
                yield f"job {job_id} has {later['event_type']} after reaching {event['to_state']}"
                break


def _dead(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        if job["state"] == "DEAD" and job["attempts"] < job["max_attempts"]:
            yield (
                f"job {job['job_id']} is DEAD after "
                f"{job['attempts']} of {job['max_attempts']} attempts"
            )


def _success(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        job_id = job["job_id"]
        events = snapshot.events_by_job.get(job_id, [])
        claims = {e["attempt"]: e for e in events if e["event_type"] == "CLAIMED"}
        successes = [e for e in events if e["event_type"] == "SUCCEEDED"]
        if job["state"] == "SUCCEEDED" and len(successes) != 1:
            yield f"job {job_id} is SUCCEEDED with {len(successes)} success events"
        attempt_rows = {row["attempt"]: row for row in snapshot.attempts.get(job_id, [])}
        for success in successes:
            claim = claims.get(success["attempt"])
            holder = (success["worker_id"], success["lease_token"])
            if claim is None or (claim["worker_id"], claim["lease_token"]) != holder:
                yield f"job {job_id} success at seq {success['seq']} is not from the lease holder"
                continue
            row = attempt_rows.get(success["attempt"])
            if row is None or row["outcome"] != "SUCCEEDED":
                yield f"job {job_id} success at seq {success['seq']} has no succeeded attempt row"
            elif success["at_us"] >= row["lease_deadline_us"]:
                yield f"job {job_id} succeeded at {success['at_us']} after its lease deadline"


def _digest(snapshot: _Snapshot) -> Iterator[str]:
    for job in snapshot.jobs:
        text = job["payload_json"]
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest != job["payload_sha256"]:
            yield f"job {job['job_id']} payload digest differs from its payload"
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            yield f"job {job['job_id']} payload is not JSON"
            continue
        canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if not isinstance(value, dict) or canonical != text:
            yield f"job {job['job_id']} payload is not a canonical JSON object"


def _keys_unique(snapshot: _Snapshot) -> Iterator[str]:
    keys = Counter(job["idempotency_key"] for job in snapshot.jobs)
    for key, count in sorted(keys.items()):
        if count > 1:
            yield f"idempotency key {key!r} names {count} jobs"
    if "idempotency_key" not in snapshot.unique_indexes:
        yield "no unique index enforces idempotency keys"


Check = Callable[[_Snapshot], Iterator[str]]

#: Every invariant, by stable name, in evaluation order.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("integrity_check", _integrity),
    ("append_only_triggers", _triggers),
    ("event_sequence_contiguous", _contiguous),
    ("events_reference_jobs", _references),
    ("first_event_is_submission", _first_event),
    ("transitions_are_legal", _legal),
    ("state_matches_last_event", _state_matches),
    ("attempts_match_claims", _attempts_match),
    ("attempts_within_max", _within_max),
    ("single_open_attempt", _single_open),
    ("lease_fields_match_state", _lease_fields),
    ("lease_tokens_unique", _tokens_unique),
    ("terminal_states_are_final", _terminal_final),
    ("dead_only_when_exhausted", _dead),
    ("success_from_lease_holder", _success),
    ("payload_digest_matches", _digest),
    ("idempotency_keys_unique", _keys_unique),
)


def invariant_names() -> list[str]:
    """Every invariant's stable name, in evaluation order."""
    return [name for name, _ in CHECKS]


def _load(conn: sqlite3.Connection) -> _Snapshot:
    def rows(sql: str) -> list[dict[str, Any]]:
        cursor = conn.execute(sql)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    conn.execute("BEGIN")
    try:
        jobs = rows("SELECT * FROM jobs ORDER BY submit_seq")
        events = rows("SELECT * FROM events ORDER BY seq")
        stored = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'attempts'"
        ).fetchone()
        attempt_rows = (
            rows("SELECT * FROM attempts ORDER BY job_id, attempt")
            if stored
            else derive_attempts(events)
        )
        triggers = {
            name: sql or ""
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
            )
        }
        unique_indexes: set[str] = set()
        for index in conn.execute("PRAGMA index_list(jobs)").fetchall():
            if index[2]:
                columns = conn.execute(f"PRAGMA index_info('{index[1]}')").fetchall()
                if len(columns) == 1:
                    unique_indexes.add(columns[0][2])
        integrity = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.execute("COMMIT")
    attempts: dict[str, list[dict[str, Any]]] = {}
    for row in attempt_rows:
        attempts.setdefault(row["job_id"], []).append(row)
    by_job: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_job.setdefault(event["job_id"], []).append(event)
    return _Snapshot(jobs, attempts, events, by_job, triggers, integrity, unique_indexes)


def derive_attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempt rows that ``events`` (in ``seq`` order) describe, by job and attempt.

    Each CLAIMED event opens one; a HEARTBEAT of the same attempt moves its deadline; a
    SUCCEEDED, FAILED or LEASE_EXPIRED event of the same attempt ends it. An event naming
    an attempt that no claim opened changes nothing here (other invariants report it).
    """
    opened: dict[tuple[str, int], dict[str, Any]] = {}
    derived: list[dict[str, Any]] = []
    for event in events:
        key = (event["job_id"], event["attempt"])
        kind = event["event_type"]
        if kind == "CLAIMED":
            opened[key] = {
                "job_id": event["job_id"],
                "attempt": event["attempt"],
                "worker_id": event["worker_id"],
                "lease_token": event["lease_token"],
                "claimed_at_us": event["at_us"],
                "lease_deadline_us": event["lease_deadline_us"],
                "ended_at_us": None,
                "outcome": None,
                "error": None,
            }
            derived.append(opened[key])
            continue
        row = opened.get(key)
        if row is None or row["outcome"] is not None:
            continue
        if kind == "HEARTBEAT":
            row["lease_deadline_us"] = event["lease_deadline_us"]
        elif kind in _OUTCOME:
            row.update(ended_at_us=event["at_us"], outcome=_OUTCOME[kind], error=event["error"])
    return sorted(derived, key=lambda row: (row["job_id"], row["attempt"]))


def check_database(path: str | Path) -> InvariantReport:
    """Evaluate every invariant on a read-only snapshot of the database at ``path``."""
    conn = open_read_only(path)
    try:
        snapshot = _load(conn)
    finally:
        conn.close()
    results = []
    for name, check in CHECKS:
        violations = list(check(snapshot))
        results.append(
            InvariantResult(
                name=name,
                ok=not violations,
                violation_count=len(violations),
                violations=tuple(violations[:MAX_LISTED]),
            )
        )
    return InvariantReport(
        ok=all(result.ok for result in results),
        jobs=len(snapshot.jobs),
        events=len(snapshot.events),
        results=tuple(results),
    )
