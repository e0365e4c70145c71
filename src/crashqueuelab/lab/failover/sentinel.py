"""A replicated Redis the run starts: a primary, a replica and three Sentinels that fail
over to the replica when the primary dies, every node behind the fault proxy.

Each node is known by an address of the proxy's (``replica-announce-port``, and the address
the Sentinels monitor): clients, Sentinels and the replica all reach it there. Clients find
the primary as Redis's documentation tells them to, by asking the Sentinels
(``SENTINEL get-master-addr-by-name``, redis-py's ``Sentinel.master_for``). The proxy tells a
replica's link by what it sends first (``REPLCONF``) and gives it a path of its own, so
that a partition there holds the primary's writes back from the replica alone while clients
and Sentinels still reach the primary: the lag an asynchronous replica has. (A replica
pointed at an address the Sentinels do not know as the primary's would be pointed back by
them, ``+fix-slave-config``.) ``min-replicas-to-write`` and ``min-replicas-max-lag`` are the run's
option: with them, the primary refuses writes once no replica acknowledged it for that long.

A failover: every process of the primary is killed (SIGKILL), the replica's link is reset
(what the dead machine had in flight is gone), the Sentinels agree that the primary is down
(``down-after-milliseconds``), elect a leader and promote the replica; then a new replica of
the new primary is started, for the next failover. The old primary is never started again.
Every node keeps an append-only file synced at each write (``appendfsync always``): what a
failover loses is replication's, not persistence's.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.judges.resp import RespConnection, RespError, text
from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import FaultWindow, WindowKind
from crashqueuelab.servers.base import free_port, signal_all, wait_until
from crashqueuelab.servers.redis import (
    MASTER_VARIABLE,
    SENTINELS_VARIABLE,
    SOCKET_VARIABLE,
    WAIT_VARIABLE,
    ThrowawayRedis,
)

MASTER_NAME = "crashqueuelab"
#: The suffix of a node's path that its replicas' links are given.
REPLICATION = "/replication"
#: The suffix of the path of the Sentinels' connections to a node.
SENTINEL_LINKS = "/sentinels"
SENTINELS = 3
QUORUM = 2
#: How long a primary must not answer before a Sentinel thinks it down. Shorter, a busy
#: machine's pause (every byte goes through the proxy's thread) made the Sentinels fail a
#: healthy primary over on their own (measured at 500 ms).
DOWN_AFTER_MS = 2000
#: A Sentinel tries a second failover of the same primary only twice this long after one.
FAILOVER_TIMEOUT_MS = 2000
#: How often a Sentinel asks the primary for its replicas (Redis's default is 10 s; set
#: with ``SENTINEL DEBUG info-period``, Redis 7.0 on), so a new replica is known at once.
INFO_PERIOD_MS = 200
#: Every wait for the nodes (a start, a link, an election) is bounded by this.
WAIT_S = 60.0
#: What a failover does to the primary: every process of it SIGKILLed; SIGSTOPped until
#: the Sentinels promoted the replica and then SIGCONTed (a machine that froze: a long GC,
#: a VM paused by its host), coming back as the primary it was until a Sentinel demotes it;
#: or cut from the Sentinels and its replica (their paths held by the proxy) while its
#: clients still reach it, until the Sentinels promoted the replica, then healed.
KILL, PAUSE, PARTITION = "kill", "pause", "partition"
PRIMARY_FAULTS = (KILL, PAUSE, PARTITION)
UNTIL_ENDED_S = 24 * 3600.0


def _replica_link(origin: str, heard: bytes) -> str | None:
    """A replica's link to its primary announces itself (``REPLCONF`` before ``PSYNC``), and
    a Sentinel's connections name themselves (``CLIENT SETNAME sentinel-...``) first."""
    if b"REPLCONF" in heard:
        return origin + REPLICATION
    return origin + SENTINEL_LINKS if b"sentinel-" in heard else None


def _info(path: Path, section: str) -> dict[str, str]:
    with RespConnection(path, 5.0) as connection:
        said = text(connection.command("INFO", section))
    return dict(
        line.split(":", 1) for line in said.splitlines() if ":" in line and not line.startswith("#")
    )


class RedisNode(ThrowawayRedis):
    """A ``redis-server`` on its socket and a TCP port of its own, optionally a replica."""

    name = "redis-node"

    def __init__(self, port: int, announced: int, options: Sequence[str] = ()) -> None:
        super().__init__("aof-always")
        self.port = port
        #: The proxy's address for it: what it announces, and what everyone uses.
        self.announced = announced
        self.options = list(options)

    def arguments(self) -> list[str]:
        words = super().arguments()
        at = words.index("--port")
        words[at + 1] = str(self.port)
        # A full synchronisation starts at once (Redis 7 waits 5 s for more replicas).
        return [
            *words, "--bind", "127.0.0.1", "--repl-diskless-sync-delay", "0",
            "--replica-announce-ip", "127.0.0.1", "--replica-announce-port", str(self.announced),
            *self.options,
        ]  # fmt: skip


