"""The 13 named fault points, and hooks that turn one of them into a process death.

A fault point is a ``Phase`` at which a crash leaves a distinct durable state (see
docs/fault-model.md). ``exit_at`` kills the process with ``os._exit`` so that no ``finally``,
no ``atexit`` and no connection close can tidy up; ``raise_at`` simulates the same death in
process for fast tests, with an exception outside the library's error tree.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path

from crashqueuelab.core.hooks import Hook, Phase

#: The exit status of a child killed at its fault point.
CRASH_EXIT_CODE = 86


class FaultPoint(StrEnum):
    """Where the campaign kills a process. Each value is the name of a ``Phase``."""

    BEFORE_SUBMIT_COMMIT = "BEFORE_SUBMIT_COMMIT"
    AFTER_SUBMIT_COMMIT = "AFTER_SUBMIT_COMMIT"
    BEFORE_CLAIM_COMMIT = "BEFORE_CLAIM_COMMIT"
    AFTER_CLAIM_COMMIT = "AFTER_CLAIM_COMMIT"
    AFTER_HEARTBEAT_COMMIT = "AFTER_HEARTBEAT_COMMIT"
    BEFORE_EFFECT_COMMIT = "BEFORE_EFFECT_COMMIT"
    AFTER_EFFECT_COMMIT = "AFTER_EFFECT_COMMIT"
    BEFORE_SUCCESS_COMMIT = "BEFORE_SUCCESS_COMMIT"
    AFTER_SUCCESS_COMMIT = "AFTER_SUCCESS_COMMIT"
    BEFORE_FAILURE_COMMIT = "BEFORE_FAILURE_COMMIT"
    AFTER_FAILURE_COMMIT = "AFTER_FAILURE_COMMIT"
    AFTER_RECOVERY_COMMIT = "AFTER_RECOVERY_COMMIT"
    AFTER_PROMOTION_COMMIT = "AFTER_PROMOTION_COMMIT"

    @property
    def phase(self) -> Phase:
        return Phase(self.value)


class InjectedCrash(BaseException):
    """Simulated process death. Deliberately not an Exception, so nothing catches it by accident."""

    def __init__(self, point: FaultPoint) -> None:
        super().__init__(f"injected crash at {point.value}")
        self.point = point


def _write_last_words(path: Path, point: FaultPoint) -> None:
    # Durable before death: the file, then its directory entry.
    data = json.dumps({"fault_point": point.value, "pid": os.getpid()}).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def exit_at(
    point: FaultPoint, *, last_words: Path | None = None, exit_code: int = CRASH_EXIT_CODE
) -> Hook:
    """A hook that ends the process with ``os._exit`` when ``point`` is reached.

    With ``last_words``, it first writes (and syncs) a small JSON file naming the point, so
    the parent can prove which hook killed the child even where two points leave the same
    durable state.
    """
    target = point.phase

    def hook(phase: Phase) -> None:
        if phase is target:
            if last_words is not None:
                _write_last_words(last_words, point)
            os._exit(exit_code)

    return hook


def raise_at(point: FaultPoint) -> Hook:
    """A hook that raises InjectedCrash when ``point`` is reached (in-process simulation)."""
    target = point.phase

    def hook(phase: Phase) -> None:
        if phase is target:
            raise InjectedCrash(point)

    return hook
