"""Upgrading a store of schema version 2 (attempts stored) to version 3 (attempts derived)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crashqueuelab import (
    DurableQueue,
    NotADatabase,
    SchemaMismatch,
    StoreNotFound,
    UpgradeRefused,
    check_database,
    replay_database,
    upgrade_store,
)
from crashqueuelab.cli import EXIT_OK, EXIT_STORE
from tests.conftest import STORED_ATTEMPTS, RunCli, fingerprint, raw


def _as_version_2(db_path: Path, *tamper: str) -> None:
    conn = raw(db_path)
    try:
        for statement in (*STORED_ATTEMPTS, *tamper):
            conn.execute(statement)
    finally:
        conn.close()


def _rows(db_path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_a_version_2_store_is_refused_with_the_way_forward_then_upgraded_losing_nothing(
    populated: dict[str, str], db_path: Path
) -> None:
    _as_version_2(db_path)
    stored = _rows(db_path, "SELECT * FROM attempts ORDER BY job_id, attempt")
    jobs = _rows(db_path, "SELECT * FROM jobs ORDER BY submit_seq")
    events = _rows(db_path, "SELECT * FROM events ORDER BY seq")
    with pytest.raises(SchemaMismatch, match="crashqueuelab upgrade --database"):
        DurableQueue(db_path, create=False)

    result = upgrade_store(db_path)

    assert (result.upgraded, result.from_version, result.to_version) == (True, 2, 3)
    assert result.attempts == len(stored) == 5
    assert _rows(db_path, "SELECT type FROM sqlite_master WHERE name = 'attempts'") == [("view",)]
    assert _rows(db_path, "SELECT * FROM attempts ORDER BY job_id, attempt") == stored
    assert _rows(db_path, "SELECT * FROM jobs ORDER BY submit_seq") == jobs
    assert _rows(db_path, "SELECT * FROM events ORDER BY seq") == events
    assert check_database(db_path).ok
    assert replay_database(db_path).ok
    queue = DurableQueue(db_path, create=False)
    try:
        assert [a.outcome for a in queue.attempts(populated["RECOVERED"])] == ["EXPIRED"]
    finally:
        queue.close()


@pytest.mark.parametrize(
    ("tamper", "mismatched"),
    [
        ("UPDATE attempts SET error = 'rewritten' WHERE outcome = 'EXPIRED'", 2),
        ("DELETE FROM attempts WHERE outcome = 'SUCCEEDED'", 1),
        ("INSERT INTO attempts SELECT * FROM attempts WHERE outcome = 'SUCCEEDED'", 1),
    ],
)
def test_attempt_rows_that_differ_from_the_events_refuse_the_upgrade_untouched(
    populated: dict[str, str], db_path: Path, tamper: str, mismatched: int, run_cli: RunCli
) -> None:
    """Only rows the events also say may be dropped: a changed row counts twice (a stored row
    the events do not derive, a derived row not stored), a missing or doubled one once."""
    _as_version_2(db_path, tamper)
    before = fingerprint(db_path)
    with pytest.raises(UpgradeRefused) as caught:
        upgrade_store(db_path)
    assert caught.value.mismatched_rows == mismatched
    assert fingerprint(db_path) == before
    outcome = run_cli("upgrade", "--database", str(db_path))
    assert outcome.code == EXIT_STORE
    assert outcome.result["error"] == {
        "type": "UpgradeRefused",
        "message": str(caught.value),
        "path": str(db_path),
        "mismatched_rows": mismatched,
    }
    assert fingerprint(db_path) == before


def test_a_current_store_is_left_as_it_is(
    populated: dict[str, str], db_path: Path, run_cli: RunCli
) -> None:
    before = fingerprint(db_path)
    outcome = run_cli("upgrade", "--database", str(db_path))
    assert (outcome.code, outcome.result) == (
        EXIT_OK,
        {"ok": True, "upgraded": False, "from_version": 3, "to_version": 3, "attempts": 5},
    )
    assert fingerprint(db_path) == before


def test_the_cli_upgrades_a_version_2_store(
    populated: dict[str, str], db_path: Path, run_cli: RunCli
) -> None:
    _as_version_2(db_path)
    outcome = run_cli("upgrade", "--database", str(db_path))
    assert (outcome.code, outcome.result) == (
        EXIT_OK,
        {"ok": True, "upgraded": True, "from_version": 2, "to_version": 3, "attempts": 5},
    )
    assert check_database(db_path).ok


def test_other_versions_and_foreign_files_are_refused_untouched(
    populated: dict[str, str], db_path: Path, tmp_path: Path
) -> None:
    _as_version_2(db_path, "PRAGMA user_version = 1")
    before = fingerprint(db_path)
    with pytest.raises(SchemaMismatch, match="only version 2 can be upgraded"):
        upgrade_store(db_path)
    assert fingerprint(db_path) == before

    foreign = tmp_path / "foreign.sqlite"
    conn = raw(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = fingerprint(foreign)
    with pytest.raises(SchemaMismatch, match="not a crashqueuelab queue database"):
        upgrade_store(foreign)
    assert fingerprint(foreign) == before

    text = tmp_path / "notes.txt"
    text.write_text("not a database, " * 100)
    with pytest.raises(NotADatabase):
        upgrade_store(text)
    assert text.read_text() == "not a database, " * 100

    with pytest.raises(StoreNotFound):
        upgrade_store(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()
