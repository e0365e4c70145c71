"""Fair turns at the write lock, and bounded retries of a busy SQLite lock."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from crashqueuelab import StoreError
from crashqueuelab.core import futex as futex_module
from crashqueuelab.core import turns as turns_module
from crashqueuelab.core.futex import FutexWords, futex_available
from crashqueuelab.core.locking import begin_immediate, is_busy, retry_busy
from crashqueuelab.core.turns import TurnLock, TurnTimeout


@pytest.fixture
def line(tmp_path: Path) -> Path:
    return tmp_path / "queue.sqlite-turns"


@pytest.mark.parametrize("futex", [None, False])
def test_turns_are_served_in_ticket_order(line: Path, futex: bool | None) -> None:
    first, second = TurnLock(line, futex=futex), TurnLock(line, futex=futex)
    try:
        assert first.acquire(timeout_s=1) == 0
        first.release(0)
        assert second.acquire(timeout_s=1) == 1
        second.release(1)
        assert first.acquire(timeout_s=1) == 2
        first.release(2)
    finally:
        first.close()
        second.close()


def test_a_waiter_times_out_while_the_holder_keeps_its_turn(
    line: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 60.0)
    holder, waiter, later = TurnLock(line), TurnLock(line), TurnLock(line)
    try:
        ticket = holder.acquire(timeout_s=1)
        with pytest.raises(TurnTimeout):
            waiter.acquire(timeout_s=0.05)
        holder.release(ticket)
        # The timed-out waiter gave its ticket up; the next one skips it at once.
        assert later.acquire(timeout_s=1) == 2
    finally:
        for lock in (holder, waiter, later):
            lock.close()


def test_a_dead_holder_is_skipped(line: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 60.0)
    dead, alive = TurnLock(line), TurnLock(line)
    try:
        dead.acquire(timeout_s=1)
        dead.close()  # the kernel drops its slot lock, as when its process is killed
        assert alive.acquire(timeout_s=1) == 1
    finally:
        alive.close()


def test_a_stuck_holder_is_skipped_and_cannot_move_the_line_back(
    line: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 0.01)
    stuck, next_one = TurnLock(line), TurnLock(line)
    try:
        old = stuck.acquire(timeout_s=1)
        assert next_one.acquire(timeout_s=1) == 1
        stuck.release(old)  # it wakes up late: the line must stay at ticket 1
        next_one.release(1)
        assert stuck.acquire(timeout_s=1) == 2
        stuck.release(2)
    finally:
        stuck.close()
        next_one.close()


def test_a_closed_turn_lock_refuses_use(line: Path) -> None:
    lock = TurnLock(line)
    lock.close()
    lock.close()
    with pytest.raises(StoreError, match="closed"):
        lock.acquire(timeout_s=1)


def test_a_busy_lock_is_retried_until_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    holder = sqlite3.connect(path, isolation_level=None, timeout=0)
    waiter = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("PRAGMA journal_mode = WAL")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            begin_immediate(waiter, timeout_s=0.02)
        assert is_busy(caught.value)
        holder.execute("COMMIT")
        begin_immediate(waiter, timeout_s=0.02)
        waiter.execute("COMMIT")
    finally:
        holder.close()
        waiter.close()


def test_retry_busy_returns_once_the_lock_frees_and_passes_other_errors() -> None:
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert retry_busy(flaky, timeout_s=1) == "done"
    assert len(attempts) == 3

    def broken() -> None:
        raise sqlite3.OperationalError("no such table: x")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_busy(broken, timeout_s=1)


def serve_one_turn(lock: TurnLock) -> None:
    """The first turn of a fresh line: served at once, then released; the lock is closed."""
    try:
        assert lock.acquire(timeout_s=1) == 0
        lock.release(0)
    finally:
        lock.close()


needs_futex = pytest.mark.skipif(
    not futex_available(), reason="futexes need Linux on x86_64/aarch64"
)


@needs_futex
def test_a_futex_sleeper_is_woken_by_another_and_a_changed_word_does_not_wait(
    tmp_path: Path,
) -> None:
    fd = os.open(tmp_path / "words", os.O_RDWR | os.O_CREAT, 0o644)
    words, other = FutexWords(fd, 8192, 4), FutexWords(fd, 8192, 4)
    try:
        assert os.fstat(fd).st_size == 8192 + 16
        seen = words.value(1)
        returned = threading.Event()

        def sleeper() -> None:
            words.wait(1, seen, 30.0)
            returned.set()

        thread = threading.Thread(target=sleeper)
        thread.start()
        other.wake(1)  # through a mapping of its own, as another process would
        thread.join(timeout=30)
        assert returned.is_set()
        assert words.value(1) == seen + 1
        assert words.value(5) == words.value(1)  # indexes wrap onto the same words
        words.wait(1, seen, 30.0)  # the word moved on: returns at once
        words.wait(2, words.value(2), 0.0)  # a zero timeout returns
    finally:
        words.close()
        words.close()
        other.close()
        os.close(fd)
    with pytest.raises(OSError, match="closed"):
        words.value(0)


def test_without_futexes_the_line_polls(line: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(futex_module, "_syscall_number", lambda: None)
    assert not futex_available()
    fd = os.open(line, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="not available"):
            FutexWords(fd, 8192, 4)
    finally:
        os.close(fd)
    serve_one_turn(TurnLock(line))


def test_a_turn_is_handed_past_a_waiter_that_gave_up(
    line: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 60.0)
    holder, quitter, waiter = TurnLock(line), TurnLock(line), TurnLock(line)
    got: list[int] = []
    try:
        first = holder.acquire(timeout_s=1)
        with pytest.raises(TurnTimeout):
            quitter.acquire(timeout_s=0.01)  # ticket 1, given up
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout_s=30)))
        thread.start()
        holder.release(first)  # serves ticket 1, finds it ownerless, wakes ticket 2 too
        thread.join(timeout=30)
        assert got == [2]
        waiter.release(2)
    finally:
        for lock in (holder, quitter, waiter):
            lock.close()


def test_a_sidecar_that_cannot_be_mapped_makes_the_line_poll(
    line: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unmappable(fd: int, offset: int, count: int) -> FutexWords:
        raise OSError("mmap: no such device")

    monkeypatch.setattr(turns_module, "FutexWords", unmappable)
    serve_one_turn(TurnLock(line))
    with pytest.raises(OSError, match="no such device"):
        TurnLock(line, futex=True)


def test_without_futexes_a_waiter_polls_until_it_is_served(
    line: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    polled = threading.Event()

    class Clock:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            polled.set()  # the waiter is in its loop: now the holder may go

    monkeypatch.setattr(turns_module, "time", Clock)
    holder, waiter = TurnLock(line, futex=False), TurnLock(line, futex=False)
    got: list[int] = []
    try:
        first = holder.acquire(timeout_s=1)
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout_s=30)))
        thread.start()
        assert polled.wait(timeout=30)
        holder.release(first)
        thread.join(timeout=30)
        assert got == [1]
        waiter.release(1)
    finally:
        holder.close()
        waiter.close()
