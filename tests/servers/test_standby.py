"""A PostgreSQL primary and a streaming standby the lab starts, and a failover: the primary
dies (SIGKILL of every process), the standby is promoted. What an asynchronous standby
had not received when the primary died is gone after the failover, acknowledged or not; a
synchronous one (``synchronous_standby_names``) keeps every commit the primary
acknowledged, because the primary waits for it before it answers."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg
import pytest

from crashqueuelab.servers.base import wait_until
from crashqueuelab.servers.postgres import ThrowawayServer, ThrowawayStandby, find_binaries

pytestmark = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")


def _rows(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        return [row[0] for row in connection.execute("SELECT n FROM t ORDER BY n")]


def _write(dsn: str, n: int, timeout_ms: int = 0) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"SET statement_timeout = {timeout_ms}")
        connection.execute("INSERT INTO t VALUES (%s)", (n,))


@contextmanager
def _sender_stopped(primary: ThrowawayServer) -> Iterator[None]:
    """The primary's WAL sender stopped (SIGSTOP): nothing more leaves for the standby, as
    behind a cut link (stopping the standby's receiver would not do: what the sender wrote
    waits in the socket). Let go at the end, if it still exists."""
    with psycopg.connect(primary.dsn, autocommit=True) as connection:
        found = connection.execute("SELECT pid FROM pg_stat_replication").fetchone()
    assert found is not None, "the primary has no WAL sender"
    os.kill(found[0], signal.SIGSTOP)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):
            os.kill(found[0], signal.SIGCONT)


@contextmanager
def _pair(synchronous: bool) -> Iterator[tuple[ThrowawayServer, ThrowawayStandby]]:
    with ThrowawayServer() as primary:
        primary.start()
        _write_schema(primary.dsn)
        with ThrowawayStandby(primary) as standby:
            standby.start()
            if synchronous:
                with psycopg.connect(primary.dsn, autocommit=True) as connection:
                    connection.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                    connection.execute("SELECT pg_reload_conf()")
            _write(primary.dsn, 1)
            assert wait_until(lambda: _rows(standby.dsn) == [1], 30), "never replicated"
            yield primary, standby


def _write_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE t (n integer PRIMARY KEY)")


def test_a_failover_to_an_asynchronous_standby_loses_a_commit_the_primary_acknowledged() -> None:
    with _pair(synchronous=False) as (primary, standby):
        with _sender_stopped(primary):
            _write(primary.dsn, 2)  # acknowledged: the primary waits for no standby
            assert _rows(primary.dsn) == [1, 2]
            primary.kill()  # every process at once, the stopped sender too
        standby.promote()
        assert _rows(standby.dsn) == [1]
        _write(standby.dsn, 3)  # the new primary takes writes
        assert _rows(standby.dsn) == [1, 3]


def test_a_synchronous_standby_keeps_every_commit_the_primary_acknowledged() -> None:
    told: list[str] = []

    def write() -> None:
        try:
            _write(primary.dsn, 2)
            told.append("acknowledged")
        except psycopg.OperationalError as error:
            told.append(f"error: {type(error).__name__}")

    with _pair(synchronous=True) as (primary, standby):
        with _sender_stopped(primary):
            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            # The primary waits for the standby before it answers (statement_timeout does
            # not cover that wait): a second later, no answer yet.
            writer.join(timeout=1.0)
            assert writer.is_alive()
            assert told == []
            primary.kill()  # every process at once, the stopped sender too
            writer.join(timeout=30)
        assert told == ["error: OperationalError"]
        standby.promote()
        # Every acknowledged commit is here; the one never acknowledged may be or not.
        assert _rows(standby.dsn)[:1] == [1]
        assert set(_rows(standby.dsn)) <= {1, 2}