class SentinelNode(ThrowawayRedis):
    """One Sentinel (``redis-server CONFIG --sentinel``) watching the primary."""

    name = "redis-sentinel"

    def __init__(self, port: int, primary_port: int) -> None:
        super().__init__("none")
        self.port = port
        self.primary_port = primary_port
        self.config = self.root / "sentinel.conf"

    def arguments(self) -> list[str]:
        return [str(self.binary), str(self.config), "--sentinel"]

    @property
    def settings(self) -> dict[str, str]:
        return {
            "down-after-milliseconds": str(DOWN_AFTER_MS),
            "failover-timeout": str(FAILOVER_TIMEOUT_MS),
            "quorum": str(QUORUM),
        }

    def prepare(self) -> None:
        super().prepare()
        # Sentinel rewrites its configuration as it learns: a file of its own.
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"unixsocket {self.socket}",
                    f"dir {self.data}",
                    f"logfile {self.log}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary_port} {QUORUM}",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {MASTER_NAME} 1",
                    "",
                ]
            )
        )

    def primary(self) -> tuple[str, int] | None:
        """The primary this Sentinel names now."""
        try:
            with RespConnection(self.socket, 5.0) as connection:
                said = connection.command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
        except (OSError, RespError):
            return None
        if not isinstance(said, list) or len(said) != 2:
            return None
        return text(said[0]), int(text(said[1]))

    def knows(self) -> tuple[int, int]:
        """How many replicas and other Sentinels this Sentinel knows of."""
        with RespConnection(self.socket, 5.0) as connection:
            said = connection.command("SENTINEL", "master", MASTER_NAME)
        fields = [text(item) for item in said] if isinstance(said, list) else []
        table = dict(zip(fields[::2], fields[1::2], strict=False))
        return int(table.get("num-slaves", 0)), int(table.get("num-other-sentinels", 0))

    def replicas(self) -> dict[int, str]:
        """The replicas this Sentinel knows of: port -> flags."""
        with RespConnection(self.socket, 5.0) as connection:
            said = connection.command("SENTINEL", "replicas", MASTER_NAME)
        found = {}
        for entry in said if isinstance(said, list) else []:
            fields = [text(item) for item in entry] if isinstance(entry, list) else []
            table = dict(zip(fields[::2], fields[1::2], strict=False))
            found[int(table.get("port", 0))] = table.get("flags", "")
        return found

    def launch(self) -> None:
        super().launch()
        with RespConnection(self.socket, 5.0) as connection:
            connection.command("SENTINEL", "DEBUG", "info-period", str(INFO_PERIOD_MS))


