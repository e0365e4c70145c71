"""A replicated PostgreSQL the run starts: a primary, a streaming standby, and a fault proxy
in front of both links, so that a failover can be made and the standby made to lag.

Clients reach the primary through the proxy's ``clients`` path, as through a virtual
address or a connection pooler: a failover moves it to the promoted standby (``repoint``),
and each client's next connection lands there. The standby streams through the proxy's
``replication`` path: a partition of that path holds the primary's WAL back, which is the
lag an asynchronous standby has, and which a synchronous one makes every commit wait for.

A failover is what a machine's death and an HA manager (Patroni, a managed service) make:
every process of the primary is killed at once (SIGKILL), the standby's replication
connection is reset (what the dead machine had still in flight is gone), the standby is
promoted (``pg_ctl promote``), the clients' path is moved to it, and a new standby is made
of it (``pg_basebackup``), so that the next failover has a target. The old primary is
never started again (it would need ``pg_rewind``).

Every primary is started with ``synchronous_standby_names = '*'`` and the run's
``synchronous_commit`` level: with ``off`` and ``local`` the standby is synchronous in
name only (PostgreSQL's documentation: commits "wait for local flush to disk, but not for
replication"), with ``remote_write``, ``on`` and ``remote_apply`` every commit waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, Self

import psycopg

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.failover.promises import LEVELS
from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import FaultWindow, WindowKind
from crashqueuelab.servers.base import wait_until
from crashqueuelab.servers.postgres import (
    DSN_VARIABLE,
    SETTINGS,
    ThrowawayServer,
    ThrowawayStandby,
)

CLIENTS = "clients"
REPLICATION = "replication"
#: How long a new standby may take to stream (its base backup included).
STREAMING_TIMEOUT_S = 60.0
#: A partition of the replication link lasts until the failover ends it.
UNTIL_ENDED_S = 24 * 3600.0


def socket_of(server: ThrowawayServer) -> str:
    """The Unix socket a server listens on (in its own directory)."""
    return str(server.root / f".s.PGSQL.{server.settings['port']}")


class ReplicatedPostgres:
    """A primary and its standby behind a fault proxy; ``failover`` promotes the standby."""

    def __init__(
        self,
        level: str,
        *,
        server_factory: Callable[..., ThrowawayServer] = ThrowawayServer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"synchronous_commit has no level {level!r}: {', '.join(LEVELS)}")
        self.level = level
        self._clock = clock
        self._settings = dict(SETTINGS) | {
            "synchronous_commit": level,
            "synchronous_standby_names": "'*'",
            # A standby whose link broke waits this long before it looks for WAL again, and
            # a promotion waits for that look (PostgreSQL's default is 5 s).
            "wal_retrieve_retry_interval": "'100ms'",
        }
        self._server_factory = server_factory
        self._stack = ExitStack()
        self.proxy = FaultProxy("", clock=clock)
        self.primary: ThrowawayServer | None = None
        self.standby: ThrowawayStandby | None = None
        self._cut: FaultWindow | None = None
        self.standbys_made = 0

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> Self:
        try:
            self._stack.enter_context(self.proxy)
            self.proxy.add_path(CLIENTS)
            self.proxy.add_path(REPLICATION)
            primary = self._server_factory(settings=self._settings)
            self.primary = primary
            primary.start()
            self.proxy.repoint(socket_of(primary))
            self._new_standby()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Every server stopped and removed, then the proxy closed (also after a failure)."""
        try:
            for server in (self.standby, self.primary):
                if server is not None:
                    server.close()
        finally:
            self.standby = self.primary = None
            self._stack.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what clients see -----------------------------------------------------------------

    @property
    def user(self) -> str:
        assert self.primary is not None
        return self.primary.user

    @property
    def client_dsn(self) -> str:
        """The primary, whichever server it is now, as clients reach it."""
        host, port = self.proxy.address(CLIENTS)
        return f"host={host} port={port} user={self.user} dbname=postgres connect_timeout=10"

    @property
    def primary_dsn(self) -> str:
        """The primary's own socket (the lab's readings go there, past the proxy)."""
        assert self.primary is not None
        return self.primary.dsn

    def client_environment(self) -> dict[str, str]:
        """Nothing: the queue's clients are given ``client_dsn`` itself."""
        return {}

    def reading_environment(self) -> dict[str, str]:
        """Where the judges read: the primary's own socket."""
        return {DSN_VARIABLE: self.primary_dsn}

    def describe(self) -> dict[str, Any]:
        assert self.primary is not None
        return {
            "server": "postgres (primary + streaming standby)",
            "version": self.primary.version(),
            "replication": f"synchronous_commit={self.level}, synchronous_standby_names='*'",
            "clients": "through the fault proxy, moved to the promoted standby at a failover",
            "link": "streaming through the fault proxy (a partition there is lag)",
        }

    # -- faults ---------------------------------------------------------------------------

    def cut_replication(self) -> None:
        """The standby stops receiving WAL (its link partitioned) until the failover."""
        if self._cut is None:
            self._cut = self.proxy.apply(WindowKind.PARTITION, [REPLICATION], UNTIL_ENDED_S)

    def lag(self) -> dict[str, Any]:
        """How far the standby is behind the primary, as the primary's WAL sender knows."""
        assert self.primary is not None
        with psycopg.connect(self.primary.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT pg_current_wal_lsn()::text,"
                " (SELECT flush_lsn::text FROM pg_stat_replication LIMIT 1),"
                " (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint"
                "  FROM pg_stat_replication LIMIT 1),"
                " (SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep')"
            ).fetchone()
        assert row is not None
        return {
            "primary_lsn": row[0],
            "standby_flush_lsn": row[1],
            "lag_bytes": row[2],
            "commits_waiting_for_the_standby": int(row[3]),
        }

    def terminate_waiting(self) -> int:
        """End every session whose COMMIT waits for the standby (``pg_terminate_backend``,
        as an administrator, a pooler's timeout or a health check would): PostgreSQL keeps
        such a commit, "committed locally, but might not have been replicated to the
        standby", and its client learns nothing but a dropped connection. How many ended."""
        assert self.primary is not None
        with psycopg.connect(self.primary.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone()
        return int(row[0]) if row else 0

    def restart_primary(self) -> None:
        """The primary dies (SIGKILL of every process) and starts again on its own disk:
        crash recovery marks committed what it finds in its WAL, also what was still waiting
        for the standby (PostgreSQL's documentation, 27.2.8.4)."""
        assert self.primary is not None
        self.primary.restart_after_crash()

    def failover(self, promoted: Callable[[], None] | None = None) -> dict[str, Any]:
        """The primary dies, the standby is promoted, clients are moved to it, and a new
        standby is made of it. What the old standby had not received is gone.
        ``promoted`` is called once the clients reach the promoted standby, before the new
        standby exists (a reading of what the failover left)."""
        assert self.primary is not None
        assert self.standby is not None
        started = self._clock()
        record: dict[str, Any] = {}
        try:
            record["before"] = self.lag()
        except psycopg.Error as error:
            record["before"] = {"error": f"{type(error).__name__}: {error}".strip()}
        self.primary.kill()
        record["primary_killed_s"] = round(self._clock() - started, 6)
        # What the dead machine still had in flight to the standby is gone with it.
        self.proxy.apply(WindowKind.RESET, [REPLICATION], 0.0)
        self.proxy.settle()
        if self._cut is not None:
            self.proxy.end(self._cut)
            self._cut = None
        standby = self.standby
        standby.promote()
        self.proxy.repoint(socket_of(standby))
        record["promoted_s"] = round(self._clock() - started, 6)
        old, self.primary, self.standby = self.primary, standby, None
        old.close()
        if promoted is not None:
            promoted()
        self._new_standby()
        record["new_standby_streaming_s"] = round(self._clock() - started, 6)
        return record

    # -- standbys -------------------------------------------------------------------------

    def _new_standby(self) -> None:
        assert self.primary is not None
        host, port = self.proxy.address(REPLICATION)
        self.standbys_made += 1
        name = f"standby{self.standbys_made}"
        upstream = f"host={host} port={port} user={self.user} application_name={name}"
        standby = ThrowawayStandby(self.primary, upstream=upstream)
        self.standby = standby
        standby.start()
        if not wait_until(lambda: self._streaming(name), STREAMING_TIMEOUT_S, poll_s=0.05):
            raise ServerUnavailable(
                f"the new standby did not stream within {STREAMING_TIMEOUT_S:.0f} s", "postgres"
            )

    def _streaming(self, name: str) -> bool:
        assert self.primary is not None
        with psycopg.connect(self.primary.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT state FROM pg_stat_replication WHERE application_name = %s", (name,)
            ).fetchone()
        return row is not None and row[0] == "streaming"
