"""Network faults in a chaos run: every worker (and the maintenance process) reaches the
system's server through a fault proxy of its own on the loopback interface
(``crashqueuelab.lab.faults.network``), and the schedule's network faults strike those paths.

- a **stall** holds one worker's connection (nothing closed) for the fault window;
- a **partition** cuts the server off from every process of the run, both ways, for the
  window: requests and answers already in flight are held, new connections hang; with
  ``partition_workers`` K, only K workers (the scheduled one and the next round the table)
  are cut off, and the maintenance process keeps its connection;
- **lost replies**: one worker's requests reach the server and its answers are dropped for
  the window, then its connection is reset: it never learns what the server did;
- a **connection reset** ends one worker's connections at once.

The window lasts ``window_ms`` (by default one and a half leases, so a stalled worker's
lease runs out while its requests are held). ``latency_ms`` delays every path, both ways,
and ``bandwidth_bytes_s`` limits each direction of every path, for the whole run. Only
systems behind a server have a connection to fault.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.proxy import FaultProxy, Upstream
from crashqueuelab.lab.faults.network.windows import WindowKind
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.servers import SERVER_VARIABLES
from crashqueuelab.servers.rabbitmq import URL_VARIABLE as RABBITMQ_URL_VARIABLE

#: The schedule's network faults, and what each does on the proxy.
WINDOW_OF = {
    FaultKind.STALL: WindowKind.STALL,
    FaultKind.PARTITION: WindowKind.PARTITION,
    FaultKind.LOST_REPLIES: WindowKind.LOST_REPLIES,
    FaultKind.CONNECTION_RESET: WindowKind.RESET,
}
#: A fault window's default length, in leases.
WINDOW_LEASES = 1.5
MAINTENANCE_PATH = "maintenance"
#: A run-long window lasts this long: the proxy closes with the run.
_RUN_LONG_S = 7 * 24 * 3600


def worker_path(slot: int) -> str:
    """The path of every worker that runs in ``slot`` (a respawned worker keeps it)."""
    return f"worker-{slot}"


@dataclass(frozen=True)
class NetworkPlan:
    """How many of each network fault a run plans, how long each lasts, and the latency
    every connection has throughout."""

    stalls: int = 0
    partitions: int = 0
    lost_replies: int = 0
    connection_resets: int = 0
    latency_ms: float = 0.0
    #: None: WINDOW_LEASES leases.
    window_ms: float | None = None
    #: None: a partition cuts off every process; K: K workers, the maintenance spared.
    partition_workers: int | None = None
    #: Each direction of every path carries at most this many bytes a second (0: no limit).
    bandwidth_bytes_s: float = 0.0

    def counts(self) -> dict[FaultKind, int]:
        return {
            FaultKind.STALL: self.stalls,
            FaultKind.PARTITION: self.partitions,
            FaultKind.LOST_REPLIES: self.lost_replies,
            FaultKind.CONNECTION_RESET: self.connection_resets,
        }

    @property
    def faults(self) -> int:
        return sum(self.counts().values())

    @property
    def active(self) -> bool:
        return bool(self.faults or self.latency_ms or self.bandwidth_bytes_s)

    def window_s(self, lease_ms: int) -> float:
        chosen = self.window_ms if self.window_ms is not None else WINDOW_LEASES * lease_ms
        return chosen / 1000

    def check(self) -> None:
        for kind, count in self.counts().items():
            if count < 0:
                raise InvalidInput(kind.name.lower(), "cannot be negative")
        if self.latency_ms < 0:
            raise InvalidInput("latency_ms", "cannot be negative")
        if self.window_ms is not None and self.window_ms <= 0:
            raise InvalidInput("network_fault_ms", "must be positive")
        if self.partition_workers is not None and self.partition_workers < 1:
            raise InvalidInput("partition_workers", "a partition cuts off one worker at least")
        if self.bandwidth_bytes_s < 0:
            raise InvalidInput("bandwidth_bytes_s", "cannot be negative")

    def partition_paths(self, slot: int, workers: int) -> list[str] | None:
        """The paths a partition planned on ``slot`` cuts off among ``workers`` worker
        slots; None when it cuts off every path."""
        if self.partition_workers is None:
            return None
        cut = min(self.partition_workers, workers)
        return [worker_path((slot + step) % workers) for step in range(cut)]

    def to_json(self, lease_ms: int) -> dict[str, Any]:
        return (
            {
                "stalls": self.stalls,
                "partitions": self.partitions,
                "lost_replies": self.lost_replies,
                "connection_resets": self.connection_resets,
                "latency_ms": self.latency_ms,
                "window_ms": round(self.window_s(lease_ms) * 1000, 3),
            }
            | (
                {}
                if self.partition_workers is None
                else {"partition_workers": self.partition_workers}
            )
            | ({"bandwidth_bytes_s": self.bandwidth_bytes_s} if self.bandwidth_bytes_s else {})
        )

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> NetworkPlan:
        return cls(
            stalls=int(record.get("stalls", 0)),
            partitions=int(record.get("partitions", 0)),
            lost_replies=int(record.get("lost_replies", 0)),
            connection_resets=int(record.get("connection_resets", 0)),
            latency_ms=float(record.get("latency_ms", 0.0)),
            window_ms=float(record["window_ms"]) if "window_ms" in record else None,
            partition_workers=(
                int(record["partition_workers"]) if "partition_workers" in record else None
            ),
            bandwidth_bytes_s=float(record.get("bandwidth_bytes_s", 0.0)),
        )


def run_dsn() -> str:
    """The DSN of the server this run's processes use (the command line names it)."""
    dsn = os.environ.get(SERVER_VARIABLES[0])
    if not dsn:
        raise InvalidInput("network", "network faults need the run's server, and none is named")
    return dsn


