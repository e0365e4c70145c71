"""Queue: the public API. Every operation checks first, then appends one frame, then applies it.

A request that is refused (bad arguments, a key conflict, a stale lease) writes nothing.
A hook that raises (a simulated crash) ends this Queue as a process death would: its files
are closed and the directory lock released, and a new Queue must reopen the directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from walqueue.codec import canonical, checked_payload, copy_payload, encode_frame
from walqueue.durability import fsync_directory
from walqueue.errors import KeyConflict, StaleLease, WalQueueError
from walqueue.ownership import Ownership
from walqueue.state import LEASED, STATUSES, State, Task, apply
from walqueue.store import Hook, Store

_PUT_FIELDS = frozenset({"task_id", "payload", "key", "available_at", "max_attempts"})


@dataclass(frozen=True)
class Lease:
    """A reservation: it names the task, the worker, the generation and the deadline.

    ``payload`` is a copy for the worker's convenience; changing it changes nothing durable.
    """

    task_id: str
    worker: str
    generation: int
    deadline: int
    attempts: int
    payload: dict[str, Any]


@dataclass(frozen=True)
class TaskState:
    """A copy of one task's state."""

    task_id: str
    status: str
    attempts: int
    generation: int
    available_at: int
    max_attempts: int
    key: str
    payload: dict[str, Any]
    lease_owner: str | None
    lease_deadline: int | None


