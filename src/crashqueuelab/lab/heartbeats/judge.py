"""The heartbeat run's verdict: the executions each worker's ledger holds (``start KEY T``
and ``end KEY T`` lines), and the judge, which names every job run more than once, never
run, or not held done by the store, and says of a job handed out again whether a network
fault held its holder's connection at the time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.lab.heartbeats.faults import Held
from crashqueuelab.systems.contract import JobStatus


@dataclass(frozen=True)
class Execution:
    """One run of one job's work by one worker, on the machine's monotonic clock."""

    key: str
    worker: str
    start_s: float
    end_s: float | None

    def overlaps(self, other: Execution) -> bool:
        ends = self.end_s if self.end_s is not None else float("inf")
        other_ends = other.end_s if other.end_s is not None else float("inf")
        return self.start_s < other_ends and other.start_s < ends

    def to_json(self, origin: float) -> dict[str, Any]:
        return {
            "key": self.key,
            "worker": self.worker,
            "start_s": round(self.start_s - origin, 3),
            "end_s": None if self.end_s is None else round(self.end_s - origin, 3),
        }


def read_ledger(text: str, worker: str) -> list[Execution]:
    """The executions a worker's ledger holds: ``start KEY T`` and ``end KEY T`` lines,
    each end closing the earliest open start of its key. A torn last line is ignored."""
    runs: list[Execution] = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] not in ("start", "end"):
            continue
        what, key, moment = parts
        try:
            at = float(moment)
        except ValueError:
            continue
        if what == "start":
            runs.append(Execution(key, worker, at, None))
            continue
        open_runs = [i for i, run in enumerate(runs) if run.key == key and run.end_s is None]
        if open_runs:
            index = open_runs[0]
            runs[index] = Execution(key, worker, runs[index].start_s, at)
    return runs


def read_ledgers(ledgers: Mapping[str, Path]) -> list[Execution]:
    """Every worker's executions, from the ledgers that exist."""
    return [
        run
        for worker, ledger in ledgers.items()
        if ledger.is_file()
        for run in read_ledger(ledger.read_text(), worker)
    ]


def _when(run: Execution, origin: float) -> str:
    end = "still running" if run.end_s is None else f"to {run.end_s - origin:.2f} s"
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
) -> list[str]:
    """The anomalies of a run in which no worker was killed or stopped: a job run more than
    once (beside its first execution, or after it), a job never run, a job the store does
    not hold done. A job handed out again while a network fault held its holder's
    connection says so (the library saw no heartbeat); any other was handed out again with
    every worker alive and reachable."""
    anomalies = []
    for key in keys:
        runs = sorted((run for run in executions if run.key == key), key=lambda run: run.start_s)
        if not runs:
            anomalies.append(f"job {key}: never run, while every worker was alive and polling")
        for index, again in enumerate(runs[1:], 1):
            # The job was taken from its latest holder: the last one to start before it.
            beside = [run for run in runs[:index] if run.overlaps(again)]
            first = beside[-1] if beside else runs[index - 1]
            how = "beside" if beside else "after"
            window = _holding(first, again, held or {})
            if window is None:
                anomalies.append(
                    f"job {key}: run again {how} a live worker's execution:"
                    f" {_when(first, origin)}, then {_when(again, origin)}; no worker was"
                    " killed, stopped or cut off"
                )
            else:
                anomalies.append(
                    f"job {key}: run again {how} {first.worker}'s execution while a"
                    f" {window.kind} held {first.worker}'s connection"
                    f" ({window.start - origin:.2f} s to {window.end - origin:.2f} s):"
                    f" {_when(first, origin)}, then {_when(again, origin)}"
                )
        if stored is not None and stored.get(key) is not JobStatus.SUCCEEDED:
            found = stored.get(key)
            anomalies.append(
                f"job {key}: the store holds it {'nowhere' if found is None else found.value}"
                " after every execution ended"
            )
    return anomalies
