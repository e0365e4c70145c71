"""The judges' own readers of walqueue's directory and persist-queue's file: they agree
with the systems on healthy stores and name every kind of damage, without the systems' code."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.judges.readers.persistqueue import read_ack_queue
from crashqueuelab.judges.readers.walqueue import read_walqueue_directory
from tests.walqueue.helpers import (
    LAYOUTS,
    build_big,
    frames_of,
    preallocated,
    put_txn,
    unfinished_shapes,
)
from walqueue import CorruptStore, Queue
from walqueue.codec import encode_frame


def a_walqueue(directory: Path, *, compact: bool = False) -> None:
    with Queue(directory) as queue:
        queue.put("a", {"n": 1})
        queue.put("b", {"n": 2}, max_attempts=1)
        [lease] = queue.reserve("w1", now=10, lease_seconds=5)
        queue.ack(lease, now=12)
        if compact:
            queue.compact()
        queue.reserve("w2", now=20, lease_seconds=5)


def segment(directory: Path) -> Path:
    return sorted(directory.glob("wal-*.log"))[-1]


def test_a_healthy_directory_reads_as_walqueue_itself_reports(tmp_path: Path) -> None:
    for compact in (False, True):
        directory = tmp_path / f"q-{compact}"
        a_walqueue(directory, compact=compact)
        reading = read_walqueue_directory(directory)
        assert reading.problems == []
        with Queue(directory) as queue:
            own = {key: (queue.get(key).status, queue.get(key).attempts) for key in "ab"}
        assert reading.tasks == own == {"a": ("completed", 1), "b": ("leased", 1)}
        assert reading.facts["last_seq"] == 5
        assert reading.facts["published_snapshot"] == (4 if compact else None)
        assert [txn["type"] for txn in reading.history][-1] == "reserve"
    assert read_walqueue_directory(tmp_path / "absent").exists is False


def test_a_torn_tail_is_a_fact_and_a_torn_middle_is_damage(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    a_walqueue(directory)
    live = segment(directory)
    frames = frames_of(live)
    for tail in (b"\x00\x00\x01\x00{", bytes(40), bytes(3)):  # a torn frame, or its size only
        live.write_bytes(frames + tail)
        reading = read_walqueue_directory(directory)
        assert (reading.problems, reading.facts["torn_tail"]) == ([], True)
    for shape in (preallocated, bytes):  # zeros after the frames, or nothing
        live.write_bytes(shape(frames + b"\x00\x00\x01\x00{"))
        reading = read_walqueue_directory(directory, preallocated=True)
        assert (reading.problems, reading.facts["torn_tail"]) == ([], True)
    live.write_bytes(preallocated(frames))
    reading = read_walqueue_directory(directory, preallocated=True)
    assert (reading.problems, reading.facts["torn_tail"]) == ([], False)
    live.write_bytes(frames)
    reading = read_walqueue_directory(directory)
    assert (reading.problems, reading.facts["torn_tail"]) == ([], False)
    # The same bytes in a segment that is not the newest are corruption.
    live.write_bytes(frames + b"\x00\x00\x01\x00{")
    live.rename(directory / "wal-00000000000000000001.log")
    (directory / "wal-00000000000000000006.log").write_bytes(b"")
    reading = read_walqueue_directory(directory)
    assert len(reading.problems) == 1
    assert "incomplete frame" in reading.problems[0]


def test_a_stray_byte_in_a_sealed_segments_zeros_is_damage(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    a_walqueue(directory)
    live = segment(directory)
    frames = frames_of(live)
    data = bytearray(preallocated(frames))
    data[len(frames) + 100] = 1
    live.write_bytes(bytes(data))
    assert read_walqueue_directory(directory, preallocated=True).facts["torn_tail"] is True
    live.rename(directory / "wal-00000000000000000001.log")
    (directory / "wal-00000000000000000006.log").write_bytes(preallocated(b""))
    [problem] = read_walqueue_directory(directory, preallocated=True).problems
    assert "zeros at byte" in problem


def test_in_the_seed_format_zeros_in_a_sealed_segment_are_damage(tmp_path: Path) -> None:
    """A reader written to the seed's format: a segment holds frames and nothing else."""
    directory = tmp_path / "q"
    a_walqueue(directory)
    live = segment(directory)
    live.write_bytes(preallocated(frames_of(live)))
    live.rename(directory / "wal-00000000000000000001.log")
    (directory / "wal-00000000000000000006.log").write_bytes(b"")
    [problem] = read_walqueue_directory(directory).problems
    assert "zeros at byte" in problem


def test_a_flipped_byte_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    a_walqueue(directory)
    live = segment(directory)
    data = bytearray(live.read_bytes())
    data[10] ^= 0xFF
    live.write_bytes(bytes(data))
    assert "checksum mismatch" in read_walqueue_directory(directory).problems[0]


