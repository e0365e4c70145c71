"""Crash points at an adapter's boundary, for queues that call no hook of their own.

``X:before`` is reached before the queue is called, ``X:after`` once the call returned (its
transaction committed). No change to a third-party queue is needed to kill a process there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from crashqueuelab.systems.contract import Hook

T = TypeVar("T")


def around(hook: Hook | None, name: str, call: Callable[[], T]) -> T:
    """Call ``call`` between the hook's ``name:before`` and ``name:after`` points."""
    if hook is not None:
        hook(f"{name}:before")
    result = call()
    if hook is not None:
        hook(f"{name}:after")
    return result
