"""The servers a run needs: started for the run, named to its children, stopped after it.

A run on a PostgreSQL system gets a throwaway server (``crashqueuelab.servers.postgres``)
unless ``--dsn`` names one; either way the DSN reaches every child process through the
environment, where the system's adapter and the judges read it. A run on a Redis system
gets a throwaway ``redis-server`` (``lab.redisserver``) with the persistence the system
names; its socket reaches the children the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crashqueuelab.servers.postgres import ThrowawayServer
    from crashqueuelab.servers.redis import ThrowawayRedis
    from crashqueuelab.systems.contract import System

#: The environment variables through which a run names its servers to its children.
SERVER_VARIABLES = ("CRASHQUEUELAB_POSTGRES_DSN", "CRASHQUEUELAB_REDIS_SOCKET")


@contextmanager
def servers_for(
    systems: Iterable[str], dsn: str | None
) -> Iterator[ThrowawayServer | ThrowawayRedis | None]:
    """The server handle while the run lasts: a ThrowawayServer or ThrowawayRedis, or None
    (``dsn`` given, or no system needs a server)."""
    resolved = [system for system in map(_resolved, systems) if system is not None]
    redis = next((system for system in resolved if system.server == "redis"), None)
    if redis is not None:
        from crashqueuelab.servers.redis import ThrowawayRedis

        with ThrowawayRedis(redis.persistence or "rdb") as store:
            store.start()
            with naming(SERVER_VARIABLES[1], str(store.socket)):
                yield store
        return
    if not any(system.server == "postgres" for system in resolved):
        yield None
        return
    from crashqueuelab.servers.postgres import ThrowawayServer

    if dsn is not None:
        with naming_server(dsn):
            yield None
    else:
        with ThrowawayServer() as server:
            server.start()
            with naming_server(server.dsn):
                yield server


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
