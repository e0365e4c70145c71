"""An independent reader of procrastinate's tables, as the lab drives them.

It knows the tables procrastinate installs and how they are used: ``procrastinate_jobs``
holds every job with its ``status`` (``todo``, ``doing``, ``succeeded``, ``failed``,
``cancelled``, ``aborting``, ``aborted``), the attempts that ended (``attempts``), the
task's arguments (``args``, where the lab's adapter puts the job's key) and, from 3.x on,
the ``worker_id`` of the worker that fetched it, which the database sets to NULL when that
worker's row in ``procrastinate_workers`` is deleted. The rows are read in one REPEATABLE
READ transaction with the judges' own SQL; nothing here imports procrastinate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crashqueuelab.judges.readers.postgres import DESCRIPTOR_FILE, DSN_VARIABLE
from crashqueuelab.judges.readers.snapshot import read_schema

if TYPE_CHECKING:
    import psycopg

KNOWN_STATUSES = ("todo", "doing", "succeeded", "failed", "cancelled", "aborting", "aborted")


@dataclass
class ProcrastinateReading:
    """Jobs by key as ``(status, attempts made)``, facts, and what is wrong."""

    exists: bool
    jobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: Keys of jobs ``doing`` whose worker row is gone (``worker_id`` NULL; releases with
    #: a workers table only).
    orphaned: list[str] = field(default_factory=list)
    workers: int = 0


def attempts_made(status: str, ended: int) -> int:
    """The attempts a job has had: those that ended, and the one running."""
    return ended + (1 if status == "doing" else 0)


def _rows(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any] | None:
    from psycopg import sql

    tables = {
        str(row[0])
        for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    }
    if "procrastinate_jobs" not in tables:
        return None
    has_workers = "procrastinate_workers" in tables
    worker = sql.SQL("worker_id" if has_workers else "NULL::bigint")
    jobs = conn.execute(
        sql.SQL(
            "SELECT id, status::text, attempts, args, {} FROM {}.procrastinate_jobs ORDER BY id"
        ).format(worker, sql.Identifier(schema))
    ).fetchall()
    workers = (
        conn.execute(
            sql.SQL("SELECT count(*) FROM {}.procrastinate_workers").format(sql.Identifier(schema))
        ).fetchone()
        if has_workers
        else (0,)
    )
    return {
        "jobs": jobs,
        "workers": int(workers[0]) if workers else 0,
        "has_workers": has_workers,
    }


def read_procrastinate_store(
    directory: Path, environ: Mapping[str, str] = os.environ
) -> ProcrastinateReading:
    rows = read_schema(directory / DESCRIPTOR_FILE, environ.get(DSN_VARIABLE), _rows)
    if isinstance(rows, str):
        return ProcrastinateReading(exists=True, problems=[rows])
    if rows is None:
        return ProcrastinateReading(exists=False)
    reading = ProcrastinateReading(exists=True, workers=rows["workers"])
    for job_id, status, attempts, args, worker_id in rows["jobs"]:
        key = args.get("key") if isinstance(args, dict) else None
        if not isinstance(key, str):
            reading.problems.append(f"job {job_id}: no key in its arguments ({args!r})")
            continue
        if key in reading.jobs:
            reading.problems.append(f"job {key}: stored twice (row {job_id} again)")
            continue
        if status not in KNOWN_STATUSES:
            reading.problems.append(f"job {key}: status {status!r}")
        if status == "doing" and worker_id is None and rows["has_workers"]:
            reading.orphaned.append(key)
        reading.jobs[key] = (status, attempts_made(status, int(attempts)))
    return reading
