"""A pause, then a stop, in a heartbeat run: the worker that has run a job longest is frozen
(SIGSTOP) for a window longer than the library's retry timer, thawed (SIGCONT), and at once
asked to stop (SIGTERM, as a deploy asks: its loop ends after its running work).

A frozen process sends no heartbeat: to the library it is a dead worker, and handing its
jobs out again is the library's promise for a worker failure. What is left to see is what
the worker does with the jobs it still held once it wakes and is stopped: dramatiq #266, a
worker past its heartbeat timeout that puts back on shutdown the messages the others'
maintenance had already put back, so that one message is in the queue twice and runs twice.

Each pause is one window in the judge's record (``Held`` of kind ``pause``), like a held
connection; the worker stopped after it is expected to exit, and the run goes on with the
others.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crashqueuelab.lab.heartbeats.faults import STRIKE_AFTER_TIMERS, WINDOW_TIMERS, Held, Running

PAUSE = "pause"


class PausesThenStops:
    """The pauses of one heartbeat run still to strike, and those struck."""

    def __init__(
        self,
        count: int,
        *,
        retry_after_s: float,
        strike_after_timers: float = STRIKE_AFTER_TIMERS,
        window_timers: float = WINDOW_TIMERS,
        clock: Callable[[], float] = time.monotonic,
        send: Callable[[int, signal.Signals], None] = os.kill,
    ) -> None:
        self.pending = count
        self.strike_after_s = strike_after_timers * retry_after_s
        self.window_s = window_timers * retry_after_s
        self._clock = clock
        self._send = send
        #: worker -> (its pid, when it was frozen) while it is frozen.
        self._frozen: dict[str, tuple[int, float]] = {}
        self.windows: dict[str, list[Held]] = {}
        self.stopped: set[str] = set()
        self.delivered: list[dict[str, Any]] = []

    def strike_due(self, running: Sequence[Running], pids: Mapping[str, int | None]) -> None:
        """Thaw and stop a worker whose window has passed; freeze the next one when a job
        has worked long enough and no worker is frozen."""
        now = self._clock()
        for worker, (pid, since) in list(self._frozen.items()):
            if now - since >= self.window_s:
                # Read before the thaw: the worker may start work at once, and the pause must
                # have ended before anything it starts.
                thawed = self._clock()
                self._send(pid, signal.SIGCONT)
                self._send(pid, signal.SIGTERM)
                del self._frozen[worker]
                self.windows.setdefault(worker, []).append(Held(PAUSE, since, thawed))
                self.stopped.add(worker)
                self.delivered.append({"kind": PAUSE, "target": worker, "start": since,
                                       "end": thawed, "then": "SIGTERM"})  # fmt: skip
        if not self.pending or self._frozen:
            return
        ready = [
            job
            for job in running
            if now - job.since >= self.strike_after_s
            and job.worker not in self.stopped
            and pids.get(job.worker) is not None
        ]
        if not ready:
            return
        target = min(ready, key=lambda job: job.since).worker
        frozen = pids[target]
        assert frozen is not None  # filtered above
        self._send(frozen, signal.SIGSTOP)
        self._frozen[target] = (frozen, self._clock())
        self.pending -= 1

    def thaw(self) -> None:
        """A worker still frozen when the run ends is thawed, so that it can be stopped."""
        for pid, _ in self._frozen.values():
            self._send(pid, signal.SIGCONT)
        self._frozen.clear()

    def report(self, origin: float) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "strike_after_s": self.strike_after_s,
            "delivered": [
                entry | {"start": entry["start"] - origin, "end": entry["end"] - origin}
                for entry in self.delivered
            ],
            "not_delivered": self.pending,
        }
