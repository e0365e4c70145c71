"""A client opened anew before the call that follows one that raised: how a run's load
keeps calling a library whose client holds one connection and never reconnects, across a
server that went away (a failover, a restart)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from crashqueuelab.systems.contract import Claim, JobSpec, QueueClient, Verdict


class Calls(Protocol):
    """What the load calls on a client."""

    def submit(self, job: JobSpec) -> str: ...

    def claim(self, worker_id: str, lease_us: int) -> Claim | None: ...

    def succeed(self, claim: Claim) -> Verdict: ...

    def recover(self) -> int: ...

    def close(self) -> None: ...


class Reopening:
    """A client opened anew before the call that follows one that raised: what an
    application does with a library whose client holds one connection and never
    reconnects (its pool replaces the connection, or its supervisor restarts the process).
    The failed call is still the caller's failure; the next one runs on a new session."""

    def __init__(self, open_client: Callable[[], QueueClient]) -> None:
        self._open = open_client
        self._client: QueueClient | None = open_client()

    def _current(self) -> QueueClient:
        if self._client is None:
            self._client = self._open()  # an error here is the call's: it stays to reopen
        return self._client

    def _failed(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # its connection is what failed
                client.close()

    def submit(self, job: JobSpec) -> str:
        try:
            return self._current().submit(job)
        except Exception:
            self._failed()
            raise

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        try:
            return self._current().claim(worker_id, lease_us)
        except Exception:
            self._failed()
            raise

    def succeed(self, claim: Claim) -> Verdict:
        try:
            return self._current().succeed(claim)
        except Exception:
            self._failed()
            raise

    def recover(self) -> int:
        try:
            return self._current().recover()
        except Exception:
            self._failed()
            raise

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
