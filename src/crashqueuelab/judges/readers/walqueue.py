"""An independent reader of walqueue's directory: its segments, snapshot and CURRENT.

It knows the disk format (docs/walqueue.md: a 4-byte big-endian length, canonical JSON, its
SHA-256) and nothing of walqueue's code. By default it holds a directory to the seed's
format, where a segment is nothing but frames and only the newest may end in a torn frame,
one that looks like a write that never finished (a complete frame that fails its digest
otherwise was synced and damaged since); ``preallocated=True`` reads the optional format
whose segments are created full of zeros.
It rebuilds every task by replaying the history with its own rules, names every frame that
breaks them, and reports what a crash left (a torn tail, temporary files, an unpublished
snapshot) as facts, not as faults.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LENGTH = 4
_DIGEST = 32
#: What a disk persists whole or not at all when the power goes.
_SECTOR = 512
_SEGMENT = re.compile(r"^wal-(\d{20})\.log$")
_SNAPSHOT = re.compile(r"^snapshot-(\d{20})\.json$")
_STATUSES = ("ready", "leased", "completed", "dead")


class _Damaged(Exception):
    """A frame or file that the format does not allow."""


@dataclass
class _Task:
    key: str
    max_attempts: int
    available_at: int
    status: str = "ready"
    attempts: int = 0
    generation: int = 0
    owner: str | None = None
    deadline: int | None = None


@dataclass
class WalReading:
    """Tasks by key as ``(status, attempts)``, the facts of the directory, and problems."""

    exists: bool
    tasks: dict[str, tuple[str, int]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _whole_at(data: bytes, at: int) -> bool:
    size = int.from_bytes(data[at : at + _LENGTH], "big")
    end = at + _LENGTH + size + _DIGEST
    if at + _LENGTH > len(data) or end > len(data) or size == 0:
        return False
    return hashlib.sha256(data[at + _LENGTH : end - _DIGEST]).digest() == data[end - _DIGEST : end]


def _body_behind(data: bytes, at: int) -> bool:
    """Whether a whole body and its digest follow the length field at ``at``, whatever that
    field says: then the frame was written whole and its length damaged since.

    The body is found by parsing it: canonical JSON is one object, and Latin-1 keeps every
    byte one character, so the parser's end is the body's end in bytes."""
    text = data[at + _LENGTH : len(data.rstrip(b"\0")) + _DIGEST].decode("latin-1")
    try:
        _, length = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return False
    body = data[at + _LENGTH : at + _LENGTH + length]
    digest = data[at + _LENGTH + length : at + _LENGTH + length + _DIGEST]
    return hashlib.sha256(body).digest() == digest


def _left_unfinished(data: bytes, at: int, end: int, *, zero_tail: bool) -> bool:
    """Whether a frame of the right length but the wrong digest is a write a crash left
    unfinished (docs/walqueue.md): a disk sector's share of its JSON still all zero (the
    sectors of a write reach the disk in any order, and JSON holds no zero byte), or zeros
    from inside it to the end of the file with what was written of its digest the start of
    its body's digest (the write stopped there). Zeros at the end of a segment not created
    full of zeros are a size kept without its data: they start at a sector boundary."""
    body_end = end - _DIGEST
    cuts = [at + _LENGTH, *range((at + _LENGTH) // _SECTOR * _SECTOR + _SECTOR, end, _SECTOR)]
    for start, stop in zip(cuts, [*cuts[1:], end], strict=True):
        if start < body_end and not any(data[start:stop]):
            return True
    zeros_from = max(len(data.rstrip(b"\0")), body_end)
    if not zero_tail and zeros_from % _SECTOR:
        zeros_from += _SECTOR - zeros_from % _SECTOR
    if zeros_from >= end:
        return False
    written = data[body_end:zeros_from]
    return hashlib.sha256(data[at + _LENGTH : body_end]).digest().startswith(written)


def _frames(
    data: bytes, *, tail_may_tear: bool, zero_tail: bool = False
) -> tuple[list[dict[str, Any]], bool]:
    frames: list[dict[str, Any]] = []
    offset = 0
    # Preallocated segments are created full of zeros: no frame is empty and a body is never
    # zero, so frames end where only zeros remain. In the seed's format zeros are no frame:
    # a torn tail in the newest segment, corruption anywhere else.
    written = len(data.rstrip(b"\0")) if zero_tail else len(data)
    while offset < written:
        size = int.from_bytes(data[offset : offset + _LENGTH], "big")
        end = offset + _LENGTH + size + _DIGEST
        complete = offset + _LENGTH <= len(data) and end <= len(data)
        body = data[offset + _LENGTH : end - _DIGEST]
        if complete and size and hashlib.sha256(body).digest() == data[end - _DIGEST : end]:
            value = json.loads(body)
            if not isinstance(value, dict):
                raise _Damaged(f"the frame at byte {offset} is not an object")
            frames.append(value)
            offset = end
            continue
        # A whole body and digest behind a length field that does not fit them: the frame
        # was written whole. Only a zero length field before a body that begins a sector
        # can be a lost sector instead.
        zero_before_sector = size == 0 and (offset + _LENGTH) % _SECTOR == 0
        if not zero_before_sector and _body_behind(data, offset):
            raise _Damaged(f"the length field at byte {offset} is damaged")
        if not complete:
            if tail_may_tear:
                return frames, True
            raise _Damaged(f"incomplete frame at byte {offset}")
        # Only an unfinished write is a torn tail: zeros where a frame begins, or a frame
        # left unfinished, with nothing whole after it (a whole frame after it proves it was
        # synced). A synced frame damaged since is damage.
        unfinished = size == 0 or _left_unfinished(data, offset, end, zero_tail=zero_tail)
        later = any(_whole_at(data, at) for at in range(offset + 1, written))
        if tail_may_tear and unfinished and not later:
            return frames, True
        if size == 0:
            raise _Damaged(f"zeros at byte {offset}, where a frame should begin")
        raise _Damaged(f"checksum mismatch in the frame at byte {offset}")
    return frames, False


def _single(path: Path) -> dict[str, Any]:
    frames, _ = _frames(path.read_bytes(), tail_may_tear=False)
    if len(frames) != 1:
        raise _Damaged(f"{path.name} holds {len(frames)} frames, not one")
    return frames[0]


def _load_snapshot(directory: Path, tasks: dict[str, _Task]) -> int:
    current = directory / "CURRENT"
    if not current.exists():
        return 0
    pointer = _single(current)
    seq, name = pointer.get("seq"), pointer.get("snapshot")
    if not isinstance(seq, int) or name != f"snapshot-{seq:020d}.json":
        raise _Damaged(f"CURRENT names {name!r} at sequence {seq!r}")
    body = _single(directory / name)
    if body.get("seq") != seq or body["state"].get("last_seq") != seq:
        raise _Damaged(f"{name} does not hold the state through sequence {seq}")
    for raw in body["state"]["tasks"]:
        if raw["status"] not in _STATUSES:
            raise _Damaged(f"{name}: task {raw['task_id']} has status {raw['status']!r}")
        tasks[raw["task_id"]] = _Task(
            key=raw["key"],
            max_attempts=raw["max_attempts"],
            available_at=raw["available_at"],
            status=raw["status"],
            attempts=raw["attempts"],
            generation=raw["generation"],
            owner=raw["lease_owner"],
            deadline=raw["lease_deadline"],
        )
    return seq


def _end_lease(task: _Task, available_at: int) -> None:
    task.owner, task.deadline = None, None
    if task.attempts >= task.max_attempts:
        task.status = "dead"
    else:
        task.status, task.available_at = "ready", available_at


def _held(task: _Task, txn: dict[str, Any]) -> bool:
    return (
        task.status == "leased"
        and task.owner == txn["worker"]
        and task.generation == txn["generation"]
        and task.deadline is not None
        and txn["now"] < task.deadline
    )


def _apply(tasks: dict[str, _Task], txn: dict[str, Any]) -> str | None:
    """Apply one transaction by this reader's rules; the broken rule, or None."""
    kind = txn.get("type")
    if kind == "put":
        keys = {task.key for task in tasks.values()}
        for item in txn["tasks"]:
            if item["task_id"] in tasks or item["key"] in keys:
                return f"put reuses task {item['task_id']} or key {item['key']}"
            keys.add(item["key"])
            tasks[item["task_id"]] = _Task(item["key"], item["max_attempts"], item["available_at"])
    elif kind == "expire":
        for task_id in txn["task_ids"]:
            task = tasks[task_id]
            if task.status != "leased" or task.deadline is None or task.deadline > txn["now"]:
                return f"expire of {task_id}, whose lease has not expired"
            _end_lease(task, task.deadline)
    elif kind == "reserve":
        for task_id in txn["task_ids"]:
            task = tasks[task_id]
            if task.status != "ready" or task.available_at > txn["now"]:
                return f"reserve of {task_id}, which is not ready"
            task.status, task.owner = "leased", txn["worker"]
            task.attempts, task.generation = task.attempts + 1, task.generation + 1
            task.deadline = txn["now"] + txn["lease_seconds"]
    elif kind in ("ack", "release"):
        task = tasks[txn["task_id"]]
        if not _held(task, txn):
            return f"{kind} of {txn['task_id']} by a lease that is not live (a stale holder)"
        if kind == "ack":
            task.status, task.owner, task.deadline = "completed", None, None
        else:
            _end_lease(task, txn["now"] + txn["delay"])
    else:
        return f"unknown transaction type {kind!r}"
    return None


