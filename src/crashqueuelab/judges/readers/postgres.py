"""Judging a PostgreSQL queue's store with the judges' own SQL: replay and invariants.

A store directory names its schema in ``store.json``; the rows are read in one REPEATABLE
READ transaction straight from the server (the DSN comes from the environment, as for the
queue's own processes), and the judged rows are kept beside it (``judged-rows.json``) so the
verdict can be re-run after a throwaway server is gone. Nothing here imports the queue.

Replay walks every job's events in order and must end exactly where the job row stands;
the invariants are the contract's: one SUBMITTED per job, every holder operation carries the
live lease's token and lands before its deadline, no token leased twice, attempts within
their maximum, the dead letter only for a job out of attempts, lease columns set exactly
while LEASED, and the append-only triggers present.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crashqueuelab.judges.readers.snapshot import read_snapshot

if TYPE_CHECKING:
    import psycopg

#: The descriptor a PostgreSQL store directory holds (written by the queue's adapter).
DESCRIPTOR_FILE = "store.json"
#: The rows the last reading judged, kept as evidence.
JUDGED_ROWS_FILE = "judged-rows.json"
DSN_VARIABLE = "CRASHQUEUELAB_POSTGRES_DSN"
TRIGGERS = ("events_append_only", "events_no_truncate")
MAX_QUOTED = 20

_JOB_FIELDS = (
    "job_id",
    "idempotency_key",
    "state",
    "attempts",
    "max_attempts",
    "lease_worker_id",
    "lease_token",
    "lease_deadline_us",
)
_EVENT_FIELDS = (
    "seq",
    "job_id",
    "event_type",
    "from_state",
    "to_state",
    "at_us",
    "attempt",
    "worker_id",
    "lease_token",
    "lease_deadline_us",
)
_TRANSITIONS: dict[str, tuple[set[str | None], set[str | None]]] = {
    "SUBMITTED": ({None}, {"QUEUED"}),
    "CLAIMED": ({"QUEUED"}, {"LEASED"}),
    "HEARTBEAT": ({"LEASED"}, {"LEASED"}),
    "SUCCEEDED": ({"LEASED"}, {"SUCCEEDED"}),
    "FAILED": ({"LEASED"}, {"RETRY_SCHEDULED", "DEAD"}),
    "LEASE_EXPIRED": ({"LEASED"}, {"RETRY_SCHEDULED", "DEAD"}),
    "PROMOTED": ({"RETRY_SCHEDULED"}, {"QUEUED"}),
}
#: Operations only the lease's live holder may perform.
_HOLDER_EVENTS = ("HEARTBEAT", "SUCCEEDED", "FAILED")


@dataclass(frozen=True)
class PgStoreReading:
    exists: bool
    jobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: The lease deadline of every leased job, by idempotency key.
    deadlines: dict[str, int] = field(default_factory=dict)
    last_event: str | None = None
    problems: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    replay_ok: bool = True
    invariants_ok: bool = True
    source: str = "server"

    @property
    def ok(self) -> bool:
        return not self.problems


def read_postgres_store(directory: Path, environ: Mapping[str, str] = os.environ) -> PgStoreReading:
    """Observe and judge the store ``directory`` names; no descriptor means no job."""
    descriptor = directory / DESCRIPTOR_FILE
    if not descriptor.is_file():
        return PgStoreReading(exists=False)
    schema = str(json.loads(descriptor.read_text())["schema"])
    dsn = environ.get(DSN_VARIABLE)
    rows: dict[str, Any] | None = None
    source = "server"
    if dsn:
        rows = read_snapshot(dsn, lambda conn: _server_rows(conn, schema))
    if rows is None:
        kept = directory / JUDGED_ROWS_FILE
        if not kept.is_file():
            return PgStoreReading(
                exists=True, problems=[f"schema {schema}: no server reachable and no kept rows"]
            )
        rows = json.loads(kept.read_text())
        source = f"{JUDGED_ROWS_FILE} (the server is gone)"
    else:
        # In a read-only directory the verdict stands; only the kept copy is missing.
        with contextlib.suppress(OSError):
            (directory / JUDGED_ROWS_FILE).write_text(json.dumps(rows))
    if not rows["schema_exists"]:
        return PgStoreReading(exists=False, source=source)
    return judge_rows(rows["jobs"], rows["events"], rows["triggers"], source=source)


def _server_rows(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    if found is None:
        return {"schema_exists": False}
    jobs = conn.execute(
        f"SELECT {', '.join(_JOB_FIELDS)} FROM {_identifier(schema)}.jobs"
        " ORDER BY submit_seq".encode()
    ).fetchall()
    events = conn.execute(
        f"SELECT {', '.join(_EVENT_FIELDS)} FROM {_identifier(schema)}.events ORDER BY seq".encode()
    ).fetchall()
    triggers = [
        row[0]
        for row in conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgenabled <> 'D'",
            (f"{schema}.events",),
        )
    ]
    return {
        "schema_exists": True,
        "jobs": [dict(zip(_JOB_FIELDS, row, strict=True)) for row in jobs],
        "events": [dict(zip(_EVENT_FIELDS, row, strict=True)) for row in events],
        "triggers": sorted(triggers),
    }


def _identifier(schema: str) -> str:
    if not (schema.startswith("cql_") and schema[4:].isalnum()):
        raise ValueError(f"not a queue schema: {schema!r}")
    return schema


def judge_rows(
    jobs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    triggers: Iterable[str],
    *,
    source: str = "server",
) -> PgStoreReading:
    """Replay and invariants over the rows of one store."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    replay_problems: list[str] = []
    known = {job["job_id"] for job in jobs}
    for event in events:
        if event["job_id"] not in known:
            replay_problems.append(f"event {event['seq']} names unknown job {event['job_id']}")
        by_job.setdefault(event["job_id"], []).append(event)
    invariant_problems = [
        f"append-only trigger missing: {name}" for name in TRIGGERS if name not in set(triggers)
    ]
    tokens: dict[str, str] = {}
    for job in jobs:
        replay_problems += _replay(job, by_job.get(job["job_id"], []))
        invariant_problems += _invariants(job, by_job.get(job["job_id"], []), tokens)
    problems = [f"replay: {p}" for p in replay_problems[:MAX_QUOTED]]
    problems += [f"invariant failed: {p}" for p in invariant_problems[:MAX_QUOTED]]
    return PgStoreReading(
        exists=True,
        jobs={job["idempotency_key"]: (job["state"], int(job["attempts"])) for job in jobs},
        deadlines={
            job["idempotency_key"]: int(job["lease_deadline_us"])
            for job in jobs
            if job["state"] == "LEASED" and job["lease_deadline_us"] is not None
        },
        last_event=events[-1]["event_type"] if events else None,
        problems=problems,
        history=events,
        replay_ok=not replay_problems,
        invariants_ok=not invariant_problems,
        source=source,
    )


