"""Acquiring SQLite's write lock fairly.

SQLite's own busy handler sleeps 1, 2, 5, 10 ... 100 ms between attempts, while a
transaction here holds the lock for about 0.2 ms. A worker that just committed therefore
takes the lock again long before any sleeping waiter wakes up, and under contention some
workers starve (measured: 0 of 3,000 jobs for some of 4+ textbook workers). Connections
opened by ``storage.open_store`` run with ``busy_timeout = 0`` instead, and a busy lock is
retried here with short randomised sleeps (20 us doubling to 500 us), so every waiter keeps
looking while the lock is briefly free. Every wait is bounded by the caller's timeout.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

_FIRST_SLEEP_S = 20e-6
_LONGEST_SLEEP_S = 500e-6

_T = TypeVar("_T")


def is_busy(error: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds a lock."""
    text = str(error)
    return "database is locked" in text or "database is busy" in text


def retry_busy(operation: Callable[[], _T], *, timeout_s: float) -> _T:
    """Run ``operation``, retrying while SQLite reports a busy lock, at most ``timeout_s``."""
    try:
        return operation()
    except sqlite3.OperationalError as error:
        if not is_busy(error):
            raise
    deadline = time.monotonic() + timeout_s
    sleep = _FIRST_SLEEP_S
    # Jitter keeps waiters from polling in lock step.
    jitter = random.Random()
    while True:
        time.sleep(sleep * (0.5 + jitter.random()))
        try:
            return operation()
        except sqlite3.OperationalError as error:
            if not is_busy(error) or time.monotonic() >= deadline:
                raise
        sleep = min(sleep * 2, _LONGEST_SLEEP_S)


def begin_immediate(conn: sqlite3.Connection, *, timeout_s: float) -> None:
    """Take the write lock (BEGIN IMMEDIATE), polling fairly while another writer holds it."""
    retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"), timeout_s=timeout_s)
