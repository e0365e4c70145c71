"""Network faults in a heartbeat run: each worker reaches the server through a path of its
own on the fault proxy (``lab.network``), and the run holds connections while jobs work.

- a **stall** holds the connection of the worker that has been running a job longest
  (bytes kept both ways, nothing closed), so its library's heartbeats do not reach the
  server for the window;
- a **partition** holds every worker's connection, and new connections hang, for the
  window;
- ``latency_ms`` delays every byte of every path, all run long.

One fault at a time, each once a job has worked for half a retry timer (or as many timers as
the run says: a later strike leaves room for what a library does on its own first); the
window lasts two retry timers unless told otherwise, so a held worker's heartbeat is older
than the timer before the window ends. A fault the work ended before is recorded as not delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Self

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import NetworkPlan, RunNetwork, run_server
from crashqueuelab.lab.faults.network.windows import WindowKind
from crashqueuelab.lab.runs.inheritance import Inherited

#: A fault window's default length, in retry timers.
WINDOW_TIMERS = 2.0
#: How long a job must have worked before a fault strikes its worker, in retry timers.
STRIKE_AFTER_TIMERS = 0.5
_HOLDING = {WindowKind.STALL: "stall", WindowKind.PARTITION: "partition"}


@dataclass(frozen=True)
class Held:
    """A window in which a worker's connection was held (monotonic seconds)."""

    kind: str
    start: float
    end: float


@dataclass(frozen=True)
class Running:
    """A job at work: who runs it, since when (monotonic seconds)."""

    worker: str
    since: float


class HeartbeatFaults:
    """The fault proxy of one heartbeat run, and the faults it has yet to strike."""

    def __init__(
        self,
        plan: NetworkPlan,
        *,
        retry_after_s: float,
        started: float,
        strike_after_timers: float = STRIKE_AFTER_TIMERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not strike_after_timers >= 0:
            raise InvalidInput("network_fault_after_timers", "must be a number of timers >= 0")
        if plan.lost_replies or plan.connection_resets:
            raise InvalidInput(
                "network", "a heartbeat run holds connections; it has no lost replies or resets"
            )
        retry_ms = retry_after_s * 1000
        window_ms = plan.window_ms if plan.window_ms is not None else WINDOW_TIMERS * retry_ms
        self.plan = replace(plan, window_ms=window_ms)
        self.retry_after_s = retry_after_s
        self.strike_after_timers = strike_after_timers
        self._clock = clock
        self.network = RunNetwork(
            self.plan,
            server=run_server("postgres"),
            lease_ms=round(retry_ms),
            started=started,
            clock=clock,
        )
        self.pending = [FaultKind.STALL] * plan.stalls + [FaultKind.PARTITION] * plan.partitions
        self.delivered: list[dict[str, Any]] = []

    def __enter__(self) -> Self:
        self.network.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.network.__exit__(*exc)

    def inherited(self, worker: str) -> Inherited:
        """What the worker's process inherits: the server's DSN is its path on the proxy."""
        return self.network.inherited(worker)

    def _holding_now(self) -> bool:
        now = self._clock()
        return any(
            window.kind in _HOLDING and window.start <= now < window.end
            for window in self.network.proxy.windows
        )

    def strike_due(self, running: Sequence[Running]) -> None:
        """Strike the next fault if none is in force and a job has worked long enough."""
        if not self.pending or self._holding_now():
            return
        ready = [job for job in running if self._clock() - job.since >= self._strike_after]
        if not ready:
            return
        kind = self.pending.pop(0)
        target = min(ready, key=lambda job: job.since).worker
        record = self.network.strike(kind, None if kind is FaultKind.PARTITION else [target])
        self.delivered.append({"kind": kind.value, "target": target} | record)

    @property
    def _strike_after(self) -> float:
        return self.strike_after_timers * self.retry_after_s

    def held(self) -> dict[str, list[Held]]:
        """Every worker's windows of held connection, in the proxy's time."""
        windows: dict[str, list[Held]] = {}
        for window in self.network.proxy.windows:
            if window.kind in _HOLDING:
                for path in window.paths:
                    held = Held(_HOLDING[window.kind], window.start, window.end)
                    windows.setdefault(path, []).append(held)
        return windows

    def report(self) -> dict[str, Any]:
        return self.network.report() | {
            "strike_after_timers": self.strike_after_timers,
            "delivered": self.delivered,
            "not_delivered": [kind.value for kind in self.pending],
        }