def _replay(job: Mapping[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """Walk the job's events; every one must start where the previous one ended."""
    name = job["job_id"]
    state: str | None = None
    attempts = 0
    lease: tuple[str | None, str | None, int | None] = (None, None, None)
    for event in events:
        kind = event["event_type"]
        if kind not in _TRANSITIONS:
            return [f"{name}: unknown event {kind} (seq {event['seq']})"]
        sources, targets = _TRANSITIONS[kind]
        if event["from_state"] != state or state not in sources:
            return [f"{name}: {kind} from {event['from_state']} while {state} (seq {event['seq']})"]
        if event["to_state"] not in targets:
            return [f"{name}: {kind} to {event['to_state']} (seq {event['seq']})"]
        if kind == "CLAIMED":
            attempts += 1
            lease = (event["worker_id"], event["lease_token"], event["lease_deadline_us"])
        elif kind == "HEARTBEAT":
            lease = (lease[0], lease[1], event["lease_deadline_us"])
        elif state == "LEASED":
            lease = (None, None, None)
        if event["attempt"] != attempts:
            return [f"{name}: {kind} says attempt {event['attempt']}, replay has {attempts}"]
        state = event["to_state"]
    found = (job["state"], int(job["attempts"]))
    if (state, attempts) != found:
        return [f"{name}: replay ends {state}/{attempts}, the row is {found[0]}/{found[1]}"]
    row_lease = (job["lease_worker_id"], job["lease_token"], job["lease_deadline_us"])
    if row_lease != lease:
        return [f"{name}: replayed lease {lease}, the row holds {row_lease}"]
    return []


def _invariants(
    job: Mapping[str, Any], events: list[dict[str, Any]], tokens: dict[str, str]
) -> list[str]:
    name = job["job_id"]
    problems = []
    if [event["event_type"] for event in events[:1]] != ["SUBMITTED"] or sum(
        1 for event in events if event["event_type"] == "SUBMITTED"
    ) != 1:
        problems.append(f"{name}: not exactly one SUBMITTED, first")
    if int(job["attempts"]) > int(job["max_attempts"]):
        problems.append(f"{name}: {job['attempts']} attempts of at most {job['max_attempts']}")
    if job["state"] == "DEAD" and int(job["attempts"]) < int(job["max_attempts"]):
        problems.append(f"{name}: dead with attempts left")
    leased = job["state"] == "LEASED"
    lease_columns = (job["lease_worker_id"], job["lease_token"], job["lease_deadline_us"])
    if leased != all(value is not None for value in lease_columns) or (
        not leased and any(value is not None for value in lease_columns)
    ):
        problems.append(f"{name}: lease columns {lease_columns} while {job['state']}")
    holder: tuple[str | None, str | None, int | None] = (None, None, None)
    for event in events:
        kind = event["event_type"]
        if kind == "CLAIMED":
            token = event["lease_token"]
            if token in tokens:
                problems.append(f"{name}: token {token} already leased for {tokens[token]}")
            tokens[token] = name
            holder = (event["worker_id"], token, event["lease_deadline_us"])
            continue
        if kind in _HOLDER_EVENTS:
            worker, token, deadline = holder
            if (event["worker_id"], event["lease_token"]) != (worker, token):
                problems.append(
                    f"{name}: {kind} (seq {event['seq']}) by {event['worker_id']}/"
                    f"{event['lease_token']}, the lease was {worker}/{token}"
                )
            elif deadline is None or int(event["at_us"]) >= int(deadline):
                problems.append(f"{name}: {kind} (seq {event['seq']}) at or after the deadline")
            if kind == "HEARTBEAT":
                holder = (worker, token, event["lease_deadline_us"])
                continue
        if kind == "LEASE_EXPIRED" and holder[2] is not None and event["at_us"] < holder[2]:
            problems.append(f"{name}: lease expired (seq {event['seq']}) before its deadline")
        holder = (None, None, None)
    return problems
