"""Opening the store durably, and the one way to write: a short BEGIN IMMEDIATE transaction.

Every connection is checked to really run in WAL mode with synchronous=FULL and foreign
keys on; a database that is not ours, or is ours at another version, is refused before
anything (even the journal mode) is changed in it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from crashqueuelab.core.errors import (
    DurabilityUnavailable,
    HistoryUnprotected,
    NotADatabase,
    SchemaMismatch,
    StoreError,
    StoreNotFound,
)
from crashqueuelab.core.groupcommit import SharedCommits
from crashqueuelab.core.locking import begin_immediate
from crashqueuelab.core.schema import QUEUE_SCHEMA, SchemaSpec
from crashqueuelab.core.turns import Served, TurnLock

#: How long a writer waits for the write lock before SQLite reports "database is locked".
DEFAULT_BUSY_TIMEOUT_MS = 30_000

_SYNCHRONOUS_FULL = 2


def _inspect(conn: sqlite3.Connection, path: str) -> tuple[int, int, int]:
    """(application_id, user_version, number of schema objects); NotADatabase if unreadable."""
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error) or "malformed" in str(error):
            raise NotADatabase(path) from None
        raise
    return int(application_id), int(user_version), int(objects)


def _require_pragma(conn: sqlite3.Connection, path: str, pragma: str, wanted: object) -> None:
    got = conn.execute(f"PRAGMA {pragma}").fetchone()[0]
    if str(got).lower() != str(wanted).lower():
        raise DurabilityUnavailable(path, pragma, str(wanted), str(got))


def _create_schema(conn: sqlite3.Connection, spec: SchemaSpec) -> None:
    with write_transaction(conn):
        # Another process may have initialised the file between our inspection and the lock.
        if conn.execute("PRAGMA user_version").fetchone()[0] == spec.version:
            return
        for statement in spec.statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {spec.application_id}")
        conn.execute(f"PRAGMA user_version = {spec.version}")


def missing_triggers(conn: sqlite3.Connection, spec: SchemaSpec) -> tuple[str, ...]:
    """Names of required triggers absent from the schema."""
    present = {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    }
    return tuple(name for name in spec.required_triggers if name not in present)


def _check_identity(
    path: str, spec: SchemaSpec, application_id: int, user_version: int, objects: int
) -> bool:
    """True when the file is empty and needs a schema; raises SchemaMismatch when foreign."""
    if application_id == spec.application_id and user_version == spec.version:
        return False
    if application_id == 0 and user_version == 0 and objects == 0:
        return True
    if application_id != spec.application_id:
        raise _foreign(path, spec, application_id, user_version)
    detail = ""
    if spec.upgrade_from == user_version:
        detail = f"`crashqueuelab upgrade --database {path}` brings it to version {spec.version}"
    raise SchemaMismatch(path, user_version, spec.version, detail)


def _foreign(path: str, spec: SchemaSpec, application_id: int, version: int) -> SchemaMismatch:
    return SchemaMismatch(
        path,
        version,
        spec.version,
        f"not a {spec.name} database",
        application_ids=(application_id, spec.application_id),
    )


def _connect(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    try:
        return sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000)
    except sqlite3.Error as error:
        raise StoreError(path, f"cannot open: {error}") from None


def _make_durable(conn: sqlite3.Connection, name: str, busy_timeout_ms: int) -> None:
    conn.execute("PRAGMA journal_mode = WAL")
    _require_pragma(conn, name, "journal_mode", "wal")
    conn.execute("PRAGMA synchronous = FULL")
    _require_pragma(conn, name, "synchronous", _SYNCHRONOUS_FULL)
    conn.execute("PRAGMA foreign_keys = ON")
    _require_pragma(conn, name, "foreign_keys", 1)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")


def open_for_upgrade(
    path: str, spec: SchemaSpec, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
) -> tuple[sqlite3.Connection, int]:
    """A durable connection to an existing database of kind ``spec`` at any version, and
    that version (upgrade.py decides what to do with it). A file of another kind is refused
    before anything in it is changed."""
    conn = _connect(path, busy_timeout_ms)
    try:
        application_id, version, _ = _inspect(conn, path)
        if application_id != spec.application_id:
            raise _foreign(path, spec, application_id, version)
        _make_durable(conn, path, busy_timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn, version


def open_store(
    path: str | Path,
    *,
    create: bool,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    spec: SchemaSpec = QUEUE_SCHEMA,
) -> sqlite3.Connection:
    """Open a database of kind ``spec`` for writing, creating its schema when ``create`` allows."""
    name = str(path)
    if not Path(name).exists():
        if not create:
            raise StoreNotFound(name)
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    conn = _connect(name, busy_timeout_ms)
    try:
        needs_schema = _check_identity(name, spec, *_inspect(conn, name))
        if needs_schema and not create:
            raise SchemaMismatch(
                name, 0, spec.version, f"an empty file, not a {spec.name} database"
            )
        _make_durable(conn, name, busy_timeout_ms)
        # A larger page cache keeps the live part of big queues in memory (64 MiB at most).
        conn.execute("PRAGMA cache_size = -65536")
        if needs_schema:
            _create_schema(conn, spec)
        missing = missing_triggers(conn, spec)
        if missing:
            raise HistoryUnprotected(name, missing)
        # From here on, waits for the write lock are ours (locking.py), not SQLite's.
        conn.execute("PRAGMA busy_timeout = 0")
    except BaseException:
        conn.close()
        raise
    return conn


#: Runs the requests other writers posted (ticket, request bytes), in the open transaction;
#: returns a result for each, or None for one it gave back without writing anything.
Carrier = Callable[[list[tuple[int, bytes]]], list[bytes | None]]
#: How many waiting writers' requests one transaction carries at most.
CARRY_LIMIT = 32


@contextmanager
def write_transaction(
    conn: sqlite3.Connection,
    *,
    timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    turns: TurnLock | None = None,
    served: Served | None = None,
    carrier: Carrier | None = None,
    shared: SharedCommits | None = None,
) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (simulated crashes included).

    IMMEDIATE takes the write lock up front, so a transaction never upgrades from a read
    snapshot that another writer has made stale (which SQLite reports as SQLITE_BUSY
    without waiting). With ``turns``, writers of this database take the lock in arrival
    order (turns.py), in the turn ``served`` if the caller already waited for it; every
    wait is bounded by ``timeout_ms``. With a ``carrier``, the transaction first runs the
    requests that the writers right behind it in line posted, so its one commit (and
    fsync) serves them too (group commit); a rollback gives them back to their writers.
    ``shared`` counts the requests carried once the commit returned.
    """
    timeout_s = timeout_ms / 1000
    ticket = None
    if turns is not None:
        ticket = served.ticket if served is not None else turns.acquire(timeout_s=timeout_s)
    carried: list[int] = []
    applied = 0
    try:
        begin_immediate(conn, timeout_s=timeout_s)
        try:
            if turns is not None and ticket is not None and carrier is not None:
                taken = turns.take(ticket, limit=CARRY_LIMIT, timeout_s=timeout_s)
                carried = [behind for behind, _ in taken]
                if taken:
                    results = carrier(taken)
                    applied = sum(result is not None for result in results)
                    turns.note(list(zip(carried, results, strict=True)), timeout_s=timeout_s)
            yield conn
            conn.execute("COMMIT")
            if shared is not None:
                shared.carried_for_others += applied
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if turns is not None and carried:
                turns.abandon(carried, timeout_s=timeout_s)
                carried = []
            raise
    finally:
        if turns is not None and ticket is not None:
            turns.finish(ticket, carried, timeout_s=timeout_s)
