"""Crash at every hook call of a scripted workload; recovery must equal a clean run's state.

For the k-th hook call (every k), the hook raises InjectedCrash, the Queue is discarded, a
new one reopens the directory, and the recovered state must equal the uninterrupted run's
state just before the interrupted operation or after one of its transactions (only those
whose complete frame was written). The workload then finishes and must end exactly where
the uninterrupted run ended.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.walqueue.helpers import (
    WORKLOAD,
    Observable,
    leases_from,
    observe,
)
from walqueue import InjectedCrash, Lease, Queue


def clean_run(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[Observable]], Observable, int]:
    """Per operation, the state before it and after each of its transactions; the final
    state; and how many hook calls the whole run makes (opening the directory included)."""
    calls = 0

    def count(phase: str) -> None:
        nonlocal calls
        calls += 1

    queue = Queue(directory, hook=count)
    trail: list[Observable] = []
    commit = Queue._commit

    def observed_commit(self: Queue, txn: dict[str, object]) -> None:
        commit(self, txn)
        trail.append(observe(self))

    monkeypatch.setattr(Queue, "_commit", observed_commit)
    states: list[list[Observable]] = []
    leases: dict[str, Lease] = {}
    for _, step in WORKLOAD:
        trail.clear()
        before = observe(queue)
        step(queue, leases)
        states.append([before, *trail])
    monkeypatch.undo()
    final = observe(queue)
    queue.close()
    return states, final, calls


def run_until_crash(
    directory: Path, hook: Callable[[str], None], leases: dict[str, Lease], progress: dict[str, Any]
) -> None:
    """Open and run the workload, noting which operation was under way."""
    progress["queue"] = queue = Queue(directory, hook=hook)
    for index, (_, step) in enumerate(WORKLOAD):
        progress["interrupted"] = index
        step(queue, leases)


def test_every_hook_call_is_a_recoverable_crash_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states, final, calls = clean_run(tmp_path / "clean", monkeypatch)
    empty = {
        "tasks": {},
        "last_seq": 0,
        "counts": final["counts"] | dict.fromkeys(final["counts"], 0),
    }
    assert calls > 40
    for k in range(1, calls + 1):
        directory = tmp_path / f"crash-{k}"
        counter, crashed_at = 0, ""

        def crash_at_k(phase: str, k: int = k) -> None:
            nonlocal counter, crashed_at
            counter += 1
            if counter == k:
                crashed_at = phase
                raise InjectedCrash(phase)

        leases: dict[str, Lease] = {}
        progress: dict[str, Any] = {"interrupted": -1, "queue": None}
        with pytest.raises(InjectedCrash):
            run_until_crash(directory, crash_at_k, leases, progress)
        interrupted, crashed = progress["interrupted"], progress["queue"]
        # The transaction being written when the hook fired (the dead object still knows).
        pending = 1 if crashed is None else crashed.stats()["last_seq"] + 1
        with Queue(directory) as reopened:
            recovered = observe(reopened)
            leases = leases_from(reopened)
            # Only a transaction whose complete frame was written may have survived.
            if crashed_at in ("append:before_write", "append:mid_write"):
                assert recovered["last_seq"] < pending, (k, crashed_at)
            if crashed_at in ("append:after_write", "append:after_sync"):
                assert recovered["last_seq"] >= pending, (k, crashed_at)
            if interrupted < 0:
                assert recovered == empty, (k, crashed_at)
                resume = 0
            else:
                allowed = states[interrupted]
                assert recovered in allowed, (k, crashed_at, WORKLOAD[interrupted][0])
                finished = recovered == allowed[-1] and len(allowed) > 1
                resume = interrupted + 1 if finished else interrupted
            for _, step in WORKLOAD[resume:]:
                step(reopened, leases)
            assert observe(reopened) == final, f"crash at hook call {k} ({crashed_at})"


def test_the_crash_matrix_covers_every_phase(tmp_path: Path) -> None:
    phases: set[str] = set()
    queue = Queue(tmp_path / "q", hook=phases.add)
    leases: dict[str, Lease] = {}
    for _, step in WORKLOAD:
        step(queue, leases)
    queue.close()
    assert {
        "append:before_write", "append:mid_write", "append:after_write", "append:after_sync",
        "rotate:before_create", "rotate:after_create", "rotate:after_dir_sync",
        "snapshot:before_write", "snapshot:after_sync", "snapshot:after_rename",
        "snapshot:after_dir_sync", "current:before_write", "current:after_sync",
        "current:after_rename", "current:after_dir_sync", "delete:before_unlink",
        "delete:after_unlink", "delete:after_dir_sync",
    } <= phases  # fmt: skip


@pytest.mark.parametrize(
    "phase", ["truncate:before", "truncate:after_truncate", "truncate:after_sync"]
)
def test_a_crash_while_truncating_a_torn_tail_recovers_on_the_next_open(
    tmp_path: Path, phase: str
) -> None:
    directory = tmp_path / "q"
    with Queue(directory) as queue:
        queue.put("a", {"n": 1})
    segment = next(directory.glob("wal-*.log"))
    segment.write_bytes(segment.read_bytes() + b'\x00\x00\x00\x30{"half')

    def crash(seen: str) -> None:
        if seen == phase:
            raise InjectedCrash(seen)

    with pytest.raises(InjectedCrash):
        Queue(directory, hook=crash)
    with Queue(directory) as queue:
        assert queue.get("a").status == "ready"
        queue.put("b", {"n": 2})
    with Queue(directory) as queue:
        assert queue.task_ids() == ["a", "b"]