def _time(name: str, value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _name(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    return value


def _identity(task: Task) -> tuple[Any, ...]:
    return (
        task.task_id,
        task.key,
        canonical(task.payload),
        task.original_available_at,
        task.max_attempts,
    )


def _request_identity(item: dict[str, Any]) -> tuple[Any, ...]:
    return (
        item["task_id"],
        item["key"],
        canonical(item["payload"]),
        item["available_at"],
        item["max_attempts"],
    )


class Queue:
    """A single-writer durable queue owning one directory."""

    def __init__(
        self, directory: str | Path, hook: Hook | None = None, *, preallocate: bool = False
    ) -> None:
        """Open (or create) the queue in ``directory``; recover what is on disk.

        ``preallocate`` writes segments created full of zeros instead of the seed's appended
        frames (docs/walqueue.md: its own format, which a directory keeps: open it with the
        same setting it was written with).
        """
        self.directory = Path(directory)
        if not self.directory.exists():
            self.directory.mkdir(parents=True)
            fsync_directory(self.directory.resolve().parent)
        self._owner: Ownership | None = Ownership(self.directory)
        self._store = Store(self.directory, hook, preallocate=preallocate)
        try:
            self._state: State = self._store.recover()
        except BaseException:
            self._abandon()
            raise

    # -- lifecycle -----------------------------------------------------------------------

    def _abandon(self) -> None:
        self._store.close()
        if self._owner is not None:
            self._owner.release()
            self._owner = None

    def close(self) -> None:
        """Release the directory. Safe to call twice."""
        self._abandon()

    @property
    def closed(self) -> bool:
        """True once closed, or once a write failed part-way (as a process death would)."""
        return self._owner is None

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require_open(self) -> None:
        if self._owner is None:
            raise WalQueueError("this Queue is closed (or died in a simulated crash)")

    def _commit(self, txn: dict[str, Any]) -> None:
        try:
            frame = encode_frame(txn)
        except ValueError as error:
            # Text UTF-8 cannot carry (a lone surrogate): refused before any byte is written,
            # so the queue stays open.
            raise ValueError(f"the request cannot be stored: {error}") from None
        try:
            self._store.append(txn, frame)
        except BaseException:
            # Whatever reached the disk is recovery's business now: this object is done.
            self._abandon()
            raise
        apply(self._state, txn)

    # -- producer --------------------------------------------------------------------------

    def put(
        self,
        task_id: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        available_at: int = 0,
        max_attempts: int = 3,
    ) -> str:
        """Create a task (or return the id an identical earlier put created)."""
        return self.put_many(
            [
                {
                    "task_id": task_id,
                    "payload": payload,
                    "key": key,
                    "available_at": available_at,
                    "max_attempts": max_attempts,
                }
            ]
        )[0]

    def _prepare(self, item: Mapping[str, Any]) -> dict[str, Any]:
        if type(item) is not dict and not isinstance(item, Mapping):
            raise TypeError("each put_many item must be a mapping")
        if not _PUT_FIELDS.issuperset(item):
            raise TypeError(f"unknown fields {sorted(set(item) - _PUT_FIELDS)}")
        task_id = _name("task_id", item.get("task_id"))
        key = item.get("key")
        return {
            "task_id": task_id,
            "key": task_id if key is None else _name("key", key),
            "payload": checked_payload(item.get("payload")),
            "available_at": _time("available_at", item.get("available_at", 0)),
            "max_attempts": _time("max_attempts", item.get("max_attempts", 3), minimum=1),
        }

    def put_many(self, items: Sequence[Mapping[str, Any]]) -> list[str]:
        """Put every item in one transaction, or none of them."""
        self._require_open()
        given: object = items
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence) or not given:
            raise TypeError("put_many needs a non-empty list of items")
        prepared = [self._prepare(item) for item in items]
        fresh: dict[str, dict[str, Any]] = {}
        fresh_keys: dict[str, str] = {}
        ids = []
        for item in prepared:
            owner = self._state.keys.get(item["key"], fresh_keys.get(item["key"]))
            if owner is None and (item["task_id"] in self._state.tasks or item["task_id"] in fresh):
                raise KeyConflict(f"task id {item['task_id']!r} already exists under another key")
            if owner is not None:
                existing = self._state.tasks.get(owner)
                known = _identity(existing) if existing else _request_identity(fresh[owner])
                if known != _request_identity(item):
                    raise KeyConflict(f"key {item['key']!r} names a different request")
                ids.append(owner)
                continue
            fresh[item["task_id"]] = item
            fresh_keys[item["key"]] = item["task_id"]
            ids.append(item["task_id"])
        if fresh:
            self._commit(
                {"type": "put", "seq": self._state.last_seq + 1, "tasks": list(fresh.values())}
            )
        return ids

    # -- worker ----------------------------------------------------------------------------

    def reserve(self, worker: str, *, now: int, lease_seconds: int, limit: int = 1) -> list[Lease]:
        """Expire overdue leases (one transaction), then lease ready tasks (another)."""
        self._require_open()
        _name("worker", worker)
        _time("now", now)
        _time("lease_seconds", lease_seconds, minimum=1)
        _time("limit", limit, minimum=1)
        expired = self._state.expired(now)
        if expired:
            self._commit(
                {
                    "type": "expire",
                    "seq": self._state.last_seq + 1,
                    "now": now,
                    "task_ids": [task.task_id for task in expired],
                }
            )
        ready = self._state.ready(now)[:limit]
        if not ready:
            return []
        self._commit(
            {
                "type": "reserve",
                "seq": self._state.last_seq + 1,
                "worker": worker,
                "now": now,
                "lease_seconds": lease_seconds,
                "task_ids": [task.task_id for task in ready],
            }
        )
        return [
            Lease(
                task_id=task.task_id,
                worker=worker,
                generation=task.generation,
                deadline=task.lease_deadline or 0,
                attempts=task.attempts,
                payload=copy_payload(task.payload),
            )
            for task in ready
        ]

    def _live(self, lease: Lease, now: int) -> None:
        if not isinstance(lease, Lease):
            raise TypeError("expected a Lease")
        _time("now", now)
        task = self._state.tasks.get(lease.task_id)
        if (
            task is None
            or task.status != LEASED
            or task.lease_owner != lease.worker
            or task.generation != lease.generation
            or task.lease_deadline is None
            or now >= task.lease_deadline
        ):
            raise StaleLease(
                f"{lease.task_id}: generation {lease.generation} is not the live lease"
            )

    def ack(self, lease: Lease, *, now: int) -> None:
        """Complete the leased task."""
        self._require_open()
        self._live(lease, now)
        self._commit(
            {
                "type": "ack",
                "seq": self._state.last_seq + 1,
                "task_id": lease.task_id,
                "worker": lease.worker,
                "generation": lease.generation,
                "now": now,
            }
        )

    def release(self, lease: Lease, *, now: int, delay: int = 0) -> None:
        """Give the task back: ready again at now + delay, or dead once attempts run out."""
        self._require_open()
        _time("delay", delay)
        self._live(lease, now)
        self._commit(
            {
                "type": "release",
                "seq": self._state.last_seq + 1,
                "task_id": lease.task_id,
                "worker": lease.worker,
                "generation": lease.generation,
                "now": now,
                "delay": delay,
            }
        )

    # -- inspection and compaction ---------------------------------------------------------

    def get(self, task_id: str) -> TaskState:
        """A copy of one task's state (KeyError when unknown)."""
        task = self._state.tasks[task_id]
        return TaskState(
            task_id=task.task_id,
            status=task.status,
            attempts=task.attempts,
            generation=task.generation,
            available_at=task.available_at,
            max_attempts=task.max_attempts,
            key=task.key,
            payload=copy_payload(task.payload),
            lease_owner=task.lease_owner,
            lease_deadline=task.lease_deadline,
        )

    def task_ids(self) -> list[str]:
        return sorted(self._state.tasks)

    def stats(self) -> dict[str, Any]:
        counts = dict.fromkeys(STATUSES, 0)
        for task in self._state.tasks.values():
            counts[task.status] += 1
        return {
            "counts": counts,
            "last_seq": self._state.last_seq,
            "snapshot_seq": self._store.snapshot_seq,
            "segments": self._store.segment_count(),
        }

    def compact(self) -> int:
        """Snapshot the whole state and drop the WAL it covers; returns the snapshot's sequence."""
        self._require_open()
        try:
            return self._store.compact(self._state)
        except BaseException:
            self._abandon()
            raise
