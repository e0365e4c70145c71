"""An independent reader of pgqueuer's tables, as the lab drives them.

It knows the two tables pgqueuer installs and how it uses them: ``pgqueuer`` holds a job
while it is ``queued`` or ``picked`` (with the job's key as its ``dedupe_key``), and
``pgqueuer_log`` gets a row for each status a job passed (``queued``, each ``picked``, and
the final one, when ``log_jobs`` deletes the job from ``pgqueuer``). A finished job's key
comes from ``keys.jsonl``, which the lab's adapter writes (pgqueuer's log holds no key).
The rows are read in one REPEATABLE READ transaction with the judges' own SQL; nothing
here imports pgqueuer or the adapter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crashqueuelab.judges.readers.postgres import DESCRIPTOR_FILE, DSN_VARIABLE
from crashqueuelab.judges.readers.snapshot import read_schema

if TYPE_CHECKING:
    import psycopg

KEYS_FILE = "keys.jsonl"
FINAL = ("successful", "exception", "canceled", "deleted")


@dataclass
class PgQueuerReading:
    """Jobs by key as ``(state, attempts)``, and what is wrong with the tables."""

    exists: bool
    jobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _keys(directory: Path) -> dict[str, str]:
    """Job id to key, from the adapter's synced notes (a torn last line is skipped)."""
    path = directory / KEYS_FILE
    if not path.is_file():
        return {}
    known = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            known[str(entry["id"])] = str(entry["key"])
        except (ValueError, KeyError, TypeError):
            continue
    return known


def _rows(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any] | None:
    from psycopg import sql

    found = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'pgqueuer'", (schema,)
    ).fetchone()
    if found is None:
        return None
    queue = conn.execute(
        sql.SQL("SELECT id, status::text, dedupe_key FROM {}.pgqueuer ORDER BY id").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    log = conn.execute(
        sql.SQL("SELECT job_id, status::text FROM {}.pgqueuer_log ORDER BY id").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    return {"queue": queue, "log": log}


def read_pgqueuer_store(
    directory: Path, environ: Mapping[str, str] = os.environ
) -> PgQueuerReading:
    rows = read_schema(directory / DESCRIPTOR_FILE, environ.get(DSN_VARIABLE), _rows)
    if isinstance(rows, str):
        return PgQueuerReading(exists=True, problems=[rows])
    if rows is None:
        return PgQueuerReading(exists=False)
    reading = PgQueuerReading(exists=True)
    keys = _keys(directory)
    history: dict[str, list[str]] = {}
    for job_id, status in rows["log"]:
        history.setdefault(str(job_id), []).append(status)
    waiting = {str(job_id) for job_id, _, _ in rows["queue"]}
    for job_id, status, dedupe_key in rows["queue"]:
        key = str(dedupe_key) if dedupe_key is not None else keys.get(str(job_id))
        if key is None:
            reading.problems.append(f"job {job_id}: {status} with no key")
            continue
        if key in reading.jobs:
            reading.problems.append(f"job {key}: waiting twice (row {job_id} again)")
            continue
        statuses = history.get(str(job_id), [])
        if any(s in FINAL for s in statuses):
            reading.problems.append(f"job {key}: {status} in the queue and logged as finished")
        reading.jobs[key] = (status, statuses.count("picked"))
    for job_id, statuses in history.items():
        if job_id in waiting:
            continue
        final = [s for s in statuses if s in FINAL]
        if not final:
            reading.problems.append(f"job {job_id}: gone from the queue, logged only {statuses}")
            continue
        key = keys.get(job_id)
        if key is None:
            reading.problems.append(f"job {job_id}: finished, and no key was noted for it")
            continue
        if len(final) > 1:
            reading.problems.append(f"job {key}: logged as finished {len(final)} times")
        if key in reading.jobs:
            reading.problems.append(f"job {key}: finished and waiting again")
            continue
        reading.jobs[key] = (final[-1], statuses.count("picked"))
    return reading