def test_the_reader_and_walqueue_agree_on_a_damaged_or_unfinished_final_frame(
    tmp_path: Path,
) -> None:
    """Each byte of a synced final frame flipped, or zeroed: damage to both (walqueue
    refuses to open, the reader names a problem), except in a preallocated segment the
    digest's last byte zeroed, which is exactly a write that stopped one byte short: a torn
    tail to both. The frame left unfinished: a torn tail to both."""
    for preallocate in (False, True):
        directory = tmp_path / f"q-{preallocate}"
        shape = preallocated if preallocate else bytes
        with Queue(directory, preallocate=preallocate) as queue:
            queue.put("a", {"n": 1})
            queue.put("b", {"n": 2})
        live = segment(directory)
        frames = frames_of(live, zero_tail=preallocate)
        start = len(frames) // 2  # two frames of the same length
        assert int.from_bytes(frames[:4], "big") + 36 == start
        torn = []
        for offset in range(start, len(frames)):
            for damage in (frames[offset] ^ 0xFF, 0):
                if damage == frames[offset]:
                    continue
                damaged = bytearray(frames)
                damaged[offset] = damage
                live.write_bytes(shape(bytes(damaged)))
                reading = read_walqueue_directory(directory, preallocated=preallocate)
                try:
                    Queue(directory, preallocate=preallocate).close()
                except CorruptStore:
                    assert reading.problems, (preallocate, offset - start, damage)
                    continue
                assert (reading.problems, reading.facts["torn_tail"]) == ([], True)
                torn.append((offset - start, damage))
        assert torn == ([(len(frames) - start - 1, 0)] if preallocate else [])
    pristine = tmp_path / "big"
    live, frames, start = build_big(pristine, LAYOUTS[0])
    for layout in LAYOUTS:
        for name, data in unfinished_shapes(frames, start, layout).items():
            live.write_bytes(data)
            reading = read_walqueue_directory(pristine, preallocated=layout.preallocate)
            assert (reading.problems, reading.facts["torn_tail"]) == ([], True), name
            assert reading.tasks == {"a": ("ready", 0), "b": ("ready", 0)}, name
            with layout.open(pristine) as queue:
                assert queue.task_ids() == ["a", "b"], name


def test_a_zero_length_field_before_a_whole_body_is_torn_only_at_a_sector(
    tmp_path: Path,
) -> None:
    """A lost sector zeroes a length field and leaves the body behind it only when the body
    begins at the sector boundary; the reader and walqueue agree on both sides of it."""
    directory = tmp_path / "q"
    directory.mkdir()
    short = len(encode_frame(put_txn(1, "pad", {"text": ""})))
    last = encode_frame(put_txn(2, "q", {"n": 1}))
    live = directory / "wal-00000000000000000001.log"
    for length, torn in ((508, True), (507, False)):
        first = encode_frame(put_txn(1, "pad", {"text": "p" * (length - short)}))
        live.write_bytes(first + bytes(4) + last[4:])
        reading = read_walqueue_directory(directory)
        if torn:
            assert (reading.problems, reading.facts["torn_tail"]) == ([], True)
            assert reading.tasks == {"pad": ("ready", 0)}
            with Queue(directory) as queue:
                assert queue.task_ids() == ["pad"]
        else:
            assert "the length field at byte 507 is damaged" in reading.problems[0]
            with pytest.raises(CorruptStore, match="the length field at byte 507 is damaged"):
                Queue(directory)


def forged(directory: Path, txn: dict[str, Any]) -> list[str]:
    live = segment(directory)
    live.write_bytes(frames_of(live) + encode_frame(txn))
    return read_walqueue_directory(directory).problems


def test_a_frame_that_breaks_the_rules_is_named(tmp_path: Path) -> None:
    cases = {
        "stale": (
            {"type": "ack", "seq": 6, "task_id": "b", "worker": "w1", "generation": 1, "now": 21},
            "ack of b by a lease that is not live (a stale holder)",
        ),
        "reuse": (
            {"type": "put", "seq": 6, "tasks": [{"task_id": "a", "key": "a", "payload": {},
                                                  "available_at": 0, "max_attempts": 1}]},
            "put reuses task a or key a",
        ),
        "early": ({"type": "expire", "seq": 6, "now": 21, "task_ids": ["b"]}, "not expired"),
        "busy": (
            {"type": "reserve", "seq": 6, "worker": "w", "now": 30, "lease_seconds": 1,
             "task_ids": ["b"]},
            "reserve of b, which is not ready",
        ),
        "odd": ({"type": "vacuum", "seq": 6}, "unknown transaction type 'vacuum'"),
        "gap": ({"type": "vacuum", "seq": 9}, "sequence 9, not 6"),
    }  # fmt: skip
    for name, (txn, words) in cases.items():
        directory = tmp_path / name
        a_walqueue(directory)
        problems = forged(directory, txn)
        assert len(problems) == 1, (name, problems)
        assert words in problems[0], (name, problems)


