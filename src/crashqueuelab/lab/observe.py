"""Reading what a case left on disk, read-only, as plain JSON-ready data.

Reports are built from these observations of the retained databases, never from what the
code that wrote them believes it wrote.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import StoreNotFound


def _read_only(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise StoreNotFound(str(path))
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def observe_queue(path: Path) -> dict[str, Any]:
    """Every job by idempotency key: id, state, attempts and its event types in order."""
    if not path.is_file():
        return {"exists": False, "jobs": {}, "events": 0, "last_event": None}
    conn = _read_only(path)
    try:
        if "jobs" not in _tables(conn):
            return {"exists": True, "jobs": {}, "events": 0, "last_event": None}
        conn.execute("BEGIN")
        jobs: dict[str, Any] = {}
        for key, job_id, state, attempts in conn.execute(
            "SELECT idempotency_key, job_id, state, attempts FROM jobs ORDER BY submit_seq"
        ):
            events = [
                row[0]
                for row in conn.execute(
                    "SELECT event_type FROM events WHERE job_id = ? ORDER BY seq", (job_id,)
                )
            ]
            jobs[key] = {"job_id": job_id, "state": state, "attempts": attempts, "events": events}
        total = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        last = conn.execute("SELECT event_type FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        conn.execute("COMMIT")
    finally:
        conn.close()
    return {
        "exists": True,
        "jobs": jobs,
        "events": int(total),
        "last_event": None if last is None else last[0],
    }


def observe_ledger(path: Path) -> dict[str, Any]:
    """Durable effects per key, and duplicates an idempotent destination absorbed."""
    if not path.is_file():
        return {"exists": False, "effects_by_key": {}, "effects": 0, "absorbed": 0}
    conn = _read_only(path)
    try:
        if "effects" not in _tables(conn):
            return {"exists": True, "effects_by_key": {}, "effects": 0, "absorbed": 0}
        conn.execute("BEGIN")
        by_key = {
            key: int(count)
            for key, count in conn.execute(
                "SELECT effect_key, count(*) FROM effects GROUP BY effect_key ORDER BY effect_key"
            )
        }
        absorbed = int(conn.execute("SELECT count(*) FROM absorbed").fetchone()[0])
        destination = conn.execute("SELECT destination FROM ledger").fetchone()
        conn.execute("COMMIT")
    finally:
        conn.close()
    return {
        "exists": True,
        "destination": None if destination is None else destination[0],
        "effects_by_key": by_key,
        "effects": sum(by_key.values()),
        "absorbed": absorbed,
    }


def history_json(path: Path) -> list[dict[str, Any]]:
    """The whole event table as JSON rows, oldest first (for retained history files)."""
    if not path.is_file():
        return []
    conn = _read_only(path)
    try:
        if "events" not in _tables(conn):
            return []
        cursor = conn.execute("SELECT * FROM events ORDER BY seq")
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]
    finally:
        conn.close()
