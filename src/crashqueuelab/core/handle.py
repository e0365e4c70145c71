"""An open database owned by one process: its connection, its fair turns, reads and writes.

``DurableQueue`` and ``EffectLedger`` are both one of these; the handle refuses to work
after ``close()`` or in a forked child, so a connection never crosses a fork.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from crashqueuelab.core.errors import StoreError
from crashqueuelab.core.locking import retry_busy
from crashqueuelab.core.schema import SchemaSpec
from crashqueuelab.core.storage import open_store, write_transaction
from crashqueuelab.core.turns import TurnLock


class DatabaseHandle:
    """One process's access to one database of kind ``spec``."""

    def __init__(
        self, path: str | Path, *, spec: SchemaSpec, create: bool, busy_timeout_ms: int, what: str
    ) -> None:
        self.path = str(path)
        self._what = what
        self._pid = os.getpid()
        self._timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = open_store(
            self.path, create=create, busy_timeout_ms=busy_timeout_ms, spec=spec
        )
        # Opened only once the database proved to be ours, so a refused file gets no sidecar.
        try:
            self._turns = TurnLock(Path(f"{self.path}-turns"))
        except BaseException:
            # A sidecar the disk refuses (EIO, ENOSPC) leaves no connection behind.
            self._conn.close()
            raise

    def close(self) -> None:
        """Close the connection; further use raises StoreError. Safe to call twice."""
        try:
            self._turns.close()
        finally:
            # A failed disk may refuse the sidecar's close; the connection closes anyway.
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def connection(self) -> sqlite3.Connection:
        """The open connection, refused after close() and in a forked child."""
        if self._conn is None:
            raise StoreError(self.path, f"the {self._what} is closed")
        if os.getpid() != self._pid:
            raise StoreError(self.path, "this connection was opened in another process")
        return self._conn

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.connection, timeout_ms=self._timeout_ms, turns=self._turns)

    def _read(self, sql: str, arguments: tuple[object, ...] = ()) -> list[Any]:
        """All rows of a read, retried while a checkpoint or recovery briefly locks the file."""
        conn = self.connection
        return retry_busy(
            lambda: conn.execute(sql, arguments).fetchall(), timeout_s=self._timeout_ms / 1000
        )
