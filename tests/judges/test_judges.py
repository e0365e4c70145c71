"""The judges: they pass a healthy history and catch every kind of tampering."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

import crashqueuelab.judges
from crashqueuelab import NotADatabase, SchemaMismatch, StoreNotFound
from crashqueuelab.judges.invariants import check_database, invariant_names
from crashqueuelab.judges.replay import replay_database
from tests.conftest import STORED_ATTEMPTS, fingerprint, raw

JUDGES = Path(crashqueuelab.judges.__file__).parent


def test_the_judges_import_nothing_of_the_queue_they_judge() -> None:
    allowed = ("crashqueuelab.judges", "crashqueuelab.core.errors")
    for source in JUDGES.rglob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                if name.startswith("crashqueuelab"):
                    assert name.startswith(allowed), f"{source.name} imports {name}"
                # Nor the other systems they read: walqueue's, persist-queue's, huey's,
                # pgqueuer's, procrastinate's, RQ's, arq's, dramatiq's, taskiq's and Celery's
                # code (kombu is its messaging library), nor the Redis and AMQP clients they
                # bring.
                judged = (
                    "walqueue",
                    "persistqueue",
                    "huey",
                    "pgqueuer",
                    "procrastinate",
                    "rq",
                    "arq",
                    "dramatiq",
                    "taskiq",
                    "celery",
                    "kombu",
                    "redis",
                    "pika",
                )
                assert not name.startswith(judged), source.name


def test_a_healthy_database_passes_every_invariant_and_replays(
    populated: dict[str, str], db_path: Path
) -> None:
    before = fingerprint(db_path)
    report = check_database(db_path)
    assert report.ok, report.failed()
    assert [r.name for r in report.results] == invariant_names()
    assert report.jobs == 6
    replay = replay_database(db_path)
    assert replay.ok, replay.mismatches
    assert replay.jobs_replayed == 6
    assert replay.events_replayed == report.events
    assert fingerprint(db_path) == before


def test_replay_of_one_job_reads_only_its_history(populated: dict[str, str], db_path: Path) -> None:
    report = replay_database(db_path, job_id=populated["SUCCEEDED"])
    assert report.ok
    assert (report.jobs_replayed, report.events_replayed) == (1, 4)


Tamper = Callable[[dict[str, str]], list[str]]

# Each tampering: the SQL that corrupts the database (triggers dropped first where the
# history itself is rewritten), the invariants that must fail, and whether replay notices.
TAMPERING: dict[str, tuple[Tamper, set[str], bool]] = {
    "state rewritten": (
        lambda ids: [f"UPDATE jobs SET state = 'QUEUED' WHERE job_id = '{ids['DEAD']}'"],
        {"state_matches_last_event"},
        True,
    ),
    "attempts inflated": (
        lambda ids: [f"UPDATE jobs SET attempts = 2 WHERE job_id = '{ids['SUCCEEDED']}'"],
        {"attempts_match_claims"},
        True,
    ),
    "attempts beyond max": (
        lambda ids: [
            f"UPDATE jobs SET attempts = 9, max_attempts = 1 WHERE job_id = '{ids['QUEUED']}'"
        ],
        {"attempts_within_max", "attempts_match_claims"},
        True,
    ),
    "lease left on a finished job": (
        lambda ids: [f"UPDATE jobs SET lease_token = 'x' WHERE job_id = '{ids['SUCCEEDED']}'"],
        {"lease_fields_match_state"},
        True,
    ),
    "lease token swapped": (
        lambda ids: [f"UPDATE jobs SET lease_token = 'x' WHERE job_id = '{ids['LEASED']}'"],
        {"lease_fields_match_state"},
        True,
    ),
    "second open attempt": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET outcome = NULL WHERE job_id = '{ids['DEAD']}'",
        ],
        {"single_open_attempt"},
        True,
    ),
    "an attempt left open by its ending event": (
        lambda ids: [
            "DROP TRIGGER events_no_update",
            f"UPDATE events SET attempt = 9 WHERE job_id = '{ids['DEAD']}'"
            " AND event_type IN ('FAILED', 'LEASE_EXPIRED')",
        ],
        {"single_open_attempt", "append_only_triggers"},
        True,
    ),
    "payload edited": (
        lambda ids: [f"UPDATE jobs SET payload_json = '{{}}' WHERE job_id = '{ids['QUEUED']}'"],
        {"payload_digest_matches"},
        False,
    ),
    "payload not canonical": (
        lambda ids: [
            "UPDATE jobs SET payload_json = '{\"n\": 1}',"
            " payload_sha256 = '3f6e0b0d6c4e3b5d9eb7b8d8e9a4e0a3ed8e4f5a0c7c0e6f1b1e2b5f8a1c9d00'"
            f" WHERE job_id = '{ids['QUEUED']}'"
        ],
        {"payload_digest_matches"},
        True,
    ),
    "dead too early": (
        lambda ids: [
            f"UPDATE jobs SET state = 'DEAD', lease_worker_id = NULL, lease_token = NULL,"
            f" lease_deadline_us = NULL WHERE job_id = '{ids['LEASED']}'",
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET outcome = 'FAILED' WHERE job_id = '{ids['LEASED']}'",
        ],
        {"dead_only_when_exhausted", "state_matches_last_event"},
        True,
    ),
    "history rewritten after the fact": (
        lambda ids: [
            "DROP TRIGGER events_no_update",
            f"UPDATE events SET worker_id = 'intruder' WHERE job_id = '{ids['SUCCEEDED']}'"
            " AND event_type = 'SUCCEEDED'",
        ],
        {"append_only_triggers", "success_from_lease_holder"},
        True,
    ),
    "event deleted": (
        lambda ids: [
            "DROP TRIGGER events_no_delete",
            "DELETE FROM events WHERE seq = 3",
        ],
        {"append_only_triggers", "event_sequence_contiguous"},
        True,
    ),
    "event after a terminal state": (
        lambda ids: [
            "INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt)"
            f" VALUES ('{ids['SUCCEEDED']}', 'PROMOTED', 'SUCCEEDED', 'QUEUED', 0, 1)",
        ],
        {"terminal_states_are_final", "transitions_are_legal", "state_matches_last_event"},
        True,
    ),
    "job without history": (
        lambda ids: [
            "PRAGMA foreign_keys = OFF",
            "INSERT INTO jobs (job_id, idempotency_key, job_type, payload_json, payload_sha256,"
            " state, attempts, max_attempts, available_at_us, created_at_us, updated_at_us)"
            " VALUES ('ghost', 'ghost', 't', '{}',"
            " '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a',"
            " 'QUEUED', 0, 1, 0, 0, 0)",
        ],
        {"events_reference_jobs"},
        True,
    ),
    "history of an unknown job": (
        lambda ids: [
            "PRAGMA foreign_keys = OFF",
            "INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt)"
            " VALUES ('phantom', 'CLAIMED', 'QUEUED', 'LEASED', 0, 1)",
        ],
        {"events_reference_jobs", "first_event_is_submission"},
        True,
    ),
    "idempotency index dropped and key duplicated": (
        lambda ids: [
            "CREATE TABLE jobs_copy AS SELECT * FROM jobs",
            "PRAGMA foreign_keys = OFF",
            "DROP TABLE jobs",
            "CREATE TABLE jobs AS SELECT * FROM jobs_copy",
            "DROP TABLE jobs_copy",
            f"UPDATE jobs SET idempotency_key = 'QUEUED' WHERE job_id = '{ids['LEASED']}'",
        ],
        {"idempotency_keys_unique"},
        True,
    ),
    "lease token reused": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET lease_token = (SELECT lease_token FROM attempts"
            f" WHERE job_id = '{ids['SUCCEEDED']}') WHERE job_id = '{ids['DEAD']}'",
        ],
        {"lease_tokens_unique"},
        True,
    ),
    "lease token reused in the history": (
        lambda ids: [
            "DROP TRIGGER events_no_update",
            f"UPDATE events SET lease_token = (SELECT lease_token FROM events"
            f" WHERE job_id = '{ids['SUCCEEDED']}' AND event_type = 'CLAIMED')"
            f" WHERE job_id = '{ids['DEAD']}' AND event_type = 'CLAIMED'",
        ],
        {"lease_tokens_unique", "append_only_triggers"},
        True,
    ),
}


@pytest.mark.parametrize("name", list(TAMPERING))
def test_tampering_is_caught_by_the_named_invariants(
    populated: dict[str, str], db_path: Path, name: str
) -> None:
    tamper, expected, replay_notices = TAMPERING[name]
    conn = raw(db_path)
    for statement in tamper(populated):
        conn.execute(statement)
    conn.close()
    report = check_database(db_path)
    assert not report.ok
    assert expected <= set(report.failed()), report.failed()
    assert replay_database(db_path).ok is not replay_notices


def test_integrity_check_failures_are_reported(populated: dict[str, str], db_path: Path) -> None:
    conn = raw(db_path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'events_by_job'")
    index_page = root.fetchone()[0]
    conn.close()
    data = bytearray(db_path.read_bytes())
    offset = (index_page - 1) * page_size
    # Scribble over the cells of an index page: the table stays readable, the index lies.
    data[offset + 200 : offset + page_size - 8] = b"\x00" * (page_size - 208)
    db_path.write_bytes(bytes(data))
    report = check_database(db_path)
    assert "integrity_check" in report.failed()


def test_the_judges_refuse_what_is_not_a_queue_database(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    with pytest.raises(StoreNotFound):
        check_database(missing)
    assert not missing.exists()
    text = tmp_path / "text.sqlite"
    text.write_text("not a database " * 100)
    with pytest.raises(NotADatabase):
        replay_database(text)
    foreign = tmp_path / "foreign.sqlite"
    conn = raw(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(SchemaMismatch):
        check_database(foreign)
    conn = raw(foreign)
    conn.execute("PRAGMA application_id = 1129401393")
    conn.execute("PRAGMA user_version = 7")
    conn.close()
    with pytest.raises(SchemaMismatch):
        check_database(foreign)


@pytest.mark.parametrize("version", [1, 2])
def test_a_store_kept_from_an_older_schema_version_is_judged_but_not_written(
    populated: dict[str, str], db_path: Path, version: int
) -> None:
    """Versions 1 and 2 kept the attempts in a table (1 wrote its constraints as IN lists):
    the judges read it and hold it against the events; the queue refuses to write there."""
    from crashqueuelab import DurableQueue

    conn = raw(db_path)
    for statement in STORED_ATTEMPTS:
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    before = fingerprint(db_path)
    assert check_database(db_path).ok
    assert replay_database(db_path).ok
    with pytest.raises(SchemaMismatch) as caught:
        DurableQueue(db_path, create=False)
    assert (caught.value.found, caught.value.expected) == (version, 3)
    assert fingerprint(db_path) == before


def test_replay_flags_illegal_histories(populated: dict[str, str], db_path: Path) -> None:
    conn = raw(db_path)
    conn.execute("DROP TRIGGER events_no_update")
    leased = populated["LEASED"]
    conn.execute(
        "UPDATE events SET event_type = 'HEARTBEAT', from_state = 'LEASED', to_state = 'LEASED'"
        f" WHERE job_id = '{leased}' AND event_type = 'CLAIMED'"
    )
    conn.execute(f"UPDATE events SET event_type = 'MYSTERY' WHERE job_id = '{populated['QUEUED']}'")
    conn.close()
    fields = {(m.job_id, m.field.split(" ")[-1]) for m in replay_database(db_path).mismatches}
    assert (leased, "HEARTBEAT") in fields
    assert (populated["QUEUED"], "history") in fields


def test_judging_a_closed_database_creates_no_file_beside_it(tmp_path: Path) -> None:
    """Read-only and immutable: a judged directory (even a read-only one) stays as it was."""
    from crashqueuelab import DurableQueue

    path = tmp_path / "queue.sqlite"
    with DurableQueue(path) as queue:
        queue.submit(idempotency_key="k", job_type="t", payload={})
    foreign = tmp_path / "other.db"
    conn = raw(foreign)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert check_database(path).ok
    assert replay_database(path).ok
    with pytest.raises(SchemaMismatch, match="application_id 0x00000000, expected 0x43514c31"):
        check_database(foreign)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
