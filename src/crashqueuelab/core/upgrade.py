"""Bringing a store of schema version 2 to version 3, in place.

Version 2 stored one attempt row per claim beside the events; version 3 derives the same
rows from the events (the ``attempts`` view, schema.py). The upgrade runs in one
transaction under the write lock: it checks that every stored row is exactly a row the
events derive, and the other way round, then drops the table, creates the view and sets
the version. A store whose rows differ from its history is refused and left as it was
(``UpgradeRefused``; replay names the differences), so an upgrade never drops anything
the events do not also say. Stop every process using the store first: a writer of the
previous version would find its table gone.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.core.errors import SchemaMismatch, StoreNotFound, UpgradeRefused
from crashqueuelab.core.schema import (
    ATTEMPT_FIELDS,
    ATTEMPTS_DERIVATION,
    ATTEMPTS_VIEW,
    QUEUE_SCHEMA,
    SCHEMA_VERSION,
)
from crashqueuelab.core.storage import open_for_upgrade, write_transaction

#: The one version this module upgrades from.
UPGRADABLE_VERSION = QUEUE_SCHEMA.upgrade_from


@dataclass(frozen=True)
class UpgradeResult:
    """What ``upgrade_store`` did: ``from_version`` equal to ``to_version`` means nothing."""

    path: str
    from_version: int
    to_version: int
    #: Attempt rows checked against the events and now derived from them.
    attempts: int

    @property
    def upgraded(self) -> bool:
        return self.from_version != self.to_version


def upgrade_store(path: str | Path) -> UpgradeResult:
    """Upgrade the queue database at ``path`` to the current schema version (see above)."""
    name = str(path)
    if not Path(name).is_file():
        raise StoreNotFound(name)
    conn, version = open_for_upgrade(name, QUEUE_SCHEMA)
    try:
        if version == SCHEMA_VERSION:
            return UpgradeResult(name, version, version, _count(conn))
        if version != UPGRADABLE_VERSION:
            raise SchemaMismatch(
                name, version, SCHEMA_VERSION, f"only version {UPGRADABLE_VERSION} can be upgraded"
            )
        with write_transaction(conn):
            # Read again under the lock: another process may have upgraded it meanwhile.
            if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return UpgradeResult(name, version, version, _count(conn))
            mismatched = _mismatched_rows(conn)
            if mismatched:
                raise UpgradeRefused(name, mismatched)
            attempts = _count(conn)
            conn.execute("DROP TABLE attempts")
            conn.execute(ATTEMPTS_VIEW)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return UpgradeResult(name, version, SCHEMA_VERSION, attempts)
    finally:
        conn.close()


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])


def _mismatched_rows(conn: sqlite3.Connection) -> int:
    """How many rows would have to be added to or taken from the stored attempts to make
    them the rows the events derive (a duplicated row counts once, a changed one twice).

    The derivation's columns come in ``ATTEMPT_FIELDS`` order, and a compound select names
    its columns after its first part.
    """
    (mismatched,) = conn.execute(
        "SELECT coalesce(sum(abs(difference)), 0) FROM ("
        f" SELECT sum(side) AS difference FROM ("
        f"  SELECT {ATTEMPT_FIELDS}, 1 AS side FROM attempts"
        f"  UNION ALL SELECT *, -1 FROM ({ATTEMPTS_DERIVATION})"
        f" ) GROUP BY {ATTEMPT_FIELDS})"
    ).fetchone()
    return int(mismatched)
