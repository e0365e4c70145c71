"""A throwaway server for a whole test session (the ``postgres_dsn`` and ``redis_socket``
fixtures of ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.runs.servers import started
from crashqueuelab.servers.base import Throwaway


def session_server(make: Callable[[], Throwaway], what: str) -> Iterator[str]:
    """The server ``make`` gives, started and named to children by the environment while
    the session lasts; yields the value of its variable (a DSN, a socket). Skips only where
    no such server can exist here (no binaries); CI installs them."""
    try:
        server = make()
    except ServerUnavailable as error:
        pytest.skip(f"no {what} server can run here: {error.reason}")
    with started(server):
        [address] = server.environment().values()
        yield address
