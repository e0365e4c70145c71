"""Thin bench-only drivers for the SQLite job queues people choose instead of this one.

Each driver fills a store, hands a worker the next job (``take``) and reports it finished
(``done``) through the library's own public calls, nothing else: no fencing, history or
adapter layer is added, so the bench measures each library as its users run it. Every
library runs at its default and, where that differs, at ``synchronous=FULL``; the setting
in force is read back from the library's own connection when a store is opened, never
assumed. These are not systems under test (the crash campaign needs crash points; the
persist-queue adapter in ``systems/`` is that); they need the ``peers`` extra.

- litequeue: ``put`` / ``pop`` (one ``UPDATE ... RETURNING`` under ``BEGIN IMMEDIATE``) /
  ``done``; its default is ``synchronous=NORMAL``. From 0.14 (Python 3.12 and later) ``done``
  takes the claim id ``pop`` returned and refuses a stale one.
- huey's ``SqliteStorage``: ``enqueue`` / ``dequeue``, which deletes the task in the
  transaction that reads it: there is no acknowledgement (at most once), so ``done`` does
  nothing and a finished job is one no longer stored.
- persist-queue's ``SQLiteAckQueue``: ``put`` / ``get`` / ``ack``.
"""

from __future__ import annotations

import importlib.metadata
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from crashqueuelab.core.errors import InvalidInput, SystemUnavailable, install_hint

_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
#: Where the drivers keep their database inside a store directory.
DATABASE = "queue.sqlite"


class PeerQueue(Protocol):
    def put(self, payload: str) -> None: ...

    def take(self) -> object | None: ...

    def done(self, item: object) -> bool:
        """Whether the library accepted the acknowledgement."""
        ...

    def finished(self, jobs: int) -> int: ...

    def synchronous(self) -> str: ...

    def close(self) -> None: ...


def _setting(conn: sqlite3.Connection) -> str:
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    return f"journal_mode={journal}, synchronous={_SYNCHRONOUS.get(level, level)}"


def _make_full(conn: sqlite3.Connection, full: bool) -> None:
    if full:
        conn.execute("PRAGMA synchronous = FULL")


class LiteQueueDriver:
    def __init__(self, store: Path, full: bool) -> None:
        import litequeue

        self._done_status = litequeue.MessageStatus.DONE.value
        self.queue = litequeue.LiteQueue(str(store / DATABASE))
        _make_full(self.queue.conn, full)

    def put(self, payload: str) -> None:
        self.queue.put(payload)

    def take(self) -> object | None:
        message = self.queue.pop()
        if message is None:
            return None
        return message.message_id, getattr(message, "claim_id", None)

    def done(self, item: object) -> bool:
        message_id, claim_id = cast(tuple[str, int | None], item)
        if claim_id is None:  # before 0.14: no claim ids, every done is applied
            self.queue.done(message_id)
            return True
        return bool(self.queue.done(message_id, claim_id=claim_id))

    def finished(self, jobs: int) -> int:
        row = self.queue.conn.execute(
            f"SELECT count(*) FROM {self.queue.table} WHERE status = ?", (self._done_status,)
        ).fetchone()
        return int(row[0])

    def synchronous(self) -> str:
        return _setting(self.queue.conn)

    def close(self) -> None:
        self.queue.close()


class HueyDriver:
    def __init__(self, store: Path, full: bool) -> None:
        from huey.storage import SqliteStorage

        self.storage = SqliteStorage(name="bench", filename=str(store / DATABASE))
        _make_full(self.storage.conn, full)

    def put(self, payload: str) -> None:
        self.storage.enqueue(payload.encode())

    def take(self) -> object | None:
        data: object | None = self.storage.dequeue()
        return data

    def done(self, item: object) -> bool:
        return True  # dequeue already deleted it: huey has no acknowledgement

    def finished(self, jobs: int) -> int:
        return jobs - int(self.storage.queue_size())

    def synchronous(self) -> str:
        return _setting(self.storage.conn)

    def close(self) -> None:
        self.storage.close()


