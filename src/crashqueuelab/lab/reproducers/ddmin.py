"""Delta debugging (Zeller's ddmin) over a list of operations, within a time budget.

``fails(items)`` reruns the candidate and says whether it still fails the same way. The
search first looks for the shortest failing prefix (halving: most failures need only what
came before them), then removes ever smaller chunks, down to single operations, keeping
each removal that still fails. When the budget runs out it returns the smallest failing
list found so far and says the search was cut short; every list it returns was rerun and
seen to fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Shrunk(Generic[T]):
    items: list[T]
    #: How many candidates were rerun (the original's confirmation included).
    runs: int
    seconds: float
    #: True when no single operation can be removed any more (1-minimal); False when the
    #: budget ran out first.
    minimal: bool


class _Budget:
    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started = clock()
        self.deadline = self.started + seconds

    def left(self) -> bool:
        return self.clock() < self.deadline


def shrink(
    items: Sequence[T],
    fails: Callable[[list[T]], bool],
    *,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> Shrunk[T] | None:
    """The smallest sublist of ``items`` (order kept) that still ``fails``; None when
    ``items`` itself does not fail when rerun (nothing to shrink, and nothing reproduced)."""
    budget = _Budget(seconds, clock)
    runs = 1
    current = list(items)
    if not fails(current):
        return None

    def attempt(candidate: list[T]) -> bool:
        nonlocal runs
        runs += 1
        return fails(candidate)

    # The shortest failing prefix, by halving: [low] does not fail (or is empty), [high] does.
    low, high = 0, len(current)
    while high - low > 1 and budget.left():
        middle = (low + high) // 2
        if attempt(current[:middle]):
            high = middle
        else:
            low = middle
    current = current[:high]
    chunk = max(1, len(current) // 2)
    minimal = False
    while budget.left():
        removed_any = False
        start = 0
        while start < len(current) and budget.left():
            candidate = current[:start] + current[start + chunk :]
            if candidate and attempt(candidate):
                current, removed_any = candidate, True
            else:
                start += chunk
        if chunk == 1 and not removed_any and start >= len(current):
            minimal = True
            break
        if not removed_any:
            chunk = max(1, chunk // 2)
    return Shrunk(current, runs, round(clock() - budget.started, 3), minimal)
