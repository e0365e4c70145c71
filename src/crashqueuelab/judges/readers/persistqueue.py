"""An independent reader of persist-queue's ``SQLiteAckQueue`` file, as the lab drives it.

It knows the table persist-queue creates (``ack_queue_default``: ``_id``, ``data``,
``timestamp``, ``status``), its status codes, and the JSON items the lab's adapter puts
(``key``, ``attempts``, ``max_attempts``); it uses nothing of persist-queue or the adapter.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from crashqueuelab.judges.readonly import open_foreign_read_only

DATABASE_FILE = "data.db"
TABLE = "ack_queue_default"
#: persist-queue's AckStatus codes, by the names this reader reports.
STATUS_NAMES = {0: "inited", 1: "ready", 2: "unack", 5: "acked", 9: "ack_failed"}


@dataclass
class AckQueueReading:
    """Items by key as ``(status name, attempts)``, and what is wrong with the file."""

    exists: bool
    items: dict[str, tuple[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> dict[str, tuple[str, int]]:
        """The items, by the name every other reader's jobs go by."""
        return self.items


def read_ack_queue(directory: Path) -> AckQueueReading:
    path = directory / DATABASE_FILE
    if not path.is_file():
        return AckQueueReading(exists=False)
    reading = AckQueueReading(exists=True)
    conn = open_foreign_read_only(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if TABLE not in tables:
            return reading
        rows = conn.execute(f"SELECT _id, data, status FROM {TABLE} ORDER BY _id").fetchall()
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as error:
        reading.problems.append(f"unreadable: {error}")
        return reading
    finally:
        conn.close()
    if integrity != "ok":
        reading.problems.append(f"integrity_check: {integrity}")
    for row_id, data, status in rows:
        try:
            item = json.loads(data)
            key, attempts = str(item["key"]), int(item["attempts"])
        except (TypeError, ValueError, KeyError) as error:
            reading.problems.append(f"row {row_id}: not an item the lab put ({error!r})")
            continue
        name = STATUS_NAMES.get(int(status))
        if name is None:
            reading.problems.append(f"row {row_id} ({key}): unknown status {status!r}")
            continue
        if key in reading.items:
            reading.problems.append(f"job {key}: stored twice (row {row_id} again)")
            continue
        if attempts > int(item.get("max_attempts", attempts)):
            reading.problems.append(f"job {key}: {attempts} attempts, more than allowed")
        reading.items[key] = (name, attempts)
    return reading
