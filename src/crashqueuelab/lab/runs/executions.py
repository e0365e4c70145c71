"""What every experiment that runs a job's work in worker processes records of it: each
worker's execution ledger (``start KEY T PID``, ``end KEY T``, ``cut KEY T WHAT``; where the
lab's own worker acknowledges, ``ack KEY T``; where a library's own worker tells when it
received a job from its broker, ``received KEY T``; one ``O_APPEND`` write each), the
executions read back from it, and whether a process still runs.

An execution ends one of four ways: its work returned (``ended``), something raised inside
it (``cut``: a library that interrupts a job past its own timeout), the process running it
died while its worker lived on (``killed``: a library that kills the process it runs a job
in, as RQ's work horse; or the lab's SIGKILL of the worker), or its worker exited while it
ran (``abandoned``: a library that leaves the job in hand when it stops). Times are the
machine's monotonic clock, which every process of a run shares.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind

#: How an execution ended: its work returned, was interrupted by an exception, its process
#: died (under a live worker, or killed by the lab), or its worker exited while it ran.
ENDED, CUT, KILLED, ABANDONED = "ended", "cut", "killed", "abandoned"


@dataclass(frozen=True)
class Death:
    """When the process running an execution was last seen alive and first seen gone."""

    last_alive: float
    first_gone: float


@dataclass(frozen=True)
class Execution:
    """One run of one job's work by one worker, on the machine's monotonic clock."""

    key: str
    worker: str
    start_s: float
    end_s: float | None
    #: The process that ran the work (None in a ledger that does not say).
    pid: int | None = None
    how: str = ENDED
    #: What interrupted a cut execution.
    why: str | None = None
    #: For a killed one: until when it surely ran (``end_s`` is when it was seen gone).
    alive_until: float | None = None
    #: When its worker received the job from the broker, where the library tells (None:
    #: it does not, or no receipt came before this start).
    received_s: float | None = None

    @property
    def surely_until(self) -> float:
        """Until when this execution surely ran (infinity while it runs)."""
        if self.alive_until is not None:
            return self.alive_until
        return self.end_s if self.end_s is not None else float("inf")

    def overlaps(self, other: Execution) -> bool:
        return self.start_s < other.surely_until and other.start_s < self.surely_until

    def to_json(self, origin: float) -> dict[str, Any]:
        record: dict[str, Any] = {
            "key": self.key,
            "worker": self.worker,
            "start_s": round(self.start_s - origin, 3),
            "end_s": None if self.end_s is None else round(self.end_s - origin, 3),
            "how": self.how if self.end_s is not None else "running",
            "pid": self.pid,
        }
        if self.why is not None:
            record["why"] = self.why
        if self.alive_until is not None:
            record["alive_until_s"] = round(self.alive_until - origin, 3)
        if self.received_s is not None:
            record["received_s"] = round(self.received_s - origin, 3)
        return record


def read_ledger(text: str, worker: str) -> list[Execution]:
    """The executions a worker's ledger holds: ``start KEY T [PID]``, ``end KEY T`` and
    ``cut KEY T WHAT`` lines, each end or cut closing the earliest open start of its key. A
    start takes the latest ``received KEY T`` of its key before it, and the earlier ones go
    unused: a receipt never run (a delivery its worker dropped) must not date a later
    start, so where two wait the start is dated by the later one, never too early. A torn
    last line is ignored."""
    runs: list[Execution] = []
    received: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3 or parts[0] not in ("start", "end", "cut", "received"):
            continue
        what, key, moment = parts[:3]
        try:
            at = float(moment)
            pid = int(parts[3]) if what == "start" and len(parts) == 4 else None
        except ValueError:
            continue
        if what == "received":
            received[key] = at
            continue
        if what == "start":
            runs.append(
                Execution(key, worker, at, None, pid=pid, received_s=received.pop(key, None))
            )
            continue
        open_runs = [i for i, run in enumerate(runs) if run.key == key and run.end_s is None]
        if open_runs:
            index = open_runs[0]
            why = parts[3] if what == "cut" and len(parts) == 4 else None
            how = CUT if what == "cut" else ENDED
            runs[index] = replace(runs[index], end_s=at, how=how, why=why)
    return runs


def beyond_its_attempts(key: str, runs: int, guarded: int, limit: int | None) -> Anomaly | None:
    """The finding of a job run ``runs`` times, ``guarded`` of them ended by the library's
    own guard, beyond its ``limit`` of attempts (None: within them, or no guard ended one:
    a job only the lab's faults ran again is judged by what they did)."""
    if not guarded or limit is None or runs <= limit:
        return None
    return Anomaly(
        Kind.ATTEMPT_BEYOND_LIMIT,
        f"job {key}: run {runs} times, {guarded} of them ended by the library's own guard;"
        f" its attempts are {limit}",
        job=key,
        attempt=runs,
        limit=limit,
        facts={"ended_by_its_guard": guarded},
    )


class DeathWatch:
    """The executions whose process died under a live worker (a library's own guard: RQ's
    work horse killed past its job timeout), as the parent polls them on ``now``, the clock
    the ledgers write (the machine's monotonic clock)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.seen_alive: dict[tuple[str, str, float], float] = {}
        self.deaths: dict[tuple[str, str, float], Death] = {}

    def watch(self, executions: Sequence[Execution], workers: Mapping[str, int | None]) -> None:
        """Look at every open execution of the ``workers`` (live ones, by their pids) run in
        a process other than its worker's."""
        at = self.now()
        for run in executions:
            identity = (run.worker, run.key, run.start_s)
            if run.worker not in workers:
                continue
            own = run.pid is None or run.pid == workers[run.worker]
            if run.end_s is not None or own or identity in self.deaths:
                continue
            assert run.pid is not None
            if alive(run.pid):
                self.seen_alive[identity] = at
            else:
                last = self.seen_alive.get(identity, run.start_s)
                self.deaths[identity] = Death(last_alive=last, first_gone=at)


def with_deaths(
    executions: Sequence[Execution], deaths: Mapping[tuple[str, str, float], Death]
) -> list[Execution]:
    """The executions, each open one whose process was seen gone marked ``killed``
    (``deaths`` by worker, key and start)."""
    marked = []
    for run in executions:
        death = deaths.get((run.worker, run.key, run.start_s))
        if run.end_s is None and death is not None:
            killed = replace(run, end_s=death.first_gone, how=KILLED, alive_until=death.last_alive)
            marked.append(killed)
        else:
            marked.append(run)
    return marked


def read_ledgers(ledgers: Mapping[str, Path]) -> list[Execution]:
    """Every worker's executions, from the ledgers that exist."""
    return [
        run
        for worker, ledger in ledgers.items()
        if ledger.is_file()
        for run in read_ledger(ledger.read_text(), worker)
    ]


def read_acknowledgements(text: str) -> list[tuple[str, float]]:
    """The ``ack KEY T`` lines of a ledger (the lab's own worker writes one when the system
    answered its acknowledgement ``succeeded``), in order; torn lines ignored."""
    acks = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != "ack":
            continue
        try:
            acks.append((parts[1], float(parts[2])))
        except ValueError:
            continue
    return acks


def append_line(path: str | Path, line: str) -> None:
    """Append ``line`` with one write on an ``O_APPEND`` file: lines from several threads or
    processes never mix."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # The state follows the command name, which is in parentheses and may hold spaces.
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False
