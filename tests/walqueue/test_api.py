"""The walqueue API: idempotent puts, ordering, leases, stale operations, ownership."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from walqueue import KeyConflict, Queue, QueueLocked, StaleLease, WalQueueError


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    with Queue(tmp_path / "q") as opened:
        yield opened


def wal_bytes(directory: Path) -> bytes:
    """Every byte of every segment: a refused operation must leave them all as they were."""
    return b"".join(path.read_bytes() for path in sorted(directory.glob("wal-*.log")))


def test_identical_puts_return_the_task_and_never_resurrect_it(queue: Queue) -> None:
    assert queue.put("t", {"a": [1, 2]}) == "t"
    [lease] = queue.reserve("w", now=0, lease_seconds=5)
    queue.ack(lease, now=1)
    assert queue.put("t", {"a": [1, 2]}) == "t"
    assert queue.get("t").status == "completed"
    assert queue.stats()["last_seq"] == 3


@pytest.mark.parametrize(
    "retry",
    [
        {"task_id": "t", "payload": {"a": 2}},
        {"task_id": "t", "payload": {"a": 1}, "available_at": 3},
        {"task_id": "t", "payload": {"a": 1}, "max_attempts": 4},
        {"task_id": "other", "payload": {"a": 1}, "key": "t"},
        {"task_id": "t", "payload": {"a": 1}, "key": "another-key"},
    ],
)
def test_a_reused_key_or_id_for_another_request_conflicts(
    queue: Queue, retry: dict[str, object]
) -> None:
    queue.put("t", {"a": 1})
    before = wal_bytes(queue.directory)
    with pytest.raises(KeyConflict):
        queue.put_many([retry])
    assert wal_bytes(queue.directory) == before


def test_put_many_is_one_transaction_or_none(queue: Queue) -> None:
    queue.put("x", {})
    before = wal_bytes(queue.directory)
    with pytest.raises(KeyConflict):
        queue.put_many([{"task_id": "y", "payload": {}}, {"task_id": "x", "payload": {"no": 1}}])
    assert wal_bytes(queue.directory) == before
    with pytest.raises(KeyError):
        queue.get("y")
    assert queue.put_many([{"task_id": "y", "payload": {}}, {"task_id": "z", "payload": {}}]) == [
        "y",
        "z",
    ]
    assert queue.stats()["last_seq"] == 2
    assert queue.put_many([{"task_id": "w", "payload": {}}, {"task_id": "w", "payload": {}}]) == [
        "w",
        "w",
    ]
    with pytest.raises(KeyConflict):
        queue.put_many([{"task_id": "v", "payload": {}}, {"task_id": "v", "payload": {"x": 1}}])
    with pytest.raises(KeyConflict):
        queue.put_many(
            [{"task_id": "u", "payload": {}}, {"task_id": "u", "payload": {}, "key": "k"}]
        )


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q: q.put("t", {"x": float("nan")}), ValueError),
        (lambda q: q.put("t", []), TypeError),
        (lambda q: q.put("t", {1: 2}), TypeError),
        (lambda q: q.put("t", {"s": {1, 2}}), TypeError),
        (lambda q: q.put("", {}), ValueError),
        (lambda q: q.put(7, {}), TypeError),
        (lambda q: q.put("t", {}, available_at=-1), ValueError),
        (lambda q: q.put("t", {}, available_at=1.5), TypeError),
        (lambda q: q.put("t", {}, available_at=True), TypeError),
        (lambda q: q.put("t", {}, max_attempts=0), ValueError),
        (lambda q: q.put_many([]), TypeError),
        (lambda q: q.put_many("tt"), TypeError),
        (lambda q: q.put_many([{"task_id": "t", "payload": {}, "colour": 1}]), TypeError),
        (lambda q: q.put_many(["t"]), TypeError),
        (lambda q: q.reserve("w", now=-1, lease_seconds=1), ValueError),
        (lambda q: q.reserve("w", now=0, lease_seconds=0), ValueError),
        (lambda q: q.reserve("w", now=False, lease_seconds=1), TypeError),
        (lambda q: q.reserve("", now=0, lease_seconds=1), ValueError),
        (lambda q: q.ack("not a lease", now=0), TypeError),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    queue: Queue, call: object, error: type[Exception]
) -> None:
    before = wal_bytes(queue.directory)
    with pytest.raises(error):
        call(queue)  # type: ignore[operator]
    assert wal_bytes(queue.directory) == before


def test_payloads_are_copied_at_every_boundary(queue: Queue) -> None:
    payload = {"nested": {"n": 1}}
    queue.put("t", payload)
    payload["nested"]["n"] = 2
    [lease] = queue.reserve("w", now=0, lease_seconds=5)
    lease.payload["nested"]["n"] = 3
    queue.get("t").payload["nested"]["n"] = 4
    assert queue.get("t").payload == {"nested": {"n": 1}}


def test_reserve_orders_by_availability_then_id_and_counts_generations(queue: Queue) -> None:
    queue.put_many([
        {"task_id": "b", "payload": {}, "available_at": 1},
        {"task_id": "a", "payload": {}, "available_at": 1},
        {"task_id": "c", "payload": {}, "available_at": 0},
        {"task_id": "later", "payload": {}, "available_at": 50},
    ])  # fmt: skip
    leases = queue.reserve("w", now=1, lease_seconds=10, limit=10)
    assert [lease.task_id for lease in leases] == ["c", "a", "b"]
    assert {lease.generation for lease in leases} == {1}
    queue.release(leases[0], now=2, delay=0)
    [again] = queue.reserve("w", now=2, lease_seconds=10)
    assert (again.task_id, again.generation, again.attempts) == ("c", 2, 2)


def test_expiry_makes_a_task_ready_at_its_old_deadline_or_dead(queue: Queue) -> None:
    queue.put("once", {}, max_attempts=1)
    queue.put("twice", {}, max_attempts=2)
    queue.reserve("w", now=0, lease_seconds=5, limit=2)
    assert queue.reserve("w", now=4, lease_seconds=5) == []
    [granted] = queue.reserve("w2", now=5, lease_seconds=5)
    assert granted.task_id == "twice"
    assert queue.get("once").status == "dead"
    assert queue.get("twice").generation == 2


def test_release_delays_the_task_and_dead_letters_the_last_attempt(queue: Queue) -> None:
    queue.put("t", {}, max_attempts=2)
    [lease] = queue.reserve("w", now=0, lease_seconds=5)
    queue.release(lease, now=1, delay=10)
    assert queue.get("t").available_at == 11
    assert queue.reserve("w", now=10, lease_seconds=5) == []
    [lease] = queue.reserve("w", now=11, lease_seconds=5)
    queue.release(lease, now=12)
    assert queue.get("t").status == "dead"


def test_stale_operations_append_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = Queue(directory)
    queue.put("t", {})
    [lease] = queue.reserve("w", now=0, lease_seconds=5)
    stale_variants = [
        lease.__class__(lease.task_id, "other", lease.generation, lease.deadline, 1, {}),
        lease.__class__(lease.task_id, "w", lease.generation + 1, lease.deadline, 1, {}),
        lease.__class__("unknown", "w", 1, 5, 1, {}),
    ]
    before = wal_bytes(directory)
    for stale in stale_variants:
        with pytest.raises(StaleLease):
            queue.ack(stale, now=1)
    with pytest.raises(StaleLease):
        queue.release(lease, now=5)  # now == deadline is too late
    assert wal_bytes(directory) == before
    queue.close()
    # After a restart and after a compaction, the old generation stays stale.
    queue = Queue(directory)
    [fresh] = queue.reserve("w", now=6, lease_seconds=5)
    queue.compact()
    queue.close()
    queue = Queue(directory)
    before = wal_bytes(directory)
    with pytest.raises(StaleLease):
        queue.ack(lease, now=7)
    assert wal_bytes(directory) == before
    assert fresh.generation == 2
    queue.ack(fresh, now=7)
    queue.close()


def test_a_second_owner_is_refused_in_process_and_from_another_process(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = Queue(directory)
    with pytest.raises(QueueLocked):
        Queue(directory)
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from walqueue import Queue, QueueLocked\n"
         "try:\n    Queue(sys.argv[1])\nexcept QueueLocked:\n    sys.exit(7)\n",
         str(directory)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert probe.returncode == 7, probe.stderr
    queue.close()
    queue.close()
    with pytest.raises(WalQueueError):
        queue.put("t", {})
    Queue(directory).close()


def test_compaction_leaves_only_the_snapshot_current_and_the_live_segment(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    with Queue(directory) as queue:
        for n in range(5):
            queue.put(f"t{n}", {"n": n})
        assert queue.compact() == 5
        assert queue.compact() == 5
        queue.put("after", {})
        stats = queue.stats()
        assert (stats["snapshot_seq"], stats["last_seq"], stats["segments"]) == (5, 6, 1)
    names = sorted(path.name for path in directory.iterdir())
    assert names == [
        "CURRENT", "LOCK", "snapshot-00000000000000000005.json", "wal-00000000000000000006.log",
    ]  # fmt: skip
    with Queue(directory) as queue:
        assert len(queue.task_ids()) == 6