class PersistQueueDriver:
    def __init__(self, store: Path, full: bool) -> None:
        import persistqueue

        # auto_resume off: a bench worker that opens the queue must not re-offer the jobs
        # other workers hold.
        self.queue = persistqueue.SQLiteAckQueue(
            str(store), auto_resume=False, serializer=json_serializer()
        )
        # persist-queue keeps its connections private; the bench only reads and sets pragmas.
        connections = [cast(sqlite3.Connection, self.queue._getter)]
        connections += [cast(sqlite3.Connection, self.queue._putter)]
        self._conn = connections[0]
        for conn in {id(c): c for c in connections}.values():
            _make_full(conn, full)

    def put(self, payload: str) -> None:
        self.queue.put(payload)

    def take(self) -> object | None:
        import persistqueue

        try:
            item: object = self.queue.get(block=False, raw=True)
        except persistqueue.Empty:
            return None
        return item

    def done(self, item: object) -> bool:
        return self.queue.ack(item) is not None

    def finished(self, jobs: int) -> int:
        return int(self.queue.acked_count())

    def synchronous(self) -> str:
        return _setting(self._conn)

    def close(self) -> None:
        self.queue.close()


def json_serializer() -> Any:
    """persist-queue's serializer protocol over JSON (its default pickles)."""

    class _Json:
        @staticmethod
        def dumps(value: object) -> bytes:
            return json.dumps(value).encode()

        @staticmethod
        def loads(data: bytes) -> object:
            return json.loads(data)

    return _Json


@dataclass(frozen=True)
class Peer:
    """One lane of peers: a library at one durability setting."""

    name: str
    distribution: str
    driver: Callable[[Path, bool], Any]
    full: bool
    how: str

    def open(self, store: Path) -> PeerQueue:
        try:
            queue: PeerQueue = self.driver(store, self.full)
        except ImportError as missing:
            raise SystemUnavailable(self.name, f"{missing}: {install_hint('peers')}") from None
        return queue

    def fill(self, store: Path, jobs: int) -> None:
        store.mkdir(parents=True, exist_ok=True)
        queue = self.open(store)
        try:
            for n in range(jobs):
                queue.put(json.dumps({"key": f"job-{n}", "value": n}))
        finally:
            queue.close()

    def finished(self, store: Path, jobs: int) -> int:
        """Jobs the library holds as finished (for huey: no longer stored)."""
        queue = self.open(store)
        try:
            return queue.finished(jobs)
        finally:
            queue.close()

    def describe(self, store: Path) -> dict[str, Any]:
        """Name, version, and the durability read back from the library's connection."""
        store.mkdir(parents=True, exist_ok=True)
        queue = self.open(store)
        try:
            setting = queue.synchronous()
        finally:
            queue.close()
        return {
            "name": self.name,
            "version": f"{self.distribution} {importlib.metadata.version(self.distribution)}",
            "durability": f"{setting} ({'set by the bench' if self.full else 'its default'})",
            "how": self.how,
        }


BENCH_PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer("litequeue", "litequeue", LiteQueueDriver, False, "pop, done"),
        Peer("litequeue-full", "litequeue", LiteQueueDriver, True, "pop, done"),
        Peer("huey", "huey", HueyDriver, False, "dequeue (deletes: no acknowledgement)"),
        Peer("huey-full", "huey", HueyDriver, True, "dequeue (deletes: no acknowledgement)"),
        Peer("persist-queue", "persist-queue", PersistQueueDriver, False, "get, ack"),
        Peer("persist-queue-full", "persist-queue", PersistQueueDriver, True, "get, ack"),
    )
}


def resolve_peer(name: str) -> Peer:
    if name not in BENCH_PEERS:
        raise InvalidInput("peer", f"{name!r} is not one of {', '.join(BENCH_PEERS)}")
    return BENCH_PEERS[name]
