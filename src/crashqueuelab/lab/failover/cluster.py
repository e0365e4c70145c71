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

With two standbys (``standbys=2``) the primary has ``synchronous_standby_names = 'ANY 1
(*)'`` (quorum commit: a waiting commit waits for either), each standby streams through a
path of its own, and the lag is made on the second one alone while the first keeps up. The
failover then promotes the standby that received the most WAL (``MOST_ADVANCED``, read from
each standby after the kill, as an HA manager compares them) or the lagging one
(``LAGGING``: a standby chosen beforehand); the other is dropped and both are made anew of
the promoted one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, Self

import psycopg

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.failover.promises import (
    LAGGING,
    LEVELS,
    MAX_STANDBYS,
    MOST_ADVANCED,
    PROMOTIONS,
)
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
#: How long a chaos run's failover lets the standby lag before the primary dies.
CHAOS_LAG_S = 0.3
#: A partition of the replication link lasts until the failover ends it.
UNTIL_ENDED_S = 24 * 3600.0


def socket_of(server: ThrowawayServer) -> str:
    """The Unix socket a server listens on (in its own directory)."""
    return str(server.root / f".s.PGSQL.{server.settings['port']}")


def choose_standby(received: list[int | None], promote: str, lagging_slot: int) -> int:
    """The slot a failover promotes: the lagging one, or the one that received the most WAL
    (``received``: bytes per slot, None where a standby could not say; the first on a tie)."""
    if promote == LAGGING:
        return lagging_slot
    amounts = [-1 if amount is None else amount for amount in received]
    return amounts.index(max(amounts))


def replication_path(slot: int) -> str:
    """The proxy path the standby in ``slot`` streams through."""
    return REPLICATION if slot == 0 else f"{REPLICATION}-{slot + 1}"


