"""The PostgreSQL judge, with its own SQL: a clean store passes; every planted anomaly is
named; the rows it judged are kept, and judged again once the server is gone."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crashqueuelab.judges.readers.postgres import JUDGED_ROWS_FILE, judge_rows, read_postgres_store
from crashqueuelab.postgres.queue import PgAck
from crashqueuelab.servers.postgres import DSN_VARIABLE
from crashqueuelab.systems.postgres import store_schema
from tests.postgres.test_queue import LEASE_US, open_queue, submit

TRIGGERS = ["events_append_only", "events_no_truncate"]


def _worked_store(dsn: str, directory: Path) -> None:
    """One job acknowledged, one failed once, one left leased."""
    queue = open_queue(dsn, directory)
    try:
        for key in ("done", "failed", "leased"):
            submit(queue, key)
        claims = queue.claim_many("w1", LEASE_US, 3)
        by_key = {job.key: job for job in claims}
        done, failed = by_key["done"], by_key["failed"]
        assert queue.succeed_many([PgAck(done.job_id, "w1", str(done.lease_token))]) == [True]
        assert queue.fail(PgAck(failed.job_id, "w1", str(failed.lease_token)), "boom")
    finally:
        queue.close()


def _rows(directory: Path) -> dict[str, Any]:
    kept: dict[str, Any] = json.loads((directory / JUDGED_ROWS_FILE).read_text())
    return kept


def test_a_worked_store_passes_and_its_judged_rows_are_kept(
    postgres_dsn: str, tmp_path: Path
) -> None:
    _worked_store(postgres_dsn, tmp_path / "store")
    reading = read_postgres_store(tmp_path / "store")
    assert reading.ok, reading.problems
    assert reading.jobs == {
        "done": ("SUCCEEDED", 1),
        "failed": ("RETRY_SCHEDULED", 1),
        "leased": ("LEASED", 1),
    }
    assert reading.last_event == "FAILED"
    rows = _rows(tmp_path / "store")
    assert len(rows["events"]) == 3 + 3 + 2
    # The server is gone: the verdict is re-run from the kept rows, and says so.
    offline = read_postgres_store(tmp_path / "store", environ={})
    assert (offline.ok, offline.jobs) == (True, reading.jobs)
    assert JUDGED_ROWS_FILE in offline.source


def test_a_directory_without_a_store_holds_no_job(tmp_path: Path) -> None:
    assert read_postgres_store(tmp_path).exists is False


def test_no_server_and_no_kept_rows_is_a_problem_not_a_crash(
    postgres_dsn: str, tmp_path: Path
) -> None:
    store_schema(tmp_path, postgres_dsn)
    reading = read_postgres_store(tmp_path, environ={})
    assert reading.problems == [
        f"schema {store_schema(tmp_path, postgres_dsn)}: no server reachable and no kept rows"
    ]
    unreachable = {DSN_VARIABLE: "host=/nonexistent port=1 connect_timeout=1"}
    assert read_postgres_store(tmp_path, environ=unreachable).ok is False


def test_a_row_rewritten_behind_the_history_fails_replay(postgres_dsn: str, tmp_path: Path) -> None:
    _worked_store(postgres_dsn, tmp_path / "store")
    schema = store_schema(tmp_path / "store", postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {schema}.jobs SET state = 'QUEUED', lease_worker_id = NULL,"
            " lease_token = NULL, lease_deadline_us = NULL"
            " WHERE idempotency_key = 'leased'".encode()
        )
        conn.execute(f"ALTER TABLE {schema}.events DISABLE TRIGGER events_no_truncate".encode())
    reading = read_postgres_store(tmp_path / "store")
    assert not reading.replay_ok
    assert any("replay ends LEASED/1, the row is QUEUED/1" in p for p in reading.problems)
    assert "invariant failed: append-only trigger missing: events_no_truncate" in reading.problems


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        ("token_twice", "already leased for"),
        ("ack_at_deadline", "at or after the deadline"),
        ("ack_by_other_worker", "the lease was w1/"),
        ("early_expiry", "expired (seq"),
        ("too_many_attempts", "attempts of at most"),
        ("dead_with_attempts_left", "dead with attempts left"),
        ("lease_columns_without_lease", "lease columns"),
        ("second_submission", "not exactly one SUBMITTED"),
        ("unknown_event", "unknown event"),
        ("orphan_event", "names unknown job"),
        ("wrong_from_state", "from QUEUED while LEASED"),
        ("wrong_to_state", "to QUEUED"),
        ("attempt_number", "replay has"),
    ],
)
def test_each_planted_anomaly_is_named(
    postgres_dsn: str, tmp_path: Path, plant: str, named: str
) -> None:
    _worked_store(postgres_dsn, tmp_path / "store")
    read_postgres_store(tmp_path / "store")
    rows = copy.deepcopy(_rows(tmp_path / "store"))
    jobs = {job["idempotency_key"]: job for job in rows["jobs"]}
    events = rows["events"]
    claims = [event for event in events if event["event_type"] == "CLAIMED"]
    done_ack = next(event for event in events if event["event_type"] == "SUCCEEDED")
    failed_id = jobs["failed"]["job_id"]
    if plant == "token_twice":
        claims[1]["lease_token"] = claims[0]["lease_token"]
    elif plant == "ack_at_deadline":
        done_ack["at_us"] = next(c for c in claims if c["job_id"] == done_ack["job_id"])[
            "lease_deadline_us"
        ]
    elif plant == "ack_by_other_worker":
        done_ack["worker_id"] = "w2"
    elif plant == "early_expiry":
        failure = next(event for event in events if event["event_type"] == "FAILED")
        failure["event_type"] = "LEASE_EXPIRED"
    elif plant == "too_many_attempts":
        jobs["failed"]["attempts"] = 9
    elif plant == "dead_with_attempts_left":
        jobs["failed"]["state"] = "DEAD"
    elif plant == "lease_columns_without_lease":
        jobs["done"]["lease_token"] = "lease-x"
    elif plant == "second_submission":
        events.append(dict(events[0], seq=999))
    elif plant == "unknown_event":
        events.append(dict(events[-1], seq=999, event_type="TELEPORTED"))
    elif plant == "orphan_event":
        events.append(dict(events[0], seq=999, job_id="job-nobody"))
    elif plant == "wrong_from_state":
        done_ack["from_state"] = "QUEUED"
    elif plant == "wrong_to_state":
        done_ack["to_state"] = "QUEUED"
    elif plant == "attempt_number":
        next(e for e in events if e["job_id"] == failed_id and e["event_type"] == "FAILED")[
            "attempt"
        ] = 2
    reading = judge_rows(rows["jobs"], events, TRIGGERS)
    assert not reading.ok
    assert any(named in problem for problem in reading.problems), reading.problems
