"""TinyQueue: the kind of queue a team writes for itself on SQLite, in one small module.

It stands for "your own queue" in docs/systems.md: leases with a token and a deadline,
retries with a delay, a dead letter, idempotent submission by key. It knows nothing of
crashqueuelab; ``tiny_adapter.py`` connects it to the lab.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY, job_type TEXT NOT NULL, payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'ready', attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL, available_at INTEGER NOT NULL DEFAULT 0,
    owner TEXT, token TEXT, deadline INTEGER)
"""


_NO_LEASE = "owner = NULL, token = NULL, deadline = NULL"
_RETRY_OR_DEAD = (
    "state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'ready' END,"
    f" available_at = ?, {_NO_LEASE}"
)
# The lease is live: the caller's token, and the deadline not yet reached.
_HELD = "state = 'leased' AND token = ? AND deadline > ?"


class TinyQueue:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.execute(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            changed = self.db.execute(sql, args).rowcount
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return changed

    def submit(self, key: str, job_type: str, payload: dict[str, Any], max_attempts: int) -> None:
        self._write(
            "INSERT OR IGNORE INTO jobs (key, job_type, payload, max_attempts) VALUES (?, ?, ?, ?)",
            (key, job_type, json.dumps(payload), max_attempts),
        )

    def claim(self, owner: str, now: int, lease: int) -> dict[str, Any] | None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute(
                "SELECT key FROM jobs WHERE state = 'ready' AND available_at <= ?"
                " ORDER BY available_at, key LIMIT 1",
                (now,),
            ).fetchone()
            token = uuid.uuid4().hex
            if row is not None:
                self.db.execute(
                    "UPDATE jobs SET state = 'leased', attempts = attempts + 1, owner = ?,"
                    " token = ?, deadline = ? WHERE key = ?",
                    (owner, token, now + lease, row[0]),
                )
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return None if row is None else {**self.get(row[0]), "token": token}

    def ack(self, key: str, token: str, now: int) -> bool:
        changed = self._write(
            f"UPDATE jobs SET state = 'done', {_NO_LEASE} WHERE key = ? AND {_HELD}",
            (key, token, now),
        )
        return changed == 1

    def nack(self, key: str, token: str, now: int, delay: int) -> bool:
        changed = self._write(
            f"UPDATE jobs SET {_RETRY_OR_DEAD} WHERE key = ? AND {_HELD}",
            (now + delay, key, token, now),
        )
        return changed == 1

    def expire(self, now: int) -> int:
        return self._write(
            f"UPDATE jobs SET {_RETRY_OR_DEAD} WHERE state = 'leased' AND deadline <= ?",
            (now, now),
        )

    def get(self, key: str) -> dict[str, Any]:
        row = self.db.execute(
            "SELECT key, job_type, payload, state, attempts FROM jobs WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            raise KeyError(key)
        return {"key": row[0], "job_type": row[1], "payload": json.loads(row[2]),
                "state": row[3], "attempts": row[4]}  # fmt: skip

    def unfinished(self) -> int:
        return int(
            self.db.execute(
                "SELECT count(*) FROM jobs WHERE state IN ('ready', 'leased')"
            ).fetchone()[0]
        )
