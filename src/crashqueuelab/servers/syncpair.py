"""A throwaway PostgreSQL primary whose every COMMIT waits for one synchronous standby.

The primary names the standby in ``synchronous_standby_names = '*'`` and keeps
``synchronous_commit = on``: a COMMIT returns once the standby has flushed its WAL. The
standby streams from the primary's own socket. Stopping the standby's WAL receiver
(``hold_standby``, SIGSTOP) is a standby that does not answer: every COMMIT made meanwhile
is written and flushed on the primary and then waits, still in progress for every other
session (``pg_xact_status``), until the receiver goes on (``release_standby``).

A lock file beside the standby (``HOLD_LOCK``) lets processes that share the pair take
turns holding it: a hold by one would otherwise end another's.
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Self

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.servers.base import wait_until
from crashqueuelab.servers.postgres import (
    DSN_VARIABLE,
    SETTINGS,
    ThrowawayServer,
    ThrowawayStandby,
)

#: psycopg (the ``postgres`` extra) is imported where it is used: the campaign imports this
#: module for every system.
#: Names the pair's standby to a run's children (the primary is ``DSN_VARIABLE``'s).
STANDBY_VARIABLE = "CRASHQUEUELAB_POSTGRES_STANDBY_DSN"
#: The file in the standby's directory whose lock a holder takes (``fcntl.flock``).
HOLD_LOCK = "hold.lock"
#: How long a new standby may take to stream (its base backup included).
STREAMING_TIMEOUT_S = 60.0
SYNCHRONOUS_SETTINGS = dict(SETTINGS) | {"synchronous_standby_names": "'*'"}


def hold_lock_path(standby_dsn: str) -> Path:
    """The lock file of the standby ``standby_dsn`` names (in its socket's directory)."""
    from psycopg.conninfo import conninfo_to_dict

    return Path(str(conninfo_to_dict(standby_dsn)["host"])) / HOLD_LOCK


@contextmanager
def taking_turns(standby_dsn: str) -> Iterator[None]:
    """The standby's hold lock, taken (waiting for its holder) until the block ends. The
    lock goes with the process too: a holder that dies lets the next one in."""
    handle = os.open(hold_lock_path(standby_dsn), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def wal_receiver(standby_dsn: str) -> int | None:
    """The process id of the standby's WAL receiver, None while it has none."""
    import psycopg

    with psycopg.connect(standby_dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
    return int(row[0]) if row and row[0] else None


def hold_standby(standby_dsn: str) -> int:
    """Stop the standby's WAL receiver (SIGSTOP): it neither flushes nor answers; its pid."""
    pid = wal_receiver(standby_dsn)
    if pid is None:
        raise ServerUnavailable("the standby has no WAL receiver to hold", "postgres")
    os.kill(pid, signal.SIGSTOP)
    return pid


def release_standby(pid: int) -> None:
    """Let a held WAL receiver go on (SIGCONT); one that is gone is nothing to release."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


class SynchronousPair:
    """A primary and one synchronous standby, both throwaway; ``close`` removes both."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self.primary: ThrowawayServer | None = None
        self.standby: ThrowawayStandby | None = None

    def start(self) -> Self:
        try:
            primary = self._stack.enter_context(ThrowawayServer(settings=SYNCHRONOUS_SETTINGS))
            self.primary = primary
            primary.start()
            standby = self._stack.enter_context(ThrowawayStandby(primary))
            self.standby = standby
            standby.start()
            if not wait_until(self._streaming, STREAMING_TIMEOUT_S, poll_s=0.02):
                raise ServerUnavailable(
                    f"the standby did not stream within {STREAMING_TIMEOUT_S:.0f} s", "postgres"
                )
        except BaseException:
            self.close()
            raise
        return self

    def _streaming(self) -> bool:
        import psycopg

        assert self.primary is not None
        with psycopg.connect(self.primary.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication"
                " WHERE state = 'streaming' AND sync_state = 'sync'"
            ).fetchone()
        return bool(row and row[0])

    def environment(self) -> dict[str, str]:
        """The primary as a run's children find a server, and the standby beside it."""
        assert self.primary is not None
        assert self.standby is not None
        return {DSN_VARIABLE: self.primary.dsn, STANDBY_VARIABLE: self.standby.dsn}

    def release(self) -> None:
        """Let the standby's WAL receiver go on, whoever held it (one that died holding it
        would stall every COMMIT after it), once no living holder has it (their lock)."""
        assert self.standby is not None
        with taking_turns(self.standby.dsn):
            pid = wal_receiver(self.standby.dsn)
            if pid is not None:
                release_standby(pid)

    def close(self) -> None:
        """Both servers stopped and removed (also after a failed start)."""
        import psycopg

        try:
            if self.standby is not None and self.standby.running:
                # A stopped receiver would not see the standby's own shutdown either.
                with suppress(psycopg.Error):
                    self.release()
            self._stack.close()
        finally:
            self.primary = None
            self.standby = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
