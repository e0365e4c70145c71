"""Shared pieces of the walqueue tests: an observable state and a scripted workload."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from walqueue import Lease, Queue
from walqueue.codec import decode_frames, encode_frame
from walqueue.store import SEGMENT_BYTES

Observable = dict[str, Any]


def frames_of(segment: Path, *, zero_tail: bool = False) -> bytes:
    """The bytes of a segment's frames: all of it in the seed's format; with ``zero_tail``,
    without the zeros preallocated after them."""
    data = segment.read_bytes()
    _, end = decode_frames(data, where=segment.name, tail_may_tear=False, zero_tail=zero_tail)
    assert not any(data[end:]), "a segment's frames are followed by zeros only"
    return data[:end]


def preallocated(frames: bytes) -> bytes:
    """A segment as ``Queue(preallocate=True)`` makes it: ``frames``, then zeros up to the
    segment size."""
    return frames + bytes(max(0, SEGMENT_BYTES - len(frames)))


@dataclasses.dataclass(frozen=True)
class Layout:
    """One of walqueue's two segment formats, as the tests write and read it."""

    preallocate: bool

    def __str__(self) -> str:
        return "preallocated" if self.preallocate else "seed"

    def open(self, directory: Path) -> Queue:
        return Queue(directory, preallocate=self.preallocate)

    def segment(self, frames: bytes) -> bytes:
        """A segment holding ``frames`` as this layout's writer leaves it."""
        return preallocated(frames) if self.preallocate else frames

    def frames_of(self, segment: Path) -> bytes:
        return frames_of(segment, zero_tail=self.preallocate)


#: The seed's format (the default) and the preallocated option.
LAYOUTS = (Layout(preallocate=False), Layout(preallocate=True))


#: A last put big enough that its frame spans several 512-byte sectors of the segment.
BIG = {"text": "sectors " * 200}


def build_big(directory: Path, layout: Layout) -> tuple[Path, bytes, int]:
    """Two puts and a big one; the segment, its frames, and where the last frame starts."""
    with layout.open(directory) as queue:
        queue.put("a", {"n": 1})
        queue.put("b", {"n": 2})
        queue.put("c", BIG)
    [segment] = sorted(directory.glob("wal-*.log"))
    frames = layout.frames_of(segment)
    last = encode_frame(
        {
            "seq": 3,
            "tasks": [{"available_at": 0, "key": "c", "max_attempts": 3, "payload": BIG,
                       "task_id": "c"}],
            "type": "put",
        }
    )  # fmt: skip
    assert frames.endswith(last)
    assert len(last) > 3 * 512
    return segment, frames, len(frames) - len(last)


def unfinished_shapes(frames: bytes, start: int, layout: Layout) -> dict[str, bytes]:
    """The final frame as a power cut or a process death can leave it unfinished in
    ``layout``: without preallocation, zeros at the end of the file come in whole sectors
    (a new size kept without its data); in a preallocated segment a write can also stop
    just before its digest."""
    first_sector = (start // 512 + 1) * 512  # the first whole sector inside the frame
    end = len(frames)
    shapes = {}
    for name, zeroed in {
        "a middle sector still zero": (first_sector + 512, first_sector + 1024),
        "its first sector still zero": (start + 4, first_sector),
        "its last sector still zero": ((end - 1) // 512 * 512, end),
        "its second half never written": (start + (end - start) // 2, end),
        **({"only its digest never written": (end - 32, end)} if layout.preallocate else {}),
    }.items():
        data = bytearray(frames)
        data[zeroed[0] : zeroed[1]] = bytes(zeroed[1] - zeroed[0])
        shapes[name] = bytes(data)
    shapes["cut short at a sector"] = frames[: first_sector + 512]
    return {name: layout.segment(data) for name, data in shapes.items()}


def put_txn(seq: int, task_id: str, payload: dict[str, object]) -> dict[str, object]:
    """A put transaction of one task, as walqueue writes it."""
    task = {"available_at": 0, "key": task_id, "max_attempts": 3, "payload": payload,
            "task_id": task_id}  # fmt: skip
    return {"seq": seq, "tasks": [task], "type": "put"}


def observe(queue: Queue) -> Observable:
    """Everything a caller can see: every task's state, and the last sequence number."""
    return {
        "tasks": {task_id: dataclasses.asdict(queue.get(task_id)) for task_id in queue.task_ids()},
        "last_seq": queue.stats()["last_seq"],
        "counts": queue.stats()["counts"],
    }


def leases_from(queue: Queue) -> dict[str, Lease]:
    """The live leases as a restarted worker rebuilds them from the durable state."""
    leases = {}
    for task_id in queue.task_ids():
        task = queue.get(task_id)
        if task.status == "leased" and task.lease_owner and task.lease_deadline is not None:
            leases[task_id] = Lease(
                task_id, task.lease_owner, task.generation, task.lease_deadline,
                task.attempts, task.payload,
            )  # fmt: skip
    return leases


Step = Callable[[Queue, dict[str, Lease]], object]


def _reserve(worker: str, now: int, lease: int, limit: int) -> Step:
    def step(queue: Queue, leases: dict[str, Lease]) -> None:
        for granted in queue.reserve(worker, now=now, lease_seconds=lease, limit=limit):
            leases[granted.task_id] = granted

    return step


def _ack(task_id: str, now: int) -> Step:
    def step(queue: Queue, leases: dict[str, Lease]) -> None:
        queue.ack(leases[task_id], now=now)

    return step


def _release(task_id: str, now: int, delay: int) -> Step:
    def step(queue: Queue, leases: dict[str, Lease]) -> None:
        queue.release(leases[task_id], now=now, delay=delay)

    return step


#: put, put_many, reserve (both transactions), ack, release, expiry, dead-lettering and
#: two compactions, each step a whole operation.
WORKLOAD: list[tuple[str, Step]] = [
    ("put a", lambda q, _: q.put("a", {"n": 1})),
    ("put_many b c d", lambda q, _: q.put_many([
        {"task_id": "b", "payload": {"n": 2}},
        {"task_id": "c", "payload": {"n": 3}, "max_attempts": 1},
        {"task_id": "d", "payload": {"n": 4}, "key": "key-d", "available_at": 5},
    ])),
    ("reserve a b c", _reserve("w1", 1, 10, 3)),
    ("ack a", _ack("a", 2)),
    ("release b", _release("b", 3, 4)),
    ("compact 1", lambda q, _: q.compact()),
    ("reserve expires c, leases b d", _reserve("w2", 20, 10, 5)),
    ("ack d", _ack("d", 21)),
    ("put e (identical retry of a too)", lambda q, _: q.put_many([
        {"task_id": "a", "payload": {"n": 1}},
        {"task_id": "e", "payload": {"n": 5}},
    ])),
    ("compact 2", lambda q, _: q.compact()),
    ("reserve expires b, leases e", _reserve("w3", 40, 10, 5)),
    ("ack e", _ack("e", 41)),
]  # fmt: skip
