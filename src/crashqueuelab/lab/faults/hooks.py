"""Hooks that turn a named crash point into a process death, in a real child or in process.

A crash point is a name a system (or the effect ledger) passes to its hook; each system
lists its points, with the durable state a death there must leave, in its adapter
(``crashqueuelab.systems``). ``exit_at`` kills the process with ``os._exit`` so that no
``finally``, no ``atexit`` and no connection close can tidy up; ``raise_at`` simulates the
same death in process for fast tests, with an exception outside the library's error tree.
"""

from __future__ import annotations

from crashqueuelab.lab.faults.children import CRASH_EXIT_CODE, die_with_last_words
from crashqueuelab.systems.contract import Hook

__all__ = ["CRASH_EXIT_CODE", "InjectedCrash", "exit_at", "raise_at"]


class InjectedCrash(BaseException):
    """Simulated process death. Deliberately not an Exception, so nothing catches it by accident."""

    def __init__(self, point: str) -> None:
        super().__init__(f"injected crash at {point}")
        self.point = point


def exit_at(point: str, *, last_words: str | None = None) -> Hook:
    """A hook that ends the process with ``os._exit`` the first time ``point`` is reached.

    With ``last_words`` (a file path), it first writes and syncs a small JSON file naming
    the point, so the parent can prove which hook killed the child even where two points
    leave the same durable state.
    """

    def hook(phase: str) -> None:
        if phase == point:
            die_with_last_words(point, last_words)

    return hook


def raise_at(point: str) -> Hook:
    """A hook that raises InjectedCrash when ``point`` is reached (in-process simulation)."""

    def hook(phase: str) -> None:
        if phase == point:
            raise InjectedCrash(point)

    return hook
