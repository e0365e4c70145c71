"""A worker process's stop signals as a ``threading.Event``, set without a lock in the handler.

Python runs a signal's handler in the main thread, between two bytecodes, wherever that
thread is: also inside ``Event.wait``, while it holds the event's own lock (the lock is
taken again when a timed wait wakes, for a few bytecodes, and a thread that loses the GIL
there holds it for a whole switch interval). A handler that calls ``Event.set`` then waits
on a lock its own thread holds, for ever: the worker never stops and is killed at the end of
its grace. A heartbeat run's worker did exactly this after a pause (SIGSTOP, SIGCONT, then
SIGTERM lands at once, where the thread was frozen), about one run in twelve.

Here the handler only writes a byte to a pipe (a system call, no lock), and a thread of its
own, blocked on the pipe's other end, sets the event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading


def event_set_by(*signals: signal.Signals) -> threading.Event:
    """In a process's main thread: an event that each of ``signals`` sets (a second signal
    changes nothing). The pipe stays open as long as the process lives: a handler may still
    run after the event is set. A process that forks after this call hands its children the
    handler and the pipe, and a signal to a child would stop the parent: none of the lab's
    callers forks."""
    stop = threading.Event()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def relay() -> None:
        os.read(read_end, 1)
        stop.set()

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():  # no lock: ``is_set`` reads a flag
            return
        # The pipe is full of earlier signals' bytes.
        with contextlib.suppress(OSError):
            os.write(write_end, b"\0")

    threading.Thread(target=relay, name="stop-signals", daemon=True).start()
    for number in signals:
        signal.signal(number, handler)
    return stop
