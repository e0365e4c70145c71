"""Injected time. Every timestamp in the store is integer microseconds read from a Clock.

Nothing outside ``SystemClock`` reads the wall clock, so tests and campaigns drive leases
and retries by advancing a ``ManualClock`` instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of the current time in integer microseconds."""

    def now_us(self) -> int: ...


class SystemClock:
    """Wall-clock microseconds since the Unix epoch, shared by every process on the machine."""

    def now_us(self) -> int:
        return time.time_ns() // 1000


#: The latest time a clock may show: with a year's lease added, still inside SQLite's
#: signed 64-bit INTEGER (and far beyond any real date).
MAX_TIME_US = 2**62


class ManualClock:
    """A clock that only moves when told to."""

    def __init__(self, start_us: int) -> None:
        if isinstance(start_us, bool) or not isinstance(start_us, int) or start_us < 0:
            raise ValueError(f"start_us must be a non-negative integer, got {start_us!r}")
        if start_us > MAX_TIME_US:
            raise ValueError(f"start_us must be at most {MAX_TIME_US}, got {start_us}")
        self._now_us = start_us

    def now_us(self) -> int:
        return self._now_us

    def advance(self, delta_us: int) -> int:
        """Move forward by ``delta_us`` (never backwards) and return the new time."""
        if isinstance(delta_us, bool) or not isinstance(delta_us, int) or delta_us < 0:
            raise ValueError(f"delta_us must be a non-negative integer, got {delta_us!r}")
        if self._now_us + delta_us > MAX_TIME_US:
            raise ValueError(f"the clock cannot pass {MAX_TIME_US} microseconds")
        self._now_us += delta_us
        return self._now_us