@dataclass(frozen=True)
class ServerAddress:
    """How the run's processes reach its server, and how a proxy path is named to them in
    its place: the variable that names the server, where it listens, and the value that
    names a path's address; ``unix``: the paths are Unix sockets (a Redis server, which the
    lab's clients reach by its socket file), else TCP ports."""

    variable: str
    upstream: Upstream
    through: Callable[[tuple[str, int]], str]
    unix: bool = False


def run_server(kind: str | None) -> ServerAddress:
    """The run's server of ``kind`` ("postgres", "redis", or "rabbitmq": a system's broker
    beside its server, whose AMQP connections are what a fault on a worker's path cuts), as
    its processes are told it."""
    if kind == "rabbitmq":
        return _rabbitmq_node()
    if kind == "redis":
        socket_path = os.environ.get(SERVER_VARIABLES[1])
        if not socket_path:
            raise InvalidInput(
                "network", "network faults need the run's Redis server, and none is named"
            )
        return ServerAddress(SERVER_VARIABLES[1], socket_path, lambda address: address[0], True)
    upstream, through = upstream_of(run_dsn())
    return ServerAddress(SERVER_VARIABLES[0], upstream, through)


#: AMQP 0-9-1's ports (over TLS: amqps), where a URL names none.
AMQP_PORTS = {"amqp": 5672, "amqps": 5671}


def _rabbitmq_node() -> ServerAddress:
    url = os.environ.get(RABBITMQ_URL_VARIABLE)
    if not url:
        raise InvalidInput(
            "network", "network faults need the run's RabbitMQ node, and none is named"
        )
    parts = urlsplit(url)
    upstream = (parts.hostname or "127.0.0.1", parts.port or AMQP_PORTS.get(parts.scheme, 5672))

    def through(address: tuple[str, int]) -> str:
        credentials = parts.netloc.rpartition("@")[0]
        netloc = (
            f"{credentials}@{address[0]}:{address[1]}"
            if credentials
            else (f"{address[0]}:{address[1]}")
        )
        return urlunsplit(parts._replace(netloc=netloc))

    return ServerAddress(RABBITMQ_URL_VARIABLE, upstream, through)


def upstream_of(dsn: str) -> tuple[Upstream, Callable[[tuple[str, int]], str]]:
    """Where the server of ``dsn`` listens, and how to name a proxy address as a DSN."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/var/run/postgresql")
    port = int(str(params.get("port") or 5432))
    upstream: Upstream = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)

    def through(address: tuple[str, int]) -> str:
        return make_conninfo(dsn, host=address[0], port=str(address[1]))

    return upstream, through


class RunNetwork:
    """The fault proxy of one chaos run, between its processes and its server."""

    def __init__(
        self,
        plan: NetworkPlan,
        *,
        server: ServerAddress,
        lease_ms: int,
        started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.lease_ms = lease_ms
        self.window_s = plan.window_s(lease_ms)
        self.started = started
        self.server = server
        self.proxy = FaultProxy(server.upstream, clock=clock)
        self._clock = clock
        #: Where a Unix socket path's listener lives (short: a socket's path has a limit).
        self._sockets = Path(tempfile.mkdtemp(prefix="crashqueuelab-net-")) if server.unix else None

    def __enter__(self) -> Self:
        self.proxy.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.close()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)

    def inherited(self, path: str) -> Inherited:
        """What a process on ``path`` inherits: the run's, with the server's DSN replaced
        by the path's address on the proxy (made on first use, with the run's latency)."""
        if path not in self.proxy.paths:
            unix = None if self._sockets is None else str(self._sockets / f"{path}.sock")
            self.proxy.add_path(path, unix=unix)
            # For as long as any run may last: the proxy closes with the run.
            if self.plan.latency_ms:
                self.proxy.apply(
                    WindowKind.LATENCY, [path], seconds=_RUN_LONG_S, amount=self.plan.latency_ms
                )
            if self.plan.bandwidth_bytes_s:
                self.proxy.apply(
                    WindowKind.BANDWIDTH,
                    [path],
                    seconds=_RUN_LONG_S,
                    amount=self.plan.bandwidth_bytes_s,
                )
        base = Inherited.capture()
        variable = self.server.variable
        environment = tuple((n, v) for n, v in base.environment if n != variable)
        named = self.server.through(self.proxy.address(path))
        return replace(base, environment=(*environment, (variable, named)))

    def strike(self, kind: FaultKind, paths: list[str] | None) -> dict[str, Any]:
        """Start a scheduled network fault on ``paths`` (None: every path); what the run
        records of it."""
        paths = self.proxy.paths if paths is None else paths
        window = self.proxy.apply(WINDOW_OF[kind], paths, seconds=self.window_s)
        record: dict[str, Any] = {
            "at_s": round(window.start - self.started, 6),
            "paths": list(window.paths),
        }
        if window.end > window.start:
            record["until_s"] = round(window.end - self.started, 6)
        return record

    def report(self) -> dict[str, Any]:
        """The plan, the server whose connections it faulted (the variable that names it
        to the run's processes), every window on the run's timeline, and what each path
        saw."""
        return {
            "plan": self.plan.to_json(self.lease_ms),
            "faulted": self.server.variable,
            "windows": [
                window.to_json(self.started)
                for window in self.proxy.windows
                # Latency and bandwidth hold all run long: the plan says so.
                if window.kind not in (WindowKind.LATENCY, WindowKind.BANDWIDTH)
            ],
            "paths": {
                path: dict(sorted(counts.items())) for path, counts in self.proxy.counts.items()
            },
        }