class ReplicatedPostgres:
    """A primary and its standbys behind a fault proxy; ``failover`` promotes one."""

    def __init__(
        self,
        level: str,
        *,
        standbys: int = 1,
        promote: str = MOST_ADVANCED,
        server_factory: Callable[..., ThrowawayServer] = ThrowawayServer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"synchronous_commit has no level {level!r}: {', '.join(LEVELS)}")
        if not 1 <= standbys <= MAX_STANDBYS:
            raise ValueError(f"a primary has 1 to {MAX_STANDBYS} standbys here, not {standbys}")
        if promote not in PROMOTIONS:
            raise ValueError(f"no promotion rule {promote!r}: {', '.join(PROMOTIONS)}")
        self.level = level
        self.promote = promote
        self._clock = clock
        self._settings = dict(SETTINGS) | {
            "synchronous_commit": level,
            "synchronous_standby_names": "'*'" if standbys == 1 else "'ANY 1 (*)'",
            # A standby whose link broke waits this long before it looks for WAL again, and
            # a promotion waits for that look (PostgreSQL's default is 5 s).
            "wal_retrieve_retry_interval": "'100ms'",
        }
        self._server_factory = server_factory
        self._stack = ExitStack()
        self.proxy = FaultProxy("", clock=clock)
        self.primary: ThrowawayServer | None = None
        self.standbys: list[ThrowawayStandby | None] = [None] * standbys
        #: Each slot's standby by its ``application_name`` (as pg_stat_replication names it).
        self.names = [""] * standbys
        self._cut: FaultWindow | None = None
        self.standbys_made = 0

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> Self:
        try:
            self._stack.enter_context(self.proxy)
            self.proxy.add_path(CLIENTS)
            for slot in range(len(self.standbys)):
                self.proxy.add_path(replication_path(slot))
            primary = self._server_factory(settings=self._settings)
            self.primary = primary
            primary.start()
            self.proxy.repoint(socket_of(primary))
            self._new_standbys()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Every server stopped and removed, then the proxy closed (also after a failure)."""
        try:
            for server in (*self.standbys, self.primary):
                if server is not None:
                    server.close()
        finally:
            self.standbys = [None] * len(self.standbys)
            self.primary = None
            self._stack.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what clients see -----------------------------------------------------------------

    @property
    def standby(self) -> ThrowawayStandby | None:
        """The standby in the first slot (the only one with ``standbys=1``)."""
        return self.standbys[0]

    @property
    def lagging_slot(self) -> int:
        """The slot whose link a cut partitions: the last (with two, the other keeps up)."""
        return len(self.standbys) - 1

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
        """Where a library's adapter finds its server (the lab's own queue is given
        ``client_dsn`` itself): the primary as clients reach it."""
        return {DSN_VARIABLE: self.client_dsn}

    def reading_environment(self) -> dict[str, str]:
        """Where the judges read: the primary's own socket."""
        return {DSN_VARIABLE: self.primary_dsn}

    def describe(self) -> dict[str, Any]:
        assert self.primary is not None
        names = self._settings["synchronous_standby_names"]
        described = {
            "server": "postgres (primary + streaming standby)",
            "version": self.primary.version(),
            "replication": f"synchronous_commit={self.level}, synchronous_standby_names={names}",
            "clients": "through the fault proxy, moved to the promoted standby at a failover",
            "link": "streaming through the fault proxy (a partition there is lag)",
            "standbys": len(self.standbys),
        }
        if len(self.standbys) > 1:
            described["server"] = f"postgres (primary + {len(self.standbys)} streaming standbys)"
            described["link"] = (
                "each standby through a path of its own; a cut partitions the last one's alone"
            )
            described["promotes"] = self.promote
        return described

    # -- faults ---------------------------------------------------------------------------

    def cut_replication(self) -> None:
        """The lagging standby stops receiving WAL (its link partitioned) until the
        failover."""
        if self._cut is None:
            path = replication_path(self.lagging_slot)
            self._cut = self.proxy.apply(WindowKind.PARTITION, [path], UNTIL_ENDED_S)

    def heal_replication(self) -> None:
        """The cut link comes back: the lagging standby catches up."""
        if self._cut is not None:
            self.proxy.end(self._cut)
            self._cut = None

    def lag(self) -> dict[str, Any]:
        """How far the standbys are behind the primary, as its WAL senders know: the
        lagging standby's figures first, then each standby's."""
        assert self.primary is not None
        lagging = self.names[self.lagging_slot]
        with psycopg.connect(self.primary.dsn, autocommit=True, connect_timeout=10) as conn:
            current, waiting = conn.execute(
                "SELECT pg_current_wal_lsn()::text,"
                " (SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep')"
            ).fetchone() or (None, 0)
            rows = conn.execute(
                "SELECT application_name, flush_lsn::text,"
                " pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint"
                " FROM pg_stat_replication ORDER BY application_name"
            ).fetchall()
        each = {name: {"flush_lsn": lsn, "lag_bytes": behind} for name, lsn, behind in rows}
        mine = each.get(lagging, {})
        return {
            "primary_lsn": current,
            "standby_flush_lsn": mine.get("flush_lsn"),
            "lag_bytes": mine.get("lag_bytes"),
            "commits_waiting_for_the_standby": int(waiting),
        } | ({"standbys": each} if len(self.standbys) > 1 else {})

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

    def restart_after_crash(self) -> None:
        """A chaos run's server restart: the primary's (``restart_primary``)."""
        self.restart_primary()

    def fail_over_lagging(self, lag_s: float = CHAOS_LAG_S) -> dict[str, Any]:
        """A chaos run's failover: the standby's link cut for ``lag_s`` (the commits made
        meanwhile wait for it), then ``failover``; what it measured, without readings."""
        self.cut_replication()
        time.sleep(lag_s)
        return self.failover()

    def hold_commits(self, hold_s: float = CHAOS_LAG_S) -> dict[str, Any]:
        """A chaos run's held commits: the lagging standby's link cut, so the COMMITs made
        meanwhile wait for it, still in progress for every other session; once one waits
        (or after ``hold_s``) every client connection is reset, as a pooler's or a load
        balancer's timeout would end it; ``hold_s`` later the link comes back, the standby
        catches up and the waiting COMMITs end. What it measured."""
        started = self._clock()
        self.cut_replication()
        try:
            wait_until(lambda: self._waiting() > 0, hold_s, poll_s=0.01)
            waiting = self._waiting()
            self.proxy.apply(WindowKind.RESET, [CLIENTS], 0.0)
            self.proxy.settle()
            time.sleep(hold_s)
            still = self._waiting()
        finally:
            self.heal_replication()
        return {
            "commits_waiting_at_the_reset": waiting,
            "commits_still_waiting_before_the_standby_came_back": still,
            "held_s": round(self._clock() - started, 6),
        }

    def _waiting(self) -> int:
        return int(self.lag()["commits_waiting_for_the_standby"])

    def failover(
        self,
        promoted: Callable[[], None] | None = None,
        *,
        promote_after_s: float = 0.0,
        new_standbys: bool = True,
    ) -> dict[str, Any]:
        """The primary dies, a standby is promoted, clients are moved to it, and new
        standbys are made of it (unless ``new_standbys`` is false: a run that fails over
        once). What the promoted standby had not received is gone. ``promoted`` is called
        once the clients reach the promoted standby, before the new standbys exist (a
        reading of what the failover left). ``promote_after_s``: how long no server answers
        the clients between the kill and the promotion (an HA manager's time to notice the
        primary is gone and decide)."""
        assert self.primary is not None
        started = self._clock()
        record: dict[str, Any] = {}
        try:
            record["before"] = self.lag()
        except psycopg.Error as error:
            record["before"] = {"error": f"{type(error).__name__}: {error}".strip()}
        self.primary.kill()
        record["primary_killed_s"] = round(self._clock() - started, 6)
        # What the dead machine still had in flight to the standbys is gone with it.
        paths = [replication_path(slot) for slot in range(len(self.standbys))]
        self.proxy.apply(WindowKind.RESET, paths, 0.0)
        self.proxy.settle()
        self.heal_replication()
        if promote_after_s > 0:
            time.sleep(promote_after_s)
        slot = self._chosen(record)
        standby = self.standbys[slot]
        assert standby is not None
        standby.promote()
        self.proxy.repoint(socket_of(standby))
        record["promoted_s"] = round(self._clock() - started, 6)
        old, self.primary = self.primary, standby
        others = [other for other in self.standbys if other is not None and other is not standby]
        self.standbys = [None] * len(self.standbys)
        old.close()
        for other in others:
            other.close()
        if promoted is not None:
            promoted()
        if not new_standbys:
            return record
        self._new_standbys()
        record["new_standby_streaming_s"] = round(self._clock() - started, 6)
        return record

    def _chosen(self, record: dict[str, Any]) -> int:
        """The slot of the standby to promote, by the rule; with two, what each had
        received when the primary died goes into ``record``."""
        if len(self.standbys) == 1:
            return 0
        received: list[dict[str, Any]] = []
        for slot, standby in enumerate(self.standbys):
            assert standby is not None
            with psycopg.connect(standby.dsn, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(
                    "SELECT pg_last_wal_receive_lsn()::text,"
                    " pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '0/0')::bigint"
                ).fetchone()
            lsn, amount = row if row is not None else (None, None)
            received.append({"slot": slot, "name": self.names[slot], "lsn": lsn, "bytes": amount})
        record["standbys_received"] = received
        slot = choose_standby([one["bytes"] for one in received], self.promote, self.lagging_slot)
        record["promoted_slot"] = slot
        record["promotes"] = self.promote
        return slot

    # -- standbys -------------------------------------------------------------------------

    def _new_standbys(self) -> None:
        """A standby in every slot, each streaming through its own path."""
        for slot in range(len(self.standbys)):
            self._new_standby(slot)

    def _new_standby(self, slot: int) -> None:
        assert self.primary is not None
        host, port = self.proxy.address(replication_path(slot))
        self.standbys_made += 1
        name = f"standby{self.standbys_made}"
        upstream = f"host={host} port={port} user={self.user} application_name={name}"
        standby = ThrowawayStandby(self.primary, upstream=upstream)
        self.standbys[slot] = standby
        self.names[slot] = name
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
