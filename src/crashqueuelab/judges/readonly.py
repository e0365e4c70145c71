"""Opening a database for judgement: read-only, never created, never modified."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from crashqueuelab.core.errors import NotADatabase, SchemaMismatch, StoreNotFound

# The judges hold their own copy of the identity they expect, so a change to the queue's
# schema module cannot silently change what the judges accept.
EXPECTED_APPLICATION_ID = 0x43514C31
#: Versions 1 and 2 hold the same tables and columns (2 only writes its constraints
#: differently); version 3 derives its attempts from the events instead of storing them.
#: A store kept from a run of any of them can be judged.
READABLE_SCHEMA_VERSIONS = (1, 2, 3)


def _read_only_uri(resolved: Path) -> str:
    """Read-only; and immutable when there is no WAL file, so that reading creates nothing.

    Without a ``-wal`` file every committed page is in the main file, and an immutable
    open neither takes locks nor creates ``-shm``/``-wal`` files: a judged directory (even a
    read-only one, even another program's database) is left exactly as it was. With a WAL
    file present its content must be read, which needs SQLite's ordinary read-only mode.
    """
    immutable = not Path(f"{resolved}-wal").exists()
    return f"{resolved.as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")


def open_read_only(
    path: str | Path,
    *,
    application_id: int = EXPECTED_APPLICATION_ID,
    versions: tuple[int, ...] = READABLE_SCHEMA_VERSIONS,
    what: str = "crashqueuelab database",
) -> sqlite3.Connection:
    """A read-only connection; StoreNotFound, NotADatabase or SchemaMismatch when unusable.

    The identity defaults to the queue's; the lab's other readers (the effect ledger) name
    their own.
    """
    name = str(path)
    resolved = Path(name).resolve()
    if not resolved.is_file():
        raise StoreNotFound(name)
    conn = sqlite3.connect(_read_only_uri(resolved), uri=True, isolation_level=None)
    try:
        try:
            found_id = conn.execute("PRAGMA application_id").fetchone()[0]
            found_version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError:
            raise NotADatabase(name) from None
        expected = max(versions)
        if found_id != application_id:
            raise SchemaMismatch(
                name,
                found_version,
                expected,
                f"not a {what}",
                application_ids=(found_id, application_id),
            )
        if found_version not in versions:
            raise SchemaMismatch(name, found_version, expected)
    except BaseException:
        conn.close()
        raise
    return conn


def open_foreign_read_only(path: str | Path) -> sqlite3.Connection:
    """A read-only connection to another program's SQLite file (no identity to check).

    A WAL file without its ``-shm`` index (a power cut may leave that) cannot be read in
    place without creating the index: the file and its WAL are then copied to a scratch
    directory and read from there into memory, and the judged directory is left as it was.
    """
    name = str(path)
    resolved = Path(name).resolve()
    if not resolved.is_file():
        raise StoreNotFound(name)
    wal, index = Path(f"{resolved}-wal"), Path(f"{resolved}-shm")
    if not wal.exists() or index.exists():
        return sqlite3.connect(_read_only_uri(resolved), uri=True, isolation_level=None)
    with tempfile.TemporaryDirectory(prefix="crashqueuelab-judge-") as scratch:
        copy = Path(scratch) / resolved.name
        shutil.copyfile(resolved, copy)
        shutil.copyfile(wal, f"{copy}-wal")
        source = sqlite3.connect(copy, isolation_level=None)
        memory = sqlite3.connect(":memory:", isolation_level=None)
        try:
            source.backup(memory)
        except BaseException:
            memory.close()
            raise
        finally:
            source.close()
    return memory
