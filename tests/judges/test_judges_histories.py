"""Forged histories: each rewrite of one event must be named precisely by the judges."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from tests.conftest import STORED_ATTEMPTS, raw

Ids = dict[str, str]
NOPE_DIGEST = hashlib.sha256(b"nope").hexdigest()


def event_of(ids: Ids, name: str, event_type: str) -> str:
    return f"job_id = '{ids[name]}' AND event_type = '{event_type}'"


# name -> (statements, substring expected in some replay mismatch field, invariants that fail)
FORGERIES: dict[str, tuple[Callable[[Ids], list[str]], str, set[str]]] = {
    "success by another worker": (
        lambda ids: [
            f"UPDATE events SET worker_id = 'x' WHERE {event_of(ids, 'SUCCEEDED', 'SUCCEEDED')}"
        ],
        "SUCCEEDED worker_id",
        {"success_from_lease_holder"},
    ),
    "success with another token": (
        lambda ids: [
            f"UPDATE events SET lease_token = 'x' WHERE {event_of(ids, 'SUCCEEDED', 'SUCCEEDED')}"
        ],
        "SUCCEEDED lease_token",
        {"success_from_lease_holder"},
    ),
    "heartbeat for another attempt": (
        lambda ids: [
            f"UPDATE events SET attempt = 7 WHERE {event_of(ids, 'SUCCEEDED', 'HEARTBEAT')}"
        ],
        "HEARTBEAT attempt",
        set(),
    ),
    "success after the deadline": (
        lambda ids: [
            f"UPDATE events SET at_us = 10000000000 WHERE {event_of(ids, 'SUCCEEDED', 'SUCCEEDED')}"
        ],
        "SUCCEEDED at_us",
        {"success_from_lease_holder"},
    ),
    "expiry before the deadline": (
        lambda ids: [
            f"UPDATE events SET at_us = 0 WHERE {event_of(ids, 'RECOVERED', 'LEASE_EXPIRED')}"
        ],
        "LEASE_EXPIRED at_us",
        set(),
    ),
    "promotion before the retry time": (
        lambda ids: [f"UPDATE events SET at_us = 0 WHERE {event_of(ids, 'RECOVERED', 'PROMOTED')}"],
        "at_us",
        set(),
    ),
    "claim numbered wrongly": (
        lambda ids: [f"UPDATE events SET attempt = 3 WHERE {event_of(ids, 'LEASED', 'CLAIMED')}"],
        "attempt",
        {"attempts_match_claims"},
    ),
    "a second submission": (
        lambda ids: [
            "INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt)"
            f" VALUES ('{ids['QUEUED']}', 'SUBMITTED', NULL, 'QUEUED', 0, 0)"
        ],
        "history",
        {"first_event_is_submission", "transitions_are_legal"},
    ),
    "from_state that was not the state": (
        lambda ids: [
            f"UPDATE events SET from_state = 'QUEUED' WHERE {event_of(ids, 'DEAD', 'FAILED')}"
        ],
        "from_state",
        {"transitions_are_legal"},
    ),
    "retry that should have been dead": (
        lambda ids: [
            "UPDATE events SET to_state = 'RETRY_SCHEDULED'"
            f" WHERE {event_of(ids, 'DEAD', 'FAILED')}"
        ],
        "to_state",
        {"state_matches_last_event"},
    ),
    "claims beyond max_attempts": (
        lambda ids: [
            "UPDATE events SET detail = replace(detail, '\"max_attempts\":3', '\"max_attempts\":0')"
            f" WHERE {event_of(ids, 'LEASED', 'SUBMITTED')}"
        ],
        "attempts",
        set(),
    ),
    "jobs row deleted": (
        lambda ids: [
            "PRAGMA foreign_keys = OFF",
            f"DELETE FROM jobs WHERE job_id = '{ids['QUEUED']}'",
        ],
        "row",
        {"events_reference_jobs"},
    ),
    "attempt row deleted": (
        lambda ids: [*STORED_ATTEMPTS, f"DELETE FROM attempts WHERE job_id = '{ids['DEAD']}'"],
        "attempt rows",
        {"attempts_match_claims"},
    ),
    "attempt row altered": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET error = 'rewritten' WHERE job_id = '{ids['DEAD']}'",
        ],
        "attempt 1 error",
        set(),
    ),
    "event on a finished job": (
        lambda ids: [
            "INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt,"
            f" worker_id, lease_token) VALUES ('{ids['DEAD']}', 'HEARTBEAT', 'LEASED', 'LEASED',"
            " 0, 1, 'w', 't')"
        ],
        "HEARTBEAT",
        {"terminal_states_are_final", "transitions_are_legal"},
    ),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_histories_are_named(populated: Ids, db_path: Path, name: str) -> None:
    forge, field, invariants = FORGERIES[name]
    conn = raw(db_path)
    conn.execute("DROP TRIGGER events_no_update")
    for statement in forge(populated):
        conn.execute(statement)
    conn.close()
    report = replay_database(db_path)
    assert not report.ok
    assert any(field in mismatch.field for mismatch in report.mismatches), report.mismatches
    failed = set(check_database(db_path).failed())
    assert invariants | {"append_only_triggers"} <= failed


# name -> (statements, the invariant that must fail)
ROW_DAMAGE: dict[str, tuple[Callable[[Ids], list[str]], str]] = {
    "a trigger that no longer aborts": (
        lambda ids: [
            "DROP TRIGGER events_no_delete",
            "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT 1; END",
        ],
        "append_only_triggers",
    ),
    "an unknown state": (
        lambda ids: [
            "CREATE TABLE j AS SELECT * FROM jobs",
            "PRAGMA foreign_keys = OFF",
            "DROP TABLE jobs",
            "CREATE TABLE jobs AS SELECT * FROM j",
            f"UPDATE jobs SET state = 'LIMBO' WHERE job_id = '{ids['QUEUED']}'",
        ],
        "state_matches_last_event",
    ),
    "attempt rows numbered from two": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET attempt = 2 WHERE job_id = '{ids['DEAD']}'",
        ],
        "attempts_match_claims",
    ),
    "a leased job without an open attempt": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET outcome = 'FAILED' WHERE job_id = '{ids['LEASED']}'",
        ],
        "single_open_attempt",
    ),
    "a leased job whose attempt an event ended": (
        lambda ids: [
            "INSERT INTO events (job_id, event_type, from_state, to_state, at_us, attempt,"
            " worker_id, lease_token, error) SELECT job_id, 'FAILED', 'LEASED',"
            " 'RETRY_SCHEDULED', at_us, attempt, worker_id, lease_token, 'x' FROM events"
            f" WHERE job_id = '{ids['LEASED']}' AND event_type = 'CLAIMED'",
        ],
        "single_open_attempt",
    ),
    "a leased job without a deadline": (
        lambda ids: [f"UPDATE jobs SET lease_deadline_us = NULL WHERE job_id = '{ids['LEASED']}'"],
        "lease_fields_match_state",
    ),
    "a succeeded job with no success event": (
        lambda ids: [
            f"UPDATE jobs SET state = 'SUCCEEDED', lease_worker_id = NULL, lease_token = NULL,"
            f" lease_deadline_us = NULL WHERE job_id = '{ids['RETRY_SCHEDULED']}'"
        ],
        "success_from_lease_holder",
    ),
    "a success whose attempt row failed": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET outcome = 'FAILED' WHERE job_id = '{ids['SUCCEEDED']}'",
        ],
        "success_from_lease_holder",
    ),
    "a success after the attempt's deadline": (
        lambda ids: [
            *STORED_ATTEMPTS,
            f"UPDATE attempts SET lease_deadline_us = 0 WHERE job_id = '{ids['SUCCEEDED']}'",
        ],
        "success_from_lease_holder",
    ),
    "a success after the deadline its history set": (
        lambda ids: [
            "DROP TRIGGER events_no_update",
            f"UPDATE events SET lease_deadline_us = 0 WHERE job_id = '{ids['SUCCEEDED']}'"
            " AND event_type IN ('CLAIMED', 'HEARTBEAT')",
        ],
        "success_from_lease_holder",
    ),
    "a payload that is not JSON": (
        lambda ids: [
            f"UPDATE jobs SET payload_json = 'nope', payload_sha256 = '{NOPE_DIGEST}'"
            f" WHERE job_id = '{ids['QUEUED']}'"
        ],
        "payload_digest_matches",
    ),
}


@pytest.mark.parametrize("name", list(ROW_DAMAGE))
def test_damaged_rows_fail_the_named_invariant(populated: Ids, db_path: Path, name: str) -> None:
    damage, invariant = ROW_DAMAGE[name]
    conn = raw(db_path)
    for statement in damage(populated):
        conn.execute(statement)
    conn.close()
    assert invariant in check_database(db_path).failed()