def _invariants(tasks: dict[str, _Task]) -> list[str]:
    problems = []
    for task_id, task in sorted(tasks.items()):
        if task.attempts > task.max_attempts:
            problems.append(f"{task_id}: {task.attempts} attempts, at most {task.max_attempts}")
        if task.status == "dead" and task.attempts < task.max_attempts:
            problems.append(f"{task_id}: dead with attempts left")
        if (task.status == "leased") != (task.owner is not None and task.deadline is not None):
            problems.append(f"{task_id}: lease fields disagree with status {task.status}")
        if task.generation != task.attempts:
            problems.append(f"{task_id}: generation {task.generation} != attempts")
    return problems


def _replay(
    directory: Path,
    reading: WalReading,
    tasks: dict[str, _Task],
    start: int,
    *,
    zero_tail: bool,
) -> None:
    segments = sorted(
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := _SEGMENT.match(path.name))
    )
    last_seq, last_type, torn = start, None, False
    expected: int | None = None
    for index, (first_seq, path) in enumerate(segments):
        newest = index == len(segments) - 1
        frames, torn = _frames(path.read_bytes(), tail_may_tear=newest, zero_tail=zero_tail)
        if expected is not None and first_seq != expected:
            reading.problems.append(f"{path.name} starts at {first_seq}, expected {expected}")
        expected = first_seq
        for txn in frames:
            if txn.get("seq") != expected:
                reading.problems.append(f"{path.name}: sequence {txn.get('seq')}, not {expected}")
                return
            expected += 1
            last_type = txn.get("type")
            reading.history.append(txn)
            if txn["seq"] <= last_seq:
                continue  # covered by the published snapshot
            if txn["seq"] != last_seq + 1:
                reading.problems.append(f"{path.name}: gap before sequence {txn['seq']}")
                return
            broken = _apply(tasks, txn)
            if broken is not None:
                reading.problems.append(f"{path.name} seq {txn['seq']}: {broken}")
                return
            last_seq = txn["seq"]
    reading.facts.update(
        last_seq=last_seq,
        last_transaction=last_type,
        torn_tail=torn,
        segments=len(segments),
    )


def read_walqueue_directory(directory: Path, *, preallocated: bool = False) -> WalReading:
    """Read and judge a walqueue directory without walqueue's code, in the seed's format
    or, with ``preallocated``, in the format of segments created full of zeros."""
    if not directory.is_dir():
        return WalReading(exists=False, facts={"segments": 0})
    reading = WalReading(exists=True)
    names = sorted(path.name for path in directory.iterdir())
    tasks: dict[str, _Task] = {}
    try:
        published = _load_snapshot(directory, tasks)
        reading.facts.update(
            published_snapshot=published or None,
            snapshots=sum(1 for name in names if _SNAPSHOT.match(name)),
            temporary_files=sum(1 for name in names if name.endswith(".tmp")),
        )
        _replay(directory, reading, tasks, published, zero_tail=preallocated)
    except (_Damaged, KeyError, TypeError, ValueError, AttributeError) as error:
        reading.problems.append(f"unreadable: {error!r}")
        return reading
    reading.problems += _invariants(tasks)
    reading.tasks = {task.key: (task.status, task.attempts) for task in tasks.values()}
    return reading
