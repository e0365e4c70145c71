"""The textbook SQLite queue the benchmark compares against (one row per job).

claim = BEGIN IMMEDIATE; SELECT oldest queued; UPDATE leased; COMMIT, and
complete = BEGIN IMMEDIATE; UPDATE succeeded; COMMIT, in WAL mode with synchronous=FULL and
SQLite's own busy handler, waiting for the write lock as long as DurableQueue does
(``DEFAULT_BUSY_TIMEOUT_MS``): on a loaded machine a baseline that gave up sooner would fail
with "database is locked" where our queue merely waits, and the comparison would measure the
machine's load, not the queues. No history, no attempts, no fencing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crashqueuelab.core.storage import DEFAULT_BUSY_TIMEOUT_MS

BUSY_TIMEOUT_MS = DEFAULT_BUSY_TIMEOUT_MS


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def create(path: Path, jobs: int) -> None:
    """A fresh textbook queue holding ``jobs`` queued rows, one insert per transaction."""
    conn = connect(path)
    try:
        conn.execute(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL,"
            " payload TEXT NOT NULL, lease_until INTEGER)"
        )
        conn.execute("CREATE INDEX jobs_state ON jobs (state, id)")
        for index in range(jobs):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO jobs (state, payload) VALUES ('queued', ?)", (f'{{"value":{index}}}',)
            )
            conn.execute("COMMIT")
    finally:
        conn.close()


def claim(conn: sqlite3.Connection, lease_until: int) -> int | None:
    conn.execute("BEGIN IMMEDIATE")
    row = conn.execute("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1").fetchone()
    if row is None:
        conn.execute("COMMIT")
        return None
    conn.execute(
        "UPDATE jobs SET state = 'leased', lease_until = ? WHERE id = ?", (lease_until, row[0])
    )
    conn.execute("COMMIT")
    return int(row[0])


def complete(conn: sqlite3.Connection, job_id: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ?", (job_id,))
    conn.execute("COMMIT")


def count_succeeded(path: Path) -> int:
    conn = connect(path)
    try:
        return int(
            conn.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
        )
    finally:
        conn.close()
