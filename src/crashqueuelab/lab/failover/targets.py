"""What a failover run puts under load: a system, the replicated server it runs on, and
the replication setting whose promise it is judged against.

- ``postgres``: crashqueuelab's PostgreSQL queue on a primary and one or two streaming
  standbys (``cluster.ReplicatedPostgres``) at a ``synchronous_commit`` level; the queue is
  opened accepting that level (at its default it refuses any other than ``on``).
- ``pgqueuer``, ``procrastinate``: the library through its adapter (its own queries and
  job manager) on the same replicated PostgreSQL, finding the primary where the clients
  reach it; their clients hold their connections and do not come back after a failover, so
  the load opens a client anew after a call that raised (``workload.Reopening``);
- ``rq``: RQ on a Redis primary, a replica and three Sentinels
  (``sentinel.ReplicatedRedis``), its clients finding the primary through the Sentinels;
  asynchronous, or with ``min-replicas-to-write``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.failover.promises import (
    ASYNCHRONOUS,
    LEVELS,
    MIN_REPLICAS,
    MOST_ADVANCED,
    WAIT,
    WAITING_LEVELS,
    promise_of,
)
from crashqueuelab.systems.contract import OpenRequest, QueueClient
from crashqueuelab.systems.registry import resolve_system

if TYPE_CHECKING:
    from crashqueuelab.lab.failover.cluster import ReplicatedPostgres

RETRY = RetryPolicy(base_delay_us=10_000, max_delay_us=200_000)


class Cluster(Protocol):
    """A replicated server a failover run starts, fails over and stops."""

    def __enter__(self) -> Cluster: ...

    def __exit__(self, *exc: object) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def cut_replication(self) -> None: ...

    def lag(self) -> dict[str, Any]: ...

    def failover(self, promoted: Callable[[], None] | None = None) -> dict[str, Any]: ...

    #: What the run's clients are given to find the primary.
    def client_environment(self) -> dict[str, str]: ...

    #: Where the judges read the primary's store now.
    def reading_environment(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Target:
    """One system on one replicated server at one replication setting."""

    #: The system's registry name (its reader is the judges').
    system: str
    #: The setting's name in ``promises`` (a ``synchronous_commit`` level, or Redis's).
    setting: str
    #: Starts the replicated server (a context manager).
    cluster: Callable[[], AbstractContextManager[Any]]
    #: A client of the store in a directory, on the cluster.
    opener: Callable[[Any, Path], QueueClient]
    #: Whether commits can be made to wait for the standby (the waiting-commit faults).
    waits: bool = False
    #: How many standbys the primary has, and which one a failover promotes
    #: (``promises.PROMOTIONS``): part of what the setting promises.
    standbys: int = 1
    promote: str = MOST_ADVANCED
    #: Whether the load opens a client anew after a call that raised.
    reopens: bool = False


def _request(store: Path) -> OpenRequest:
    return OpenRequest(store, SystemClock(), RandomIds(), RETRY)


def postgres_target(
    level: str,
    *,
    standbys: int = 1,
    promote: str = MOST_ADVANCED,
    cluster_factory: Callable[..., AbstractContextManager[Any]] | None = None,
    queue_class: type[Any] | None = None,
) -> Target:
    """The PostgreSQL queue at ``level`` on a primary with ``standbys``, a failover promoting
    by ``promote`` (``cluster_factory``, ``queue_class``: a variant of the server or of the
    queue, a planted bug)."""
    from crashqueuelab.lab.failover.cluster import ReplicatedPostgres
    from crashqueuelab.lab.failover.promises import WAITING_LEVELS
    from crashqueuelab.postgres.queue import PostgresQueue
    from crashqueuelab.systems.postgres import open_postgres_at

    factory = cluster_factory or ReplicatedPostgres
    chosen = queue_class or PostgresQueue

    def opener(cluster: Any, store: Path) -> QueueClient:
        required = {"fsync": "on", "synchronous_commit": level}
        return open_postgres_at(
            cluster.client_dsn, _request(store), required_settings=required, queue_class=chosen
        )

    return Target(
        "postgres",
        level,
        lambda: factory(level, standbys=standbys, promote=promote),
        opener,
        level in WAITING_LEVELS,
        standbys,
        promote,
    )


#: The libraries on PostgreSQL a failover run can put under load.
POSTGRES_LIBRARIES = ("pgqueuer", "procrastinate")


def library_target(
    system: str,
    level: str,
    *,
    standbys: int = 1,
    promote: str = MOST_ADVANCED,
    cluster_factory: Callable[..., AbstractContextManager[Any]] | None = None,
) -> Target:
    """A library on PostgreSQL (``POSTGRES_LIBRARIES``) at ``level``: its adapter finds
    the primary where the cluster's clients reach it (``client_environment``)."""
    from crashqueuelab.lab.failover.cluster import ReplicatedPostgres
    from crashqueuelab.lab.failover.promises import WAITING_LEVELS

    factory = cluster_factory or ReplicatedPostgres

    def opener(cluster: Any, store: Path) -> QueueClient:
        return resolve_system(system).open(_request(store))

    return Target(
        system,
        level,
        lambda: factory(level, standbys=standbys, promote=promote),
        opener,
        level in WAITING_LEVELS,
        standbys,
        promote,
        reopens=True,
    )


def rq_target(
    min_replicas: int = 0,
    max_lag_s: int = 1,
    wait_replicas: int = 0,
    wait_timeout_ms: int = 1000,
    primary_fault: str = "kill",
) -> Target:
    """RQ through Sentinel: asynchronous, with ``min-replicas-to-write``, or with its
    clients' ``WAIT`` after each enqueue; each failover kills or pauses the primary."""
    from crashqueuelab.lab.failover.sentinel import ReplicatedRedis

    if min_replicas and wait_replicas:
        raise InvalidInput(
            "wait_replicas", "one Redis setting a run: WAIT or min-replicas-to-write, not both"
        )

    def opener(cluster: Any, store: Path) -> QueueClient:
        return resolve_system("rq").open(_request(store))

    setting = WAIT if wait_replicas else MIN_REPLICAS if min_replicas else ASYNCHRONOUS
    return Target(
        "rq",
        setting,
        lambda: ReplicatedRedis(
            min_replicas=min_replicas,
            max_lag_s=max_lag_s,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
            primary_fault=primary_fault,
        ),
        opener,
    )


@dataclass(frozen=True)
class CaseFailover:
    """What a failover campaign's cases fail over (``campaign --crash-mode failover``, whose
    ``FailoverSetting`` this is): a primary and one standby at ``level``, and the level's
    documented promise."""

    level: str
    promise: dict[str, Any]
    #: Whether a COMMIT waits for the standby (otherwise the case holds the standby back).
    waits: bool

    def cluster(self) -> ReplicatedPostgres:
        from crashqueuelab.lab.failover.cluster import ReplicatedPostgres

        return ReplicatedPostgres(self.level)


def case_failover(level: str) -> CaseFailover:
    """A failover campaign's setting at ``synchronous_commit`` ``level``."""
    if level not in LEVELS:
        raise InvalidInput("synchronous_commit", f"one of {', '.join(LEVELS)}, not {level!r}")
    return CaseFailover(level, promise_of(level), level in WAITING_LEVELS)


@contextmanager
def environment(values: Mapping[str, str], environ: Any) -> Iterator[None]:
    """``values`` set in ``environ`` (the process's environment: the systems' adapters and
    readers find their server there, as a run's children do), the old ones put back after."""
    saved = {name: environ.get(name) for name in values}
    environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
