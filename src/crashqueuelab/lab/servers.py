"""The servers a run needs: started for the run, named to its children, stopped after it.

A run on the PostgreSQL system gets a throwaway server (``crashqueuelab.postgres.server``)
unless ``--dsn`` names one; either way the DSN reaches every child process through the
environment, where the system's adapter and the judges read it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crashqueuelab.postgres.server import ThrowawayServer

#: The environment variables through which a run names its servers to its children.
SERVER_VARIABLES = ("CRASHQUEUELAB_POSTGRES_DSN",)


@contextmanager
def servers_for(systems: Iterable[str], dsn: str | None) -> Iterator[ThrowawayServer | None]:
    """The server handle while the run lasts: a ThrowawayServer, or None (``dsn`` given, or
    no system needs a server)."""
    if not any(_needs_server(system) for system in systems):
        yield None
        return
    from crashqueuelab.postgres.server import ThrowawayServer

    if dsn is not None:
        with naming_server(dsn):
            yield None
    else:
        with ThrowawayServer() as server:
            server.start()
            with naming_server(server.dsn):
                yield server


@contextmanager
def naming_server(dsn: str) -> Iterator[None]:
    """The PostgreSQL server ``dsn`` is the one this process and its children use, until
    the block ends (the one named before is named again)."""
    variable = SERVER_VARIABLES[0]
    previous = os.environ.get(variable)
    os.environ[variable] = dsn
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous


def _needs_server(spec: str) -> bool:
    """Whether the system named needs a PostgreSQL server (a spec that does not resolve
    needs none here: the run itself reports it)."""
    from crashqueuelab.core.errors import SystemUnavailable
    from crashqueuelab.systems.registry import resolve_system

    try:
        return resolve_system(spec).server == "postgres"
    except SystemUnavailable:
        return False
