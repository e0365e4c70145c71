"""The PostgreSQL queue against a real server: what it refuses at open, how it survives a
server that dies and a session that is ended, and that a retried transaction never reuses
what an earlier try carried."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import (
    DurabilityUnavailable,
    HistoryUnprotected,
    IdempotencyConflict,
    SchemaMismatch,
    StoreError,
)
from crashqueuelab.core.hooks import Phase
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.faults.network.plan import upstream_of
from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import WindowKind
from crashqueuelab.postgres.queue import PgAck, PostgresQueue, create_store
from crashqueuelab.servers.postgres import DSN_VARIABLE, ThrowawayServer
from crashqueuelab.systems.postgres import session_name, store_schema, terminate_sessions

RETRY = RetryPolicy(base_delay_us=1_000, max_delay_us=4_000)
LEASE_US = 1_000_000


def open_queue(
    dsn: str,
    directory: Path,
    *,
    hook: Any = None,
    stream: str = "q",
    setup_dsn: str | None = None,
) -> PostgresQueue:
    """The queue on ``dsn``, its store created through ``setup_dsn`` (default: ``dsn``)."""
    schema = store_schema(directory, dsn)
    create_store(setup_dsn or dsn, schema)
    return PostgresQueue(
        dsn,
        schema,
        clock=ManualClock(1_000_000_000),
        ids=SeededIds(3, stream),
        retry=RETRY,
        hook=hook,
        application_name=session_name(os.getpid()),
    )


@pytest.fixture
def queue(postgres_dsn: str, tmp_path: Path) -> Iterator[PostgresQueue]:
    opened = open_queue(postgres_dsn, tmp_path / "store")
    yield opened
    opened.close()


def submit(queue: PostgresQueue, key: str, **extra: Any) -> tuple[str, bool]:
    [result] = queue.submit_many(
        [{"idempotency_key": key, "job_type": "t", "payload": {"k": key}, **extra}]
    )
    return result


def test_a_key_names_one_job_and_a_different_request_under_it_is_refused(
    queue: PostgresQueue,
) -> None:
    job_id, created = submit(queue, "a")
    assert created
    assert submit(queue, "a") == (job_id, False)
    with pytest.raises(IdempotencyConflict) as caught:
        submit(queue, "a", max_attempts=5)
    assert caught.value.differing == ("max_attempts",)
    assert queue.active_count() == 1


def test_history_is_append_only_in_the_database(queue: PostgresQueue) -> None:
    submit(queue, "a")
    with psycopg.connect(queue.dsn, autocommit=True) as conn:
        for statement in ("UPDATE {}.events SET error = 'x'", "DELETE FROM {}.events"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement.format(queue.schema).encode())
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(f"TRUNCATE {queue.schema}.events CASCADE".encode())
        count = conn.execute(f"SELECT count(*) FROM {queue.schema}.events".encode()).fetchone()
    assert count == (1,)


def test_open_refuses_a_store_whose_history_lost_its_trigger(
    postgres_dsn: str, tmp_path: Path
) -> None:
    open_queue(postgres_dsn, tmp_path / "store").close()
    schema = store_schema(tmp_path / "store", postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER events_append_only ON {schema}.events".encode())
    with pytest.raises(HistoryUnprotected) as caught:
        open_queue(postgres_dsn, tmp_path / "store")
    assert caught.value.missing == ("events_append_only",)


def test_open_refuses_a_foreign_schema_and_a_missing_one(postgres_dsn: str, tmp_path: Path) -> None:
    schema = store_schema(tmp_path / "store", postgres_dsn)
    with pytest.raises(StoreError, match="no such schema"):
        PostgresQueue(postgres_dsn, schema, clock=ManualClock(1), ids=SeededIds(1), retry=RETRY)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
    with pytest.raises(SchemaMismatch):
        open_queue(postgres_dsn, tmp_path / "store")


def test_open_refuses_a_session_that_would_not_wait_for_its_commits(
    postgres_dsn: str, tmp_path: Path
) -> None:
    lax = postgres_dsn + " options='-c synchronous_commit=off'"
    with pytest.raises(DurabilityUnavailable) as caught:
        open_queue(lax, tmp_path / "store")
    assert (caught.value.pragma, caught.value.got) == ("synchronous_commit", "off")


def test_a_retried_claim_takes_fresh_tokens(postgres_dsn: str, tmp_path: Path) -> None:
    broken: list[str] = []

    def hook(phase: str) -> None:
        # The first try dies as a broken connection would; the transaction is tried again.
        if phase == Phase.BEFORE_CLAIM_COMMIT and not broken:
            broken.append(phase)
            raise psycopg.OperationalError("connection broke")

    queue = open_queue(postgres_dsn, tmp_path / "store", hook=hook)
    try:
        submit(queue, "a")
        [job] = queue.claim_many("w1", LEASE_US, 1)
    finally:
        queue.close()
    first_token = SeededIds(3, "q")
    first_token.job_id()  # the submission's job id comes first from the stream
    assert broken
    assert job.lease_token != first_token.lease_token()


def test_the_queue_lives_through_a_server_crash_and_a_terminated_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ThrowawayServer() as server:
        server.start()
        monkeypatch.setenv(DSN_VARIABLE, server.dsn)
        queue = open_queue(server.dsn, tmp_path / "store")
        try:
            submit(queue, "a")
            submit(queue, "b")
            [job] = queue.claim_many("w1", LEASE_US, 1)
            server.restart_after_crash()
            # The next operation reconnects; the committed claim is still there.
            assert queue.succeed_many([PgAck(job.job_id, "w1", str(job.lease_token))]) == [True]
            assert terminate_sessions(os.getpid()) >= 1
            [second] = queue.claim_many("w1", LEASE_US, 1)
            assert second.key == "b"
            assert queue.active_count() == 1
        finally:
            queue.close()


@pytest.mark.parametrize(
    ("settings", "required", "survives"),
    [
        ({}, None, True),
        ({"synchronous_commit": "off"}, {"fsync": "on"}, False),
    ],
)
def test_an_acknowledgement_survives_a_server_crash_only_when_its_commit_was_flushed(
    tmp_path: Path,
    settings: dict[str, str],
    required: dict[str, str] | None,
    survives: bool,
) -> None:
    # The WAL writer of this server wakes every 10 s, so an asynchronous commit's record is
    # still in the server's WAL buffers when it crashes (only whole WAL pages are written
    # before that, and the acknowledgement's commit record ends past the last whole page):
    # what the asynchronous-commit mutant risks, made certain (chaos shows it under load).
    from crashqueuelab.servers.postgres import SETTINGS
    from crashqueuelab.systems import OpenRequest
    from crashqueuelab.systems.postgres import open_postgres

    slow_writer = {**SETTINGS, "wal_writer_delay": "10000ms", "wal_writer_flush_after": "0"}
    with ThrowawayServer(settings=slow_writer) as server:
        server.start()
        os.environ[DSN_VARIABLE], previous = server.dsn, os.environ.get(DSN_VARIABLE)
        try:
            request = OpenRequest(tmp_path, ManualClock(1_000_000), SeededIds(5), RETRY)
            client = (
                open_postgres(request, session_settings=settings, required_settings=required)
                if required
                else open_postgres(request, session_settings=settings)
            )
            try:
                client.submit_many([_spec("a")])
                claim = client.claim("w1", LEASE_US)
                assert claim is not None
                assert client.succeed(claim).value == "succeeded"
                server.restart_after_crash()
                view = client.job("a")
            finally:
                client.close()
        finally:
            if previous is None:
                os.environ.pop(DSN_VARIABLE, None)
            else:
                os.environ[DSN_VARIABLE] = previous
    # Without the flush the acknowledgement is gone (and with it, as here, maybe the whole
    # job: its submission was asynchronous too).
    succeeded = view is not None and view.native_state == "SUCCEEDED"
    assert succeeded is survives, view


def _spec(key: str) -> Any:
    from crashqueuelab.systems import JobSpec

    return JobSpec(key=key, job_type="t", payload={"k": key})


def test_an_acknowledgement_whose_answer_was_lost_is_settled_by_asking_the_server(
    postgres_dsn: str, tmp_path: Path
) -> None:
    upstream, through = upstream_of(postgres_dsn)
    with FaultProxy(upstream) as proxy:

        def hook(phase: str) -> None:
            # Inside the transaction, every statement answered: from here the COMMIT reaches
            # the server and its answer does not; the connection is reset when the window
            # ends, and only the server knows the acknowledgement happened.
            if phase == Phase.BEFORE_SUCCESS_COMMIT:
                proxy.apply(WindowKind.LOST_REPLIES, ["worker"], seconds=0.3)

        queue = open_queue(through(proxy.add_path("worker")), tmp_path / "store", hook=hook)
        try:
            submit(queue, "a")
            [job] = queue.claim_many("w1", LEASE_US, 1)
            assert queue.succeed_many([PgAck(job.job_id, "w1", str(job.lease_token))]) == [True]
            assert proxy.counts["worker"]["lost_replies"] == 1
            done = queue.job_by_key("a")
            assert done is not None
            assert done.state == "SUCCEEDED"
        finally:
            queue.close()


def test_a_transition_whose_commit_never_left_the_client_is_tried_again(
    postgres_dsn: str, tmp_path: Path
) -> None:
    upstream, through = upstream_of(postgres_dsn)
    with FaultProxy(upstream) as proxy:
        # The store is created past the proxy: the connection that creates it closes as the
        # queue starts, and the proxy, still finishing that close on a loaded machine, would
        # reset it too (3.12's fast part counted two resets once).
        worker = through(proxy.add_path("worker"))
        queue = open_queue(worker, tmp_path / "store", setup_dsn=postgres_dsn)
        try:
            submit(queue, "a")
            [job] = queue.claim_many("w1", LEASE_US, 1)
            # A reset between two transitions: the next one finds its connection gone before
            # anything was sent, reconnects and runs once.
            proxy.apply(WindowKind.RESET, ["worker"], seconds=0)
            assert proxy.settle()  # the connection is gone before the acknowledgement is sent
            assert queue.succeed_many([PgAck(job.job_id, "w1", str(job.lease_token))]) == [True]
            assert proxy.counts["worker"]["reset"] == 1
        finally:
            queue.close()


@pytest.mark.parametrize(("token_only", "accepted"), [(False, False), (True, True)])
def test_only_the_token_only_mutant_accepts_an_acknowledgement_past_its_deadline(
    postgres_dsn: str, tmp_path: Path, token_only: bool, accepted: bool
) -> None:
    from crashqueuelab.judges.readers.postgres import read_postgres_store
    from crashqueuelab.lab.mutants.pgfencing import TokenOnlyAck, token_only_ack_system

    directory = tmp_path / "store"
    schema = store_schema(directory, postgres_dsn)
    create_store(postgres_dsn, schema)
    clock = ManualClock(1_000_000_000)
    queue = (TokenOnlyAck if token_only else PostgresQueue)(
        postgres_dsn, schema, clock=clock, ids=SeededIds(3, "q"), retry=RETRY
    )
    try:
        submit(queue, "a")
        [job] = queue.claim_many("w1", LEASE_US, 1)
        # Past the deadline, and nobody has recovered the lease: the token still stands.
        clock.advance(LEASE_US)
        assert queue.succeed_many([PgAck(job.job_id, "w1", str(job.lease_token))]) == [accepted]
    finally:
        queue.close()
    problems = read_postgres_store(directory).problems
    late = [problem for problem in problems if "SUCCEEDED" in problem and "deadline" in problem]
    assert bool(late) is token_only
    assert token_only_ack_system().name == "postgres-token-only-ack"
