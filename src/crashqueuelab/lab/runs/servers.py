"""The servers a run needs: started for the run, named to its children, stopped after it.

A run on a PostgreSQL system gets a throwaway server (``crashqueuelab.servers.postgres``),
or a primary with a streaming standby when the run fails it over, unless ``--dsn`` names
one; either way the DSN reaches every child process through the environment, where the
system's adapter and the judges read it. A run on a Redis system gets a throwaway
``redis-server`` (``crashqueuelab.servers.redis``) with the persistence the system names;
its socket reaches the children the same way. Each server says which variables name it
(``Throwaway.environment``). A Redis server a parent run started and keeps across runs
(``versions --upgrade-from``: the release under test runs on the server the release before
it left) is named by ``KEPT_REDIS_VARIABLE``: a run that finds it uses that server and
starts none. A system whose broker is RabbitMQ (Celery's RabbitMQ broker, its results in
Redis) gets a throwaway RabbitMQ node beside its server, named by its AMQP URL, unless the
environment names one already (a test's).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from crashqueuelab.servers.base import Throwaway
from crashqueuelab.servers.postgres import DSN_VARIABLE, ThrowawayServer
from crashqueuelab.servers.rabbitmq import URL_VARIABLE as RABBITMQ_URL_VARIABLE
from crashqueuelab.servers.rabbitmq import ThrowawayRabbitMQ
from crashqueuelab.servers.redis import SOCKET_VARIABLE, ThrowawayRedis

if TYPE_CHECKING:
    from crashqueuelab.systems.contract import System

#: The environment variables through which a run names its servers to its children (a
#: RabbitMQ node's AMQP URL: one a test started, for Celery's RabbitMQ broker).
SERVER_VARIABLES = (DSN_VARIABLE, SOCKET_VARIABLE, RABBITMQ_URL_VARIABLE)
#: The socket of a Redis server a parent run started and keeps for this one (and stops).
KEPT_REDIS_VARIABLE = "CRASHQUEUELAB_REDIS_KEPT"

Server = TypeVar("Server", bound=Throwaway)


@contextmanager
def servers_for(
    systems: Iterable[str],
    dsn: str | None,
    *,
    replicated: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Iterator[Any]:
    """The server handle while the run lasts: a ThrowawayServer or ThrowawayRedis, a
    replicated PostgreSQL (``replicated`` makes it: a primary and a streaming standby,
    started by entering it, named by its ``client_dsn``, which a failover moves), or None
    (``dsn`` given, or no system needs a server). A RabbitMQ node the systems' broker
    needs is started first and stopped last, and is then the handle (the server a restart
    crashes): None when the environment names a node already."""
    resolved = [system for system in map(_resolved, systems) if system is not None]
    with ExitStack() as stack:
        needs_a_node = any(system.broker == "rabbitmq" for system in resolved)
        node = None
        if needs_a_node and not os.environ.get(RABBITMQ_URL_VARIABLE):
            node = stack.enter_context(started(ThrowawayRabbitMQ()))
        handle = stack.enter_context(_servers(resolved, dsn, replicated))
        yield node if needs_a_node else handle


@contextmanager
def _servers(
    resolved: list[System],
    dsn: str | None,
    replicated: Callable[[], AbstractContextManager[Any]] | None,
) -> Iterator[Any]:
    redis = next((system for system in resolved if system.server == "redis"), None)
    if redis is not None:
        kept = os.environ.get(KEPT_REDIS_VARIABLE)
        if kept:
            with naming(SOCKET_VARIABLE, kept):
                yield None
            return
        with started(ThrowawayRedis(redis.persistence or "rdb")) as store:
            yield store
        return
    if not any(system.server == "postgres" for system in resolved):
        yield None
        return
    if dsn is not None:
        with naming_server(dsn):
            yield None
    elif replicated is not None:
        with replicated() as cluster, naming_server(cluster.client_dsn):
            yield cluster
    else:
        with started(ThrowawayServer()) as server:
            yield server


@contextmanager
def started(server: Server) -> Iterator[Server]:
    """``server`` started and named to this process and its children until the block ends,
    then closed, also on failure (a start that fails leaves nothing running or behind)."""
    with server:
        server.start()
        with named(server):
            yield server


@contextmanager
def named(server: Throwaway) -> Iterator[None]:
    """``server`` is the one this process and its children use, by the variables it gives,
    until the block ends (what they named before is named again)."""
    with ExitStack() as stack:
        for variable, value in server.environment().items():
            stack.enter_context(naming(variable, value))
        yield


def naming_server(dsn: str) -> AbstractContextManager[None]:
    """The PostgreSQL server ``dsn`` is the one this process and its children use, until
    the block ends (the one named before is named again)."""
    return naming(SERVER_VARIABLES[0], dsn)


@contextmanager
def naming(variable: str, value: str) -> Iterator[None]:
    """``variable`` names ``value`` to this process and its children until the block ends
    (what it named before is named again)."""
    previous = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous


def _resolved(spec: str) -> System | None:
    """The system named, or None when the spec does not resolve (the run itself reports
    it; it needs no server here)."""
    from crashqueuelab.core.errors import SystemUnavailable
    from crashqueuelab.systems.registry import resolve_system

    try:
        return resolve_system(spec)
    except SystemUnavailable:
        return None
