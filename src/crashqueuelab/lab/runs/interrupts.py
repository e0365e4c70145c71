"""Interrupting a run (Ctrl-C, SIGTERM): the run stops its children, servers and mounts on
the way out and leaves a readable record of what it had done, never a traceback.

The command line runs each experiment inside ``interruptible()``: the first SIGINT or
SIGTERM raises ``Interrupted`` in the main thread. ``Interrupted`` is a ``BaseException``,
so no ``except Exception`` in the lab swallows it, while every ``finally`` on its way up
runs (that is where processes are stopped and disks unmounted). A run that knows what it
had finished adds it to ``partial`` before passing the exception on.

The lab's worker processes ignore SIGINT: a Ctrl-C at a terminal reaches the whole process
group, and the supervisor, not each worker, decides how they stop. They are born ignoring it
(``forkserver_context`` starts their fork server with SIGINT ignored), so a Ctrl-C that lands
while one is starting cannot print a traceback from inside multiprocessing's bootstrap;
``ignore_interrupts`` says so again in each worker.

A signal that lands while the main thread starts one of them waits until the start is done
(``start_owned``): a fork server's child that its parent left half sent reads an empty pipe
and prints multiprocessing's traceback on the run's stderr.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.process
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

#: The exit status of an interrupted command (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A run was stopped by a signal; ``partial`` holds what it had done by then."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"interrupted by {signal_name}")
        self.signal_name = signal_name
        self.at = time.monotonic()
        self.partial: dict[str, Any] = {}


class _Deferral:
    """Whether the main thread is inside a start, and the signal that landed meanwhile."""

    def __init__(self) -> None:
        self.starting = False
        self.pending: str | None = None


#: Signal handlers run in the main thread only, so this is read and written there alone.
_DEFERRAL = _Deferral()


def _interrupted(name: str) -> Interrupted:
    # Only the first signal interrupts: the stops and the record that follow it must not be
    # cut short by a second Ctrl-C (every wait on the way out is bounded).
    for each in _SIGNALS:
        signal.signal(each, signal.SIG_IGN)
    return Interrupted(name)


def _raise(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if _DEFERRAL.starting and _DEFERRAL.pending is None:
        # The handlers stay: a second signal interrupts a start that hangs.
        _DEFERRAL.pending = name
        return
    _DEFERRAL.pending = None
    raise _interrupted(name)


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` inside; the previous handlers come back on
    the way out. Outside the main thread (where Python cannot handle signals) it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {each: signal.getsignal(each) for each in _SIGNALS}
    for each in _SIGNALS:
        signal.signal(each, _raise)
    try:
        yield
    finally:
        _DEFERRAL.pending = None
        for each, handler in previous.items():
            signal.signal(each, handler)


def ignore_interrupts() -> None:
    """In a worker process: leave SIGINT to the supervisor, which stops the worker itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: Imported by every fork server after its preloaded modules (``lab.runs.preloaded``).
PRELOADED_LAST = "crashqueuelab.lab.runs.preloaded"


def forkserver_context(preload: Sequence[str]) -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its server started now (with ``preload`` imported in it, then
    ``PRELOADED_LAST``) and with SIGINT ignored, so every process it forks ignores SIGINT
    from its first instruction.

    Python keeps an ignored SIGINT that a process inherits instead of installing its
    KeyboardInterrupt handler, and the fork server hands its own disposition to each child.
    A fork server that was already running (started earlier in this process) is left as it
    is. A Ctrl-C that arrives in the few milliseconds the server takes to start is lost."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*preload, PRELOADED_LAST])
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()
        return context
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return context


class Startable(Protocol):
    def start(self) -> None: ...


#: Held while one of the lab's processes starts. Every start polls each child
#: multiprocessing knows of, from whichever thread starts it (``process._cleanup``), and a
#: fork server's child has its exit status read once: a poll from a second thread reads the
#: end of the pipe instead and takes the child's exit for 255. Two cases of a campaign, or
#: two reruns of a chaos schedule, start processes on two threads at once.
_STARTING = threading.Lock()


def start_owned(process: Startable) -> None:
    """Start ``process`` and leave it to the thread that started it: no other thread's start
    polls it, so its exit status is read once, by its owner (who joins it). In the main
    thread an interrupting signal raises once the start is done (the caller then owns a
    started process to stop)."""
    in_main = threading.current_thread() is threading.main_thread()
    with _STARTING:
        if in_main:
            _DEFERRAL.starting = True
        try:
            process.start()
            vars(multiprocessing.process)["_children"].discard(process)
        except BaseException as error:
            # A start that failed while a signal waited (SIGTERM to the whole group stops
            # the fork server too) is the signal's: the run stops as interrupted.
            name = _DEFERRAL.pending if in_main else None
            if name is None or isinstance(error, Interrupted):
                raise
            _DEFERRAL.pending = None
            raise _interrupted(name) from error
        finally:
            if in_main:
                _DEFERRAL.starting = False
    if in_main and _DEFERRAL.pending is not None:
        name, _DEFERRAL.pending = _DEFERRAL.pending, None
        raise _interrupted(name)
