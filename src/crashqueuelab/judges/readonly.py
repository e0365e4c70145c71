"""Opening a database for judgement: read-only, never created, never modified."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crashqueuelab.core.errors import NotADatabase, SchemaMismatch, StoreNotFound

# The judges hold their own copy of the identity they expect, so a change to the queue's
# schema module cannot silently change what the judges accept.
EXPECTED_APPLICATION_ID = 0x43514C31
EXPECTED_SCHEMA_VERSION = 1


def open_read_only(path: str | Path) -> sqlite3.Connection:
    """A read-only connection; StoreNotFound, NotADatabase or SchemaMismatch when unusable."""
    name = str(path)
    resolved = Path(name).resolve()
    if not resolved.is_file():
        raise StoreNotFound(name)
    conn = sqlite3.connect(f"{resolved.as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        try:
            application_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError:
            raise NotADatabase(name) from None
        if application_id != EXPECTED_APPLICATION_ID:
            raise SchemaMismatch(
                name, version, EXPECTED_SCHEMA_VERSION, "not a crashqueuelab database"
            )
        if version != EXPECTED_SCHEMA_VERSION:
            raise SchemaMismatch(name, version, EXPECTED_SCHEMA_VERSION)
    except BaseException:
        conn.close()
        raise
    return conn
