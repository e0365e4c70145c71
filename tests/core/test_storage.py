"""Opening the store: durability pragmas, schema identity, refusal of foreign files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crashqueuelab import (
    DurableQueue,
    HistoryUnprotected,
    NotADatabase,
    SchemaMismatch,
    StoreError,
    StoreNotFound,
)
from crashqueuelab.core import storage
from crashqueuelab.core.errors import DurabilityUnavailable
from crashqueuelab.core.storage import _require_pragma, open_store, write_transaction
from tests.conftest import fingerprint, raw


def test_a_new_store_runs_in_wal_with_synchronous_full(db_path: Path) -> None:
    conn = open_store(db_path, create=True)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    finally:
        conn.close()


def test_opening_twice_keeps_the_schema(db_path: Path) -> None:
    open_store(db_path, create=True).close()
    conn = open_store(db_path, create=False)
    conn.close()


def test_a_missing_store_is_not_created_unless_asked(db_path: Path) -> None:
    with pytest.raises(StoreNotFound):
        DurableQueue(db_path, create=False)
    assert not db_path.exists()


def test_a_file_that_is_not_sqlite_is_refused_and_untouched(db_path: Path) -> None:
    db_path.write_bytes(b"this is a text file, not a database\n" * 200)
    before = db_path.read_bytes()
    with pytest.raises(NotADatabase):
        DurableQueue(db_path)
    assert db_path.read_bytes() == before
    assert not Path(f"{db_path}-wal").exists()


def test_a_foreign_database_is_refused_before_its_journal_mode_changes(db_path: Path) -> None:
    conn = raw(db_path)
    conn.execute("CREATE TABLE other (x)")
    conn.close()
    before = fingerprint(db_path)
    with pytest.raises(SchemaMismatch) as caught:
        DurableQueue(db_path)
    assert "not a crashqueuelab queue database" in str(caught.value)
    assert fingerprint(db_path) == before
    check = raw(db_path)
    assert check.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    check.close()


def test_another_schema_version_is_refused(db_path: Path) -> None:
    DurableQueue(db_path).close()
    conn = raw(db_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    before = fingerprint(db_path)
    with pytest.raises(SchemaMismatch) as caught:
        DurableQueue(db_path)
    assert (caught.value.found, caught.value.expected) == (99, 3)
    assert fingerprint(db_path) == before


def test_an_empty_file_is_not_a_store_unless_creating(db_path: Path) -> None:
    db_path.write_bytes(b"")
    with pytest.raises(SchemaMismatch):
        DurableQueue(db_path, create=False)
    assert db_path.read_bytes() == b""


def test_dropped_history_triggers_are_refused(db_path: Path) -> None:
    DurableQueue(db_path).close()
    conn = raw(db_path)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.close()
    with pytest.raises(HistoryUnprotected) as caught:
        DurableQueue(db_path)
    assert caught.value.missing == ("events_no_delete",)


@pytest.mark.parametrize("statement", ["UPDATE events SET error = 'x'", "DELETE FROM events"])
def test_the_event_history_is_append_only(queue: DurableQueue, statement: str) -> None:
    queue.submit(idempotency_key="k", job_type="t", payload={})
    conn = raw(Path(queue.path))
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(statement)
    finally:
        conn.close()


def test_a_refused_pragma_is_reported() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(DurabilityUnavailable) as caught:
            _require_pragma(conn, ":memory:", "journal_mode", "wal")
        assert caught.value.got == "memory"
    finally:
        conn.close()


def test_write_transaction_rolls_back_on_any_exception(db_path: Path) -> None:
    conn = open_store(db_path, create=True)
    try:

        def insert_then_interrupt() -> None:
            with write_transaction(conn):
                conn.execute(
                    "INSERT INTO jobs (job_id, idempotency_key, job_type, payload_json,"
                    " payload_sha256, state, attempts, max_attempts, available_at_us,"
                    " created_at_us, updated_at_us)"
                    " VALUES ('j', 'k', 't', '{}', 'x', 'QUEUED', 0, 1, 0, 0, 0)"
                )
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            insert_then_interrupt()
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
        assert not conn.in_transaction
    finally:
        conn.close()


def test_a_connection_is_never_used_from_another_process(queue: DurableQueue) -> None:
    queue._pid = -1  # what a forked child would see
    with pytest.raises(StoreError, match="another process"):
        queue.get("job-x")


def test_no_constraint_or_index_condition_is_an_in_list(db_path: Path) -> None:
    """SQLite builds a temporary b-tree per run for such a list: per row under executemany."""
    conn = open_store(db_path, create=True)
    try:
        schema = [row[0] for row in conn.execute("SELECT sql FROM sqlite_master WHERE sql > ''")]
        claim_plan = [
            row[3]
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT submit_seq FROM jobs WHERE state = 'QUEUED'"
                " AND available_at_us <= 0 ORDER BY available_at_us, submit_seq"
            )
        ]
    finally:
        conn.close()
    assert len(schema) == 7
    assert not [sql for sql in schema if " IN (" in sql.upper()]
    # A query naming one live state is enough for the partial index of live jobs.
    assert any("jobs_active" in step for step in claim_plan), claim_plan


def _recording_connections(monkeypatch: pytest.MonkeyPatch) -> list[sqlite3.Connection]:
    made: list[sqlite3.Connection] = []
    connect = storage._connect

    def recording(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
        made.append(connect(path, busy_timeout_ms))
        return made[-1]

    monkeypatch.setattr(storage, "_connect", recording)
    return made


def _is_closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


def test_a_turn_lock_the_disk_refuses_leaves_no_connection_open(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _recording_connections(monkeypatch)
    Path(f"{db_path}-turns").mkdir()  # the sidecar cannot be opened as a file
    with pytest.raises(IsADirectoryError):
        DurableQueue(db_path)
    assert len(made) == 1
    assert _is_closed(made[0])


def test_a_failing_turn_lock_close_still_closes_the_connection(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _recording_connections(monkeypatch)
    queue = DurableQueue(db_path)

    def refused() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(queue._turns, "close", refused)
    with pytest.raises(OSError, match="Input/output"):
        queue.close()
    assert len(made) == 1
    assert _is_closed(made[0])
    with pytest.raises(StoreError, match="closed"):
        queue.submit(idempotency_key="k", job_type="t", payload={})