def write_snapshot(directory: Path, seq: int, tasks: list[dict[str, Any]], name: str = "") -> None:
    name = name or f"snapshot-{seq:020d}.json"
    state = {"last_seq": seq, "tasks": tasks}
    (directory / name).write_bytes(encode_frame({"seq": seq, "state": state}))
    (directory / "CURRENT").write_bytes(encode_frame({"snapshot": name, "seq": seq}))


def task(**changes: Any) -> dict[str, Any]:
    base = {"task_id": "t", "key": "t", "payload": {}, "max_attempts": 2,
            "original_available_at": 0, "available_at": 0, "status": "ready", "attempts": 0,
            "generation": 0, "lease_owner": None, "lease_deadline": None}  # fmt: skip
    return base | changes


def test_a_snapshot_that_breaks_an_invariant_is_named(tmp_path: Path) -> None:
    cases = {
        "too-many": (task(attempts=3, generation=3), "3 attempts, at most 2"),
        "early-death": (task(status="dead", attempts=1, generation=1), "dead with attempts left"),
        "ownerless": (task(status="leased", attempts=1, generation=1), "lease fields disagree"),
        "generation": (task(attempts=1, generation=2), "generation 2 != attempts"),
        "status": (task(status="lost"), "has status 'lost'"),
    }
    for name, (row, words) in cases.items():
        directory = tmp_path / name
        directory.mkdir()
        write_snapshot(directory, 1, [row])
        problems = read_walqueue_directory(directory).problems
        assert len(problems) == 1, (name, problems)
        assert words in problems[0], (name, problems)


def test_a_current_that_names_the_wrong_snapshot_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    write_snapshot(directory, 1, [task()], name="snapshot-00000000000000000002.json")
    assert "CURRENT names" in read_walqueue_directory(directory).problems[0]
    (directory / "CURRENT").write_bytes(encode_frame({"one": 1}) + encode_frame({"two": 2}))
    assert "holds 2 frames" in read_walqueue_directory(directory).problems[0]
    (directory / "CURRENT").write_bytes(encode_frame(["not", "an", "object"]))
    assert "not an object" in read_walqueue_directory(directory).problems[0]
    write_snapshot(directory, 3, [task()])
    body = {"seq": 3, "state": {"last_seq": 2, "tasks": []}}
    (directory / "snapshot-00000000000000000003.json").write_bytes(encode_frame(body))
    assert "does not hold the state" in read_walqueue_directory(directory).problems[0]


def a_persist_queue_file(directory: Path, rows: list[tuple[str, int]]) -> Path:
    directory.mkdir()
    path = directory / "data.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE ack_queue_default (_id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " data BLOB, timestamp FLOAT, status INTEGER)"
    )
    conn.executemany(
        "INSERT INTO ack_queue_default (data, timestamp, status) VALUES (?, 0, ?)", rows
    )
    conn.commit()
    conn.close()
    return path


def item(key: str, attempts: int = 0, max_attempts: int = 3) -> str:
    return json.dumps({"key": key, "attempts": attempts, "max_attempts": max_attempts})


def test_the_persist_queue_reader_names_damage_row_by_row(tmp_path: Path) -> None:
    assert read_ack_queue(tmp_path / "absent").exists is False
    (tmp_path / "empty").mkdir()
    sqlite3.connect(tmp_path / "empty" / "data.db").close()
    assert read_ack_queue(tmp_path / "empty").items == {}
    rows = [
        (item("a"), 5),
        (item("b", 1), 2),
        ("not json", 1),
        (item("c"), 7),
        (item("a"), 1),
        (item("d", 4, 2), 9),
    ]
    a_persist_queue_file(tmp_path / "q", rows)
    reading = read_ack_queue(tmp_path / "q")
    assert reading.items == {"a": ("acked", 0), "b": ("unack", 1), "d": ("ack_failed", 4)}
    assert len(reading.problems) == 4
    assert "row 3: not an item the lab put" in reading.problems[0]
    assert "row 4 (c): unknown status 7" in reading.problems[1]
    assert "job a: stored twice (row 5 again)" in reading.problems[2]
    assert "job d: 4 attempts, more than allowed" in reading.problems[3]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "data.db").write_bytes(b"this is not a database at all" * 100)
    assert "unreadable" in read_ack_queue(tmp_path / "junk").problems[0]


def test_the_sqlite_reader_names_a_replay_mismatch_in_words(tmp_path: Path) -> None:
    from crashqueuelab import DurableQueue, ManualClock, SeededIds
    from crashqueuelab.judges.readers.sqlite import QUEUE_FILE, read_queue_store

    with DurableQueue(tmp_path / QUEUE_FILE, clock=ManualClock(5), ids=SeededIds(1, "r")) as queue:
        job = queue.submit(idempotency_key="k", job_type="t", payload={}).job
    conn = sqlite3.connect(tmp_path / QUEUE_FILE)
    with conn:
        conn.execute("UPDATE jobs SET attempts = 4")
    conn.close()
    reading = read_queue_store(tmp_path)
    assert f"replay: job {job.job_id}: attempts should be 0, the store has 4" in reading.problems
