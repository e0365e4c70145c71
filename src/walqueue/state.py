"""The queue's state and the one function that applies a transaction to it.

Normal operation and recovery both call ``apply``: an operation first checks its request
against the state, builds a transaction, appends it to the WAL, and only then applies it;
recovery applies the same transactions, read back from disk, through the same code.
``validate`` guards recovery against a well-formed frame that describes an impossible move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walqueue.codec import copy_payload
from walqueue.errors import CorruptStore

READY, LEASED, COMPLETED, DEAD = "ready", "leased", "completed", "dead"
STATUSES = (READY, LEASED, COMPLETED, DEAD)


@dataclass
class Task:
    """Everything about one task, tombstones included: nothing is normalised away."""

    task_id: str
    key: str
    payload: dict[str, Any]
    max_attempts: int
    original_available_at: int
    available_at: int
    status: str = READY
    attempts: int = 0
    generation: int = 0
    lease_owner: str | None = None
    lease_deadline: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "key": self.key,
            "payload": copy_payload(self.payload),
            "max_attempts": self.max_attempts,
            "original_available_at": self.original_available_at,
            "available_at": self.available_at,
            "status": self.status,
            "attempts": self.attempts,
            "generation": self.generation,
            "lease_owner": self.lease_owner,
            "lease_deadline": self.lease_deadline,
        }


class State:
    """All tasks by id, every key ever used, and the last applied sequence number."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.keys: dict[str, str] = {}
        self.last_seq = 0

    # -- snapshots ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "last_seq": self.last_seq,
            "tasks": [self.tasks[task_id].to_json() for task_id in sorted(self.tasks)],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str) -> State:
        state = cls()
        try:
            state.last_seq = _int(data["last_seq"])
            for raw in data["tasks"]:
                task = Task(
                    task_id=str(raw["task_id"]),
                    key=str(raw["key"]),
                    payload=dict(raw["payload"]),
                    max_attempts=_int(raw["max_attempts"]),
                    original_available_at=_int(raw["original_available_at"]),
                    available_at=_int(raw["available_at"]),
                    status=str(raw["status"]),
                    attempts=_int(raw["attempts"]),
                    generation=_int(raw["generation"]),
                    lease_owner=raw["lease_owner"],
                    lease_deadline=raw["lease_deadline"],
                )
                if task.status not in STATUSES or task.task_id in state.tasks:
                    raise ValueError(task.task_id)
                if task.key in state.keys:
                    raise ValueError(task.key)
                state.tasks[task.task_id] = task
                state.keys[task.key] = task.task_id
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptStore(f"{where}: invalid snapshot state ({error!r})") from None
        return state

    # -- reads -----------------------------------------------------------------------------

    def ready(self, now: int) -> list[Task]:
        """Ready tasks whose time has come, in (available_at, task_id) order."""
        due = [t for t in self.tasks.values() if t.status == READY and t.available_at <= now]
        return sorted(due, key=lambda task: (task.available_at, task.task_id))

    def expired(self, now: int) -> list[Task]:
        leased = [
            t
            for t in self.tasks.values()
            if t.status == LEASED and t.lease_deadline is not None and t.lease_deadline <= now
        ]
        return sorted(leased, key=lambda task: task.task_id)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a non-negative integer: {value!r}")
    return value


def _end_lease(task: Task, available_at: int) -> None:
    task.lease_owner = None
    task.lease_deadline = None
    if task.attempts >= task.max_attempts:
        task.status = DEAD
    else:
        task.status = READY
        task.available_at = available_at


def validate(state: State, txn: dict[str, Any], *, where: str) -> None:
    """Raise CorruptStore unless ``txn`` is a legal next transaction for ``state``."""
    try:
        kind = txn["type"]
        if txn["seq"] != state.last_seq + 1:
            raise ValueError(f"sequence {txn['seq']} after {state.last_seq}")
        if kind == "put":
            seen: set[str] = set()
            for item in txn["tasks"]:
                task_id, key = item["task_id"], item["key"]
                if not isinstance(task_id, str) or not isinstance(key, str):
                    raise ValueError("task ids and keys are strings")
                if task_id in state.tasks or key in state.keys or {task_id, key} & seen:
                    raise ValueError(f"task {task_id} or key {key} reused")
                seen |= {task_id, key}
                _int(item["available_at"])
                if _int(item["max_attempts"]) < 1 or not isinstance(item["payload"], dict):
                    raise ValueError("bad task")
        elif kind == "expire":
            now = _int(txn["now"])
            for task_id in txn["task_ids"]:
                task = state.tasks[task_id]
                if (
                    task.status != LEASED
                    or task.lease_deadline is None
                    or task.lease_deadline > now
                ):
                    raise ValueError(f"task {task_id} has no expired lease")
        elif kind == "reserve":
            now = _int(txn["now"])
            _int(txn["lease_seconds"])
            for task_id in txn["task_ids"]:
                task = state.tasks[task_id]
                if task.status != READY or task.available_at > now:
                    raise ValueError(f"task {task_id} is not ready")
        elif kind in ("ack", "release"):
            task = state.tasks[txn["task_id"]]
            if (
                task.status != LEASED
                or task.lease_owner != txn["worker"]
                or task.generation != txn["generation"]
                or task.lease_deadline is None
                or _int(txn["now"]) >= task.lease_deadline
            ):
                raise ValueError(f"task {txn['task_id']} is not held by this lease")
            if kind == "release":
                _int(txn["delay"])
        else:
            raise ValueError(f"unknown transaction type {kind!r}")
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptStore(f"{where}: invalid transaction ({error!r})") from None


def apply(state: State, txn: dict[str, Any]) -> None:
    """Apply one transaction. The caller has validated it (or built it from valid checks)."""
    kind = txn["type"]
    if kind == "put":
        for item in txn["tasks"]:
            # The transaction belongs to apply once appended: its payload is already a private
            # copy (made by put, or freshly decoded by recovery), so it is not copied again.
            task = Task(
                task_id=item["task_id"],
                key=item["key"],
                payload=item["payload"],
                max_attempts=item["max_attempts"],
                original_available_at=item["available_at"],
                available_at=item["available_at"],
            )
            state.tasks[task.task_id] = task
            state.keys[task.key] = task.task_id
    elif kind == "expire":
        for task_id in txn["task_ids"]:
            task = state.tasks[task_id]
            # An expired task becomes available again at its old deadline.
            _end_lease(task, task.lease_deadline or 0)
    elif kind == "reserve":
        for task_id in txn["task_ids"]:
            task = state.tasks[task_id]
            task.status = LEASED
            task.attempts += 1
            task.generation += 1
            task.lease_owner = txn["worker"]
            task.lease_deadline = txn["now"] + txn["lease_seconds"]
    elif kind == "ack":
        task = state.tasks[txn["task_id"]]
        task.status = COMPLETED
        task.lease_owner = None
        task.lease_deadline = None
    elif kind == "release":
        task = state.tasks[txn["task_id"]]
        _end_lease(task, txn["now"] + txn["delay"])
    state.last_seq = txn["seq"]
