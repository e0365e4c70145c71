"""The heartbeat run's verdict: the executions each worker's ledger holds (``start KEY T
PID``, ``end KEY T`` and ``cut KEY T WHAT`` lines), and the judge, which names every job run
more than once, never run, or not held done by the store, and says of a job handed out
again whether a network fault held its holder's connection at the time.

An execution ends one of three ways: its work returned (``ended``), something raised inside
it (``cut``: a library that interrupts a job past its own timeout), or the process running it
died while its worker lived on (``killed``: a library that kills the process it runs a job
in, as RQ's work horse; the parent sees the death, ``Death``). A cut or killed execution is
an attempt of its job that the library's own guard ended: the job may then run again, and
must end in a terminal state within its attempts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.heartbeats.faults import Held
from crashqueuelab.systems.contract import JobStatus

#: How an execution ended: its work returned, was interrupted by an exception, or its
#: process died under a live worker.
ENDED, CUT, KILLED = "ended", "cut", "killed"


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
        return record


def read_ledger(text: str, worker: str) -> list[Execution]:
    """The executions a worker's ledger holds: ``start KEY T [PID]``, ``end KEY T`` and
    ``cut KEY T WHAT`` lines, each end or cut closing the earliest open start of its key. A
    torn last line is ignored."""
    runs: list[Execution] = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3 or parts[0] not in ("start", "end", "cut"):
            continue
        what, key, moment = parts[:3]
        try:
            at = float(moment)
            pid = int(parts[3]) if what == "start" and len(parts) == 4 else None
        except ValueError:
            continue
        if what == "start":
            runs.append(Execution(key, worker, at, None, pid=pid))
            continue
        open_runs = [i for i, run in enumerate(runs) if run.key == key and run.end_s is None]
        if open_runs:
            index = open_runs[0]
            why = parts[3] if what == "cut" and len(parts) == 4 else None
            how = CUT if what == "cut" else ENDED
            runs[index] = replace(runs[index], end_s=at, how=how, why=why)
    return runs


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


def _when(run: Execution, origin: float) -> str:
    if run.end_s is None:
        end = "still running"
    elif run.how == KILLED:
        assert run.alive_until is not None
        end = (
            f"killed under its live worker between {run.alive_until - origin:.2f} s and"
            f" {run.end_s - origin:.2f} s"
        )
    elif run.how == CUT:
        end = f"cut at {run.end_s - origin:.2f} s by {run.why}"
    else:
        end = f"to {run.end_s - origin:.2f} s"
    return f"by {run.worker} from {run.start_s - origin:.2f} s {end}"


def _holding(first: Execution, again: Execution, held: Mapping[str, Sequence[Held]]) -> Held | None:
    """The window that held the first holder's connection between its start and the job's
    next hand-out, if one did."""
    return next(
        (
            window
            for window in held.get(first.worker, ())
            if window.start < again.start_s and first.start_s < window.end
        ),
        None,
    )


def judge(
    keys: Sequence[str],
    executions: Sequence[Execution],
    stored: Mapping[str, JobStatus] | None,
    origin: float,
    held: Mapping[str, Sequence[Held]] | None = None,
    max_attempts: int | None = None,
) -> list[Anomaly]:
    """The anomalies of a run in which the lab killed or stopped no worker: a job run more
    than once (beside its first execution, or after it), a job never run, a job the store
    does not hold done. A job handed out again while a network fault held its holder's
    connection says so (the library saw no heartbeat); any other was handed out again with
    every worker alive and reachable. A job run again after the library's own guard ended
    its execution (cut or killed) is a retry, no anomaly; it must then stay within
    ``max_attempts`` and end succeeded, or dead once each of its attempts was ended so."""
    anomalies = []
    for key in keys:
        runs = sorted((run for run in executions if run.key == key), key=lambda run: run.start_s)
        if not runs:
            anomalies.append(
                Anomaly(
                    Kind.NEVER_RUN,
                    f"job {key}: never run, while every worker was alive and polling",
                    job=key,
                )
            )
        guarded = [run for run in runs if run.how in (CUT, KILLED)]
        if guarded and max_attempts is not None and len(runs) > max_attempts:
            anomalies.append(
                Anomaly(
                    Kind.ATTEMPT_BEYOND_LIMIT,
                    f"job {key}: run {len(runs)} times, {len(guarded)} of them ended by the"
                    f" library's own guard; its attempts are {max_attempts}",
                    job=key,
                    attempt=len(runs),
                    limit=max_attempts,
                    facts={"ended_by_its_guard": len(guarded)},
                )
            )
        for index, again in enumerate(runs[1:], 1):
            # The job was taken from its latest holder: the last one to start before it.
            beside = [run for run in runs[:index] if run.overlaps(again)]
            first = beside[-1] if beside else runs[index - 1]
            how = "beside" if beside else "after"
            if not beside and first.how in (CUT, KILLED):
                continue  # the library retried an attempt its own guard ended
            window = _holding(first, again, held or {})
            if window is None:
                text = (
                    f"job {key}: run again {how} a live worker's execution:"
                    f" {_when(first, origin)}, then {_when(again, origin)}; no worker was"
                    " killed, stopped or cut off"
                )
                facts: dict[str, str | bool] = {"how": how, "connection_held": False}
            else:
                text = (
                    f"job {key}: run again {how} {first.worker}'s execution while a"
                    f" {window.kind} held {first.worker}'s connection"
                    f" ({window.start - origin:.2f} s to {window.end - origin:.2f} s):"
                    f" {_when(first, origin)}, then {_when(again, origin)}"
                )
                facts = {"how": how, "connection_held": True, "fault": str(window.kind)}
            anomalies.append(Anomaly(Kind.RUN_AGAIN, text, job=key, facts=facts))
        found = None if stored is None else stored.get(key)
        given_up = found is JobStatus.DEAD and bool(runs) and len(guarded) == len(runs)
        if stored is not None and found is not JobStatus.SUCCEEDED and not given_up:
            status = "nowhere" if found is None else found.value
            anomalies.append(
                Anomaly(
                    Kind.STORE_DIFFERS,
                    f"job {key}: the store holds it {status} after every execution ended",
                    job=key,
                    facts={"told": "ended", "stored": status},
                )
            )
    return anomalies
