"""A chaos run's deployed workers, each watched through its grace period.

A deploy (``lab/faults/deploy.py``) sends SIGTERM to a batch of workers and hands each one
here. At every look of the supervisor (``settle``), a worker that exited did so by itself,
within its grace: its exit code is recorded (0: it finished and acknowledged the batch in
hand and took no new one, as the chaos worker's shutdown says, ``processes.py``). A worker
still there at the end of its grace is SIGKILLed, every process of its session; once it is
reaped, its log (complete: its lines survive the kill) says the leases it held and the
acknowledgements it had sent and not heard answered:
the verdict later says what became of each of those jobs (``verdict.judge_deploys``).

Times are seconds into the run, on the clock the run passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from crashqueuelab.lab.chaos.worklog import WorkerLog
from crashqueuelab.lab.faults.delivery import Record
from crashqueuelab.lab.faults.signals import is_started

#: How long a SIGKILLed worker is waited for before the run moves on.
REAP_S = 10.0


@dataclass
class Stopping:
    """One SIGTERMed worker: its slot, its process and what the record says of it."""

    slot: int
    worker_id: str
    process: Any
    stopped: Record


def held_keys(log: WorkerLog | None) -> tuple[list[str], list[str]]:
    """The keys a worker's log shows it held (claimed, acknowledgement not begun) and those
    whose acknowledgement it sent and never heard answered."""
    if log is None:
        return [], []
    unanswered = set(log.acking) - set(log.acks) - set(log.stale)
    return sorted({key for key, _ in log.held()}), sorted({key for key, _ in unanswered})


class Stops:
    """The SIGTERMed workers of a run still being watched; ``clock`` is the run's clock and
    ``kill_session`` SIGKILLs every process of a worker's session (the pids it found)."""

    def __init__(
        self, clock: Callable[[], float], kill_session: Callable[[int], list[int]]
    ) -> None:
        self.clock = clock
        self.kill_session = kill_session
        self.watching: dict[str, Stopping] = {}

    def hold(self, slot: int, worker_id: str, process: Any, stopped: Record) -> None:
        self.watching[worker_id] = Stopping(slot, worker_id, process, stopped)

    def worker_ids(self) -> list[str]:
        return list(self.watching)

    def in_slot(self, slot: int, worker_id: str) -> bool:
        """Whether ``worker_id``, the process in ``slot``, is being stopped (its replacement
        waits for it)."""
        return worker_id in self.watching and self.watching[worker_id].slot == slot

    def __iter__(self) -> Iterator[Stopping]:
        return iter(list(self.watching.values()))

    def settle(
        self, log_of: Callable[[str], WorkerLog | None], *, force: bool = False
    ) -> list[Stopping]:
        """End every watched worker that exited, or whose grace is over (all of them when
        ``force``: the run ends); the ones ended."""
        ended = []
        for stopping in self:
            stopped = stopping.stopped
            now = self.clock()
            code = stopping.process.exitcode if is_started(stopping.process) else None
            if code is None and now < stopped["grace_end_s"] and not force:
                continue
            if code is None:
                if now < stopped["grace_end_s"]:
                    stopped["cut_short_by_end_of_run"] = True
                self._kill(stopping, now)
                held, unanswered = held_keys(log_of(stopping.worker_id))
                stopped["held_when_killed"] = held
                stopped["unanswered_when_killed"] = unanswered
                code = stopping.process.exitcode
            else:
                stopped["exited_at_s"] = round(now, 6)
                stopped["exited_within_grace"] = True
            stopped["exit_code"] = code
            del self.watching[stopping.worker_id]
            ended.append(stopping)
        return ended

    def _kill(self, stopping: Stopping, now: float) -> None:
        """SIGKILL the worker's session and reap it: its log is then complete (its lines
        survive the kill), and what it held is read after."""
        stopped = stopping.stopped
        stopped["exited_within_grace"] = False
        stopped["killed_at_s"] = round(now, 6)
        stopped["session_when_killed"] = self.kill_session(stopping.process.pid)
        stopping.process.join(timeout=REAP_S)
