"""A crash child that has its run hold the standby back at a phase of its own: the
failover campaign's lag, made exactly before the transition whose aftermath is the crash
point.

The child, the first time its hook reaches the hold phase, writes ``ASKED_FILE`` in its
case directory and waits (at most ``WAIT_S``) for ``MADE_FILE``. The run's parent, which
owns the replication link (a fault proxy in its own process), watches for the request
(``holding``), cuts the link and answers. What the child commits after that is on the
primary alone; a failover then takes it away unless the level made the COMMIT wait for
the standby (a waiting level never holds: its COMMIT would wait for ever).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ASKED_FILE = "standby-hold-asked"
MADE_FILE = "standby-hold-made"
#: The longest the child waits for the hold (the case then goes on without it, and says so).
WAIT_S = 30.0
POLL_S = 0.005


def ask_for_hold(case_dir: Path, *, wait_s: float = WAIT_S) -> bool:
    """In the child: ask the run to hold the standby back, and wait until it has."""
    (case_dir / ASKED_FILE).write_text("")
    deadline = time.monotonic() + wait_s
    while not (case_dir / MADE_FILE).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


class Hold:
    """The parent's side: whether the hold was asked for and made."""

    def __init__(self) -> None:
        self.made = False
        self.stop = threading.Event()


@contextmanager
def holding(case_dir: Path, hold: Callable[[], None]) -> Iterator[Hold]:
    """While the block runs (the child's life), answer the child's request for a hold by
    calling ``hold`` (the link cut) and then saying so."""
    state = Hold()

    def watch() -> None:
        while not state.stop.is_set():
            if (case_dir / ASKED_FILE).exists():
                hold()
                state.made = True
                (case_dir / MADE_FILE).write_text("")
                return
            state.stop.wait(POLL_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield state
    finally:
        state.stop.set()
        watcher.join()
