"""The steady load a failover run keeps on the queue: a producer submitting jobs at a fixed
rate, workers claiming, executing and acknowledging them, and a sweeper handing expired
leases back; threads of the run's own process, each with its own client (its own session).

Every answer the queue gives is written to the ``Ledger`` as it comes (the client's side of
the story: "enqueued" once a submission was acknowledged, "completed" once an
acknowledgement was accepted); the judge holds it against what the servers kept. An error
the queue raises is written down too, and the thread goes on: the PostgreSQL queue itself tries
again across a server that went away (bounded), so an error there is one it gave up on; a
library's client raises its driver's errors (redis-py's ``ConnectionError`` while the
Sentinels elect a new primary), each a caller told failure. Every one is in the ledger with
its type, and the record counts them: none is hidden.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import CrashQueueLabError
from crashqueuelab.lab.runs.reopening import Calls, Reopening
from crashqueuelab.systems.contract import JobSpec, QueueClient, Verdict

#: How long an idle worker or the sweeper waits before it asks again.
IDLE_S = 0.01
SWEEP_EVERY_S = 0.05
#: Enough attempts that a job handed out again and again is never dead-lettered.
MAX_ATTEMPTS = 1000
#: The event kinds a ledger holds, as the judge reads them.
ENQUEUED, ENQUEUE_FAILED = "enqueued", "enqueue-failed"
#: A worker executes a job as soon as it claimed it: "executed" is the claim and its effect.
EXECUTED, COMPLETED, STALE = "executed", "completed", "stale"
CALL_FAILED = "call-failed"


@dataclass
class Ledger:
    """What the queue told its callers, in order, with times in seconds after ``started``."""

    started: float
    clock: Callable[[], float] = time.monotonic
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, event: str, key: str | None = None, **fields: Any) -> None:
        entry = {"at_s": round(self.clock() - self.started, 6), "event": event, "key": key}
        with self._lock:
            self.events.append(entry | fields)

    def count(self, event: str) -> int:
        with self._lock:
            return sum(1 for entry in self.events if entry["event"] == event)

    def write(self, path: Path) -> None:
        with self._lock:
            lines = [json.dumps(entry, sort_keys=True) for entry in self.events]
        path.write_text("".join(f"{line}\n" for line in lines))


def read_ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


@dataclass
class Load:
    """The run's threads; ``start`` them, ``stop`` them (bounded), then read ``ledger``."""

    open_client: Callable[[], QueueClient]
    keys: Sequence[str]
    workers: int
    rate_per_s: float
    lease_us: int
    ledger: Ledger
    stopping: threading.Event = field(default_factory=threading.Event)
    submitted_all: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    #: Threads that ended on an error the load does not expect (their last words).
    crashed: list[str] = field(default_factory=list)
    #: Whether each thread opens its client anew after a call that raised (``Reopening``).
    reopen: bool = False

    def start(self) -> None:
        bodies: list[tuple[str, Callable[[Calls], None]]] = [("producer", self._produce)]
        bodies += [(f"worker-{n}", self._worker(f"worker-{n}")) for n in range(self.workers)]
        bodies.append(("sweeper", self._sweep))
        for name, body in bodies:
            thread = threading.Thread(target=self._guarded, args=(name, body), name=name)
            self.threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float) -> list[str]:
        """Ask every thread to end and wait (bounded); the names of those still running."""
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in self.threads if thread.is_alive()]

    def _guarded(self, name: str, body: Callable[[Calls], None]) -> None:
        try:
            client: Calls = Reopening(self.open_client) if self.reopen else self.open_client()
        except CrashQueueLabError as error:
            self.crashed.append(f"{name}: could not open the queue: {_error(error)}")
            return
        try:
            body(client)
        except Exception as error:  # a thread's end is reported, never lost
            self.crashed.append(f"{name}: {_error(error)}")
        finally:
            client.close()

    def _produce(self, client: Calls) -> None:
        interval = 1.0 / self.rate_per_s
        due = time.monotonic()
        for value, key in enumerate(self.keys):
            while not self.stopping.is_set():
                try:
                    client.submit(JobSpec(key, "synthetic.effect", {"value": value}, MAX_ATTEMPTS))
                except Exception as error:  # a library's own errors too: the caller told failure
                    self.ledger.note(ENQUEUE_FAILED, key, error=_error(error))
                    self.stopping.wait(IDLE_S)  # a server being failed over is not hammered
                    continue
                self.ledger.note(ENQUEUED, key)
                break
            # A producer held up (a failover) goes on at its rate, never in a burst.
            due = max(due + interval, time.monotonic())
            self.stopping.wait(max(0.0, due - time.monotonic()))
            if self.stopping.is_set():
                return
        self.submitted_all.set()

    def _worker(self, worker_id: str) -> Callable[[Calls], None]:
        def work(client: Calls) -> None:
            while not self.stopping.is_set():
                try:
                    claim = client.claim(worker_id, self.lease_us)
                except Exception as error:  # a library's own errors too: the caller told failure
                    self.ledger.note(CALL_FAILED, None, call="claim", error=_error(error))
                    self.stopping.wait(IDLE_S)
                    continue
                if claim is None:
                    self.stopping.wait(IDLE_S)
                    continue
                fields = {"worker": worker_id, "attempt": claim.attempt, "token": claim.token}
                self.ledger.note(EXECUTED, claim.key, **fields)
                try:
                    verdict = client.succeed(claim)
                except Exception as error:  # a library's own errors too: the caller told failure
                    self.ledger.note(CALL_FAILED, claim.key, call="succeed", error=_error(error))
                    continue
                done = verdict is Verdict.SUCCEEDED
                self.ledger.note(COMPLETED if done else STALE, claim.key, **fields)

        return work

    def _sweep(self, client: Calls) -> None:
        while not self.stopping.wait(SWEEP_EVERY_S):
            try:
                client.recover()
            except Exception as error:  # a library's own errors too: the caller told failure
                self.ledger.note(CALL_FAILED, None, call="recover", error=_error(error))
