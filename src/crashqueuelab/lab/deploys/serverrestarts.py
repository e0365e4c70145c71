"""Crashes of a deploy run's server while its workers are stopped and replaced
(``deploys --server-restarts``): every process of the server SIGKILLed, then started again
on what it kept. Each restart runs in a thread of its own, so that the rollout keeps its
grace periods and its submissions going while the server is down (a RabbitMQ node takes
seconds to start); the next one waits until the last is back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

#: How long the run's end waits for a server restart under way before it calls the run
#: failed: longer than a Redis server's or PostgreSQL's bounded kill and start, and a
#: RabbitMQ node's usual ones (its own bounds add up to more when its processes hang).
RESTART_WAIT_S = 300.0


class ServerRestarts:
    """The run's server restarts: when each is due (the run's clock), each one done."""

    def __init__(
        self, restart: Callable[[], None], due_at: Sequence[float], clock: Callable[[], float]
    ) -> None:
        #: Crashes the server and starts it again; returns once it serves (or raises).
        self.restart = restart
        self.pending = list(due_at)
        self.clock = clock
        #: Each restart begun: when (``at_s``), when the server served again
        #: (``back_at_s``) and how long it was down (``down_s``); None while it is down.
        self.done: list[dict[str, Any]] = []
        #: What a restart that failed raised (the run then stops: its server is gone).
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def count(self) -> int:
        return len(self.pending) + len(self.done)

    def strike_due(self) -> None:
        """Begin the next restart if it is due and the last one is over."""
        if self.busy() or self.error is not None:
            return
        if not self.pending or self.pending[0] > self.clock():
            return
        self.pending.pop(0)
        began = self.clock()
        record: dict[str, Any] = {"at_s": round(began, 3), "back_at_s": None, "down_s": None}
        self.done.append(record)

        def run() -> None:
            try:
                self.restart()
            except Exception as error:
                self.error = f"{type(error).__name__}: {error}"[:300]
                return
            back = self.clock()
            record["back_at_s"] = round(back, 3)
            record["down_s"] = round(back - began, 3)

        self._thread = threading.Thread(target=run, name="server-restart", daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        """Whether a restart is under way (the server down or starting)."""
        return self._thread is not None and self._thread.is_alive()

    def finished(self) -> bool:
        """Whether every restart was made and the server is back from the last."""
        return not self.pending and not self.busy()

    def wait(self, timeout_s: float) -> None:
        """Wait (bounded) for a restart under way to end: the run ends on a served server."""
        if self._thread is not None:
            self._thread.join(timeout_s)