class ReplicatedRedis:
    """A primary, a replica behind the proxy and three Sentinels; ``failover`` kills the
    primary and waits for the Sentinels to promote the replica."""

    def __init__(
        self,
        *,
        min_replicas: int = 0,
        max_lag_s: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        primary_fault: str = KILL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if primary_fault not in PRIMARY_FAULTS:
            raise ValueError(f"no primary fault {primary_fault!r}: {', '.join(PRIMARY_FAULTS)}")
        #: What a failover does to the primary: kills it, or pauses it until the Sentinels
        #: promoted the replica and then lets it go on.
        self.primary_fault = primary_fault
        self.min_replicas = min_replicas
        self.max_lag_s = max_lag_s
        #: The clients' WAIT after each enqueue (0: none).
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._clock = clock
        self._stack = ExitStack()
        self.proxy = FaultProxy(("127.0.0.1", 0), clock=clock, classify=_replica_link)
        self.nodes_made = 0
        self.primary: RedisNode | None = None
        self.replica: RedisNode | None = None
        self.sentinels: list[SentinelNode] = []
        self._cut: FaultWindow | None = None
        self._names: dict[int, str] = {}

    @property
    def level(self) -> str:
        """The run's replication setting, in Redis's words."""
        if self.wait_replicas:
            return (
                f"asynchronous, the clients' WAIT {self.wait_replicas} {self.wait_timeout_ms}"
                " after each enqueue"
            )
        if not self.min_replicas:
            return "asynchronous"
        return f"min-replicas-to-write {self.min_replicas}, min-replicas-max-lag {self.max_lag_s}"

    def _options(self) -> list[str]:
        if not self.min_replicas:
            return []
        return [
            "--min-replicas-to-write", str(self.min_replicas),
            "--min-replicas-max-lag", str(self.max_lag_s),
        ]  # fmt: skip

    def start(self) -> Self:
        try:
            self._stack.enter_context(self.proxy)
            primary = self._node(self._options())
            self.primary = primary
            primary.start()
            self._new_replica()
            for _ in range(SENTINELS):
                sentinel = SentinelNode(free_port(), primary.announced)
                self.sentinels.append(sentinel)
                sentinel.start()
            if not wait_until(self._watched, WAIT_S, poll_s=0.05):
                raise ServerUnavailable(
                    "the Sentinels did not find each other and the replica", "redis"
                )
        except BaseException:
            self.close()
            raise
        return self

    def _watched(self) -> bool:
        try:
            return all(s.knows() == (1, SENTINELS - 1) for s in self.sentinels)
        except (OSError, RespError):
            return False

    def close(self) -> None:
        try:
            for node in [*self.sentinels, self.replica, self.primary]:
                if node is not None:
                    node.close()
        finally:
            self.sentinels, self.replica, self.primary = [], None, None
            self._stack.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client_environment(self) -> dict[str, str]:
        """What the run's clients are given: the Sentinels, never the primary itself."""
        addresses = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        found = {SENTINELS_VARIABLE: addresses, MASTER_VARIABLE: MASTER_NAME}
        if self.wait_replicas:
            found[WAIT_VARIABLE] = f"{self.wait_replicas},{self.wait_timeout_ms}"
        return found

    def reading_environment(self) -> dict[str, str]:
        """Where the judges read: the primary's own socket."""
        assert self.primary is not None
        return {SOCKET_VARIABLE: str(self.primary.socket)}

    def describe(self) -> dict[str, Any]:
        assert self.primary is not None
        return {
            "server": "redis (primary + replica + 3 Sentinels)",
            "version": self.primary.version(),
            "replication": self.level,
            "min_replicas": self.min_replicas,
            "max_lag_s": self.max_lag_s,
            "wait_replicas": self.wait_replicas,
            "wait_timeout_ms": self.wait_timeout_ms,
            "primary_fault": self.primary_fault,
            "persistence": "appendonly yes, appendfsync always, on every node",
            "sentinels": {"count": SENTINELS, "quorum": QUORUM, **self.sentinels[0].settings},
            "clients": "through the Sentinels (redis-py's Sentinel.master_for)",
        }

    def _node(self, options: Sequence[str]) -> RedisNode:
        """A new node behind a proxy path of its own (and a class for its replicas' links)."""
        self.nodes_made += 1
        port = free_port()
        name = f"node{self.nodes_made}"
        _, announced = self.proxy.add_path(name, upstream=("127.0.0.1", port))
        self.proxy.add_class(name + REPLICATION)
        self.proxy.add_class(name + SENTINEL_LINKS)
        self._names[announced] = name
        return RedisNode(port, announced, options)

    def _link(self) -> str:
        """The primary's replicas' links, as the proxy names them."""
        assert self.primary is not None
        return self._names[self.primary.announced] + REPLICATION

    def cut_replication(self) -> None:
        if self._cut is None:
            self._cut = self.proxy.apply(WindowKind.PARTITION, [self._link()], UNTIL_ENDED_S)

    def lag(self) -> dict[str, Any]:
        """The primary's write offset, and how far its replica had acknowledged it."""
        assert self.primary is not None
        info = _info(self.primary.socket, "replication")
        offset = int(info.get("master_repl_offset", 0))
        replica = info.get("slave0", "")
        fields = dict(part.split("=", 1) for part in replica.split(",") if "=" in part)
        acknowledged = int(fields["offset"]) if "offset" in fields else None
        return {
            "primary_offset": offset,
            "replica_offset": acknowledged,
            "lag_bytes": None if acknowledged is None else offset - acknowledged,
            "replica_lag_s": int(fields["lag"]) if "lag" in fields else None,
            "commits_waiting_for_the_standby": None,
        }

    def failover(self, promoted: Callable[[], None] | None = None) -> dict[str, Any]:
        """The primary dies; the Sentinels promote the replica; a new replica is started."""
        assert self.primary is not None
        assert self.replica is not None
        started = self._clock()
        record: dict[str, Any] = {}
        try:
            record["before"] = self.lag()
        except (OSError, RespError) as error:
            record["before"] = {"error": f"{type(error).__name__}: {error}"}
        old_port = self.primary.announced
        link = self._link()
        # Whom the Sentinels named before the kill: not this primary means they had failed
        # it over on their own already (said in the record, never hidden).
        record["sentinels_named_before"] = sorted(
            {str(named) for named in (s.primary() for s in self.sentinels)}
        )
        record["failed_over_before_the_kill"] = any(
            named not in (None, ("127.0.0.1", old_port))
            for named in (s.primary() for s in self.sentinels)
        )
        come_back = self._strike(link)
        record["primary_fault"] = self.primary_fault
        record["primary_killed_s"] = round(self._clock() - started, 6)
        if self._cut is not None:
            self.proxy.end(self._cut)
            self._cut = None
        replica = self.replica

        def elected() -> bool:
            named = [s.primary() for s in self.sentinels]
            return all(found == ("127.0.0.1", replica.announced) for found in named)

        if not wait_until(elected, WAIT_S, poll_s=0.02):
            said = [s.primary() for s in self.sentinels]
            raise ServerUnavailable(
                f"the Sentinels did not promote the replica within {WAIT_S:.0f} s: {said}", "redis"
            )
        record["promoted_s"] = round(self._clock() - started, 6)
        record["old_primary_port"], record["new_primary_port"] = old_port, replica.announced
        old, self.primary, self.replica = self.primary, replica, None
        if come_back is not None:
            # The old primary goes on (or was never stopped), a primary still in its own
            # eyes: it answers its clients until a Sentinel reaches it and demotes it.
            come_back()
            record["resumed_s"] = round(self._clock() - started, 6)
            if promoted is not None:
                promoted()
            self._rejoined(old, record, started)
            record["new_standby_streaming_s"] = round(self._clock() - started, 6)
            return record
        old.close()
        if promoted is not None:
            promoted()
        self._new_replica()
        record["new_standby_streaming_s"] = round(self._clock() - started, 6)
        return record

    def _strike(self, link: str) -> Callable[[], None] | None:
        """Do the run's fault to the primary; what ends it (None: a kill, which nothing
        ends). A killed primary's replica link is reset: what it had in flight is gone."""
        assert self.primary is not None
        if self.primary_fault == PAUSE:
            frozen = self.primary.processes()
            signal_all(frozen, signal.SIGSTOP)
            return lambda: signal_all(frozen, signal.SIGCONT)
        if self.primary_fault == PARTITION:
            cut_off = [link, self._names[self.primary.announced] + SENTINEL_LINKS]
            window = self.proxy.apply(WindowKind.PARTITION, cut_off, UNTIL_ENDED_S)
            return lambda: self.proxy.end(window)
        self.primary.kill()
        self.proxy.apply(WindowKind.RESET, [link], 0.0)
        self.proxy.settle()
        return None

    def _rejoined(self, old: RedisNode, record: dict[str, Any], started: float) -> None:
        """The paused primary, resumed, demoted by the Sentinels to a replica of the new
        primary and linked to it: the run's replica from now on."""
        assert self.primary is not None
        new_port = self.primary.announced

        def demoted() -> bool:
            try:
                fields = _info(old.socket, "replication")
            except (OSError, RespError):
                return False
            return (
                fields.get("role") == "slave"
                and fields.get("master_port") == str(new_port)
                and fields.get("master_link_status") == "up"
            )

        if not wait_until(demoted, WAIT_S, poll_s=0.02):
            raise ServerUnavailable(
                f"the resumed primary was not made a replica within {WAIT_S:.0f} s", "redis"
            )
        record["demoted_s"] = round(self._clock() - started, 6)
        self.replica = old
        if not wait_until(lambda: self._known(old.announced), WAIT_S, 0.05):
            raise ServerUnavailable("the Sentinels did not take the demoted primary", "redis")

    def _new_replica(self) -> None:
        assert self.primary is not None
        replica = self._node(
            ["--replicaof", "127.0.0.1", str(self.primary.announced), *self._options()]
        )
        self.replica = replica
        replica.start()

        def linked() -> bool:
            try:
                return _info(replica.socket, "replication").get("master_link_status") == "up"
            except (OSError, RespError):
                return False

        if not wait_until(linked, WAIT_S, poll_s=0.05):
            raise ServerUnavailable(f"the replica did not link within {WAIT_S:.0f} s", "redis")
        if self.sentinels and not wait_until(lambda: self._known(replica.announced), WAIT_S, 0.05):
            raise ServerUnavailable("the Sentinels did not find the new replica", "redis")

    def _known(self, port: int) -> bool:
        """Whether every Sentinel knows the replica on ``port`` and holds it up."""
        try:
            listed = [s.replicas().get(port) for s in self.sentinels]
        except (OSError, RespError):
            return False
        return all(flags is not None and "down" not in flags for flags in listed)
