"""The heartbeat run's verdict: the executions each worker's ledger holds (``start KEY T
PID``, ``end KEY T`` and ``cut KEY T WHAT`` lines), and the judge, which names every job run
more than once, never run, or not held done by the store, and says of a job handed out
again whether a fault (a pause, a network fault) held its holder's connection at the time.

An execution ends one of three ways: its work returned (``ended``), something raised inside
it (``cut``: a library that interrupts a job past its own timeout), or the process running it
died while its worker lived on (``killed``: a library that kills the process it runs a job
in, as RQ's work horse; the parent sees the death, ``Death``). A cut or killed execution is
an attempt of its job that the library's own guard ended: the job may then run again, and
must end in a terminal state within its attempts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.heartbeats.faults import Held
from crashqueuelab.lab.heartbeats.pauses import PAUSE
from crashqueuelab.lab.runs.executions import (
    CUT,
    ENDED,
    KILLED,
    Death,
    Execution,
    beyond_its_attempts,
    read_ledger,
    read_ledgers,
    with_deaths,
)
from crashqueuelab.systems.contract import JobStatus

__all__ = [
    "CUT",
    "ENDED",
    "KILLED",
    "Death",
    "Execution",
    "judge",
    "read_ledger",
    "read_ledgers",
    "with_deaths",
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


def _thawed_first_run(
    thawed: Execution,
    other: Execution,
    runs: Sequence[Execution],
    held: Mapping[str, Sequence[Held]],
) -> Held | None:
    """The pause of ``thawed``'s worker that ``thawed`` is the first run after, if
    ``other``, another worker's run of the job, began after that pause did: a worker that
    had taken the job before it was frozen (a prefetched message, not yet started) looked
    dead to the others, whose maintenance handed the job out again, and it ran its own copy
    as it was thawed, before or after the other's run of it. Pauses only: a paused worker is
    stopped as it is thawed, so its first run after is of what it held; a worker whose
    connection a network fault held goes on taking jobs afterwards."""
    if other.worker == thawed.worker:
        return None
    for window in held.get(thawed.worker, ()):
        if (
            window.kind != PAUSE
            or not window.end <= thawed.start_s
            or other.start_s <= window.start
        ):
            continue
        after = [run for run in runs if run.worker == thawed.worker and run.start_s >= window.end]
        if min(after, key=lambda run: run.start_s) is thawed:
            return window
    return None


def _held_how(worker: str, window: Held) -> str:
    if window.kind == PAUSE:
        return f"{worker} was paused"
    return f"a {window.kind} held {worker}'s connection"


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
    does not hold done. A job handed out again while a fault held its holder's connection
    says so (the library saw no heartbeat), as does one run by a paused worker as its first
    run once thawed while another worker's run of it began after the pause did (the paused
    worker had taken the job before, and the others handed it out again); any other was
    handed out again with every worker alive and reachable. A job run again after the
    library's own guard ended its execution (cut or killed) is a retry, no anomaly; it must
    then stay within ``max_attempts`` and end succeeded, or dead once each of its attempts
    was ended so."""
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
        beyond = beyond_its_attempts(key, len(runs), len(guarded), max_attempts)
        if beyond is not None:
            anomalies.append(beyond)
        for index, again in enumerate(runs[1:], 1):
            # The job was taken from its latest holder: the last one to start before it.
            beside = [run for run in runs[:index] if run.overlaps(again)]
            first = beside[-1] if beside else runs[index - 1]
            how = "beside" if beside else "after"
            if not beside and first.how in (CUT, KILLED):
                continue  # the library retried an attempt its own guard ended
            window = _holding(first, again, held or {})
            later = None if window else _thawed_first_run(again, first, executions, held or {})
            earlier = (
                None if window or later else _thawed_first_run(first, again, executions, held or {})
            )
            facts: dict[str, str | bool] = {"how": how, "connection_held": False}
            if window is not None:
                text = (
                    f"job {key}: run again {how} {first.worker}'s execution while"
                    f" {_held_how(first.worker, window)} ({window.start - origin:.2f} s to"
                    f" {window.end - origin:.2f} s): {_when(first, origin)}, then"
                    f" {_when(again, origin)}"
                )
                facts = {"how": how, "connection_held": True, "fault": str(window.kind)}
            elif later is not None:
                text = (
                    f"job {key}: run again {how} {first.worker}'s execution by {again.worker},"
                    f" handed to {first.worker} while {_held_how(again.worker, later)}"
                    f" ({later.start - origin:.2f} s to {later.end - origin:.2f} s) and run by"
                    f" {again.worker} after: {_when(first, origin)}, then {_when(again, origin)}"
                )
                facts = {
                    "how": how,
                    "connection_held": True,
                    "fault": str(later.kind),
                    "held_runner": "later",
                }
            elif earlier is not None:
                text = (
                    f"job {key}: run again {how} {first.worker}'s execution, its first since"
                    f" {_held_how(first.worker, earlier)} ({earlier.start - origin:.2f} s to"
                    f" {earlier.end - origin:.2f} s), the job handed out again meanwhile:"
                    f" {_when(first, origin)}, then {_when(again, origin)}"
                )
                facts = {
                    "how": how,
                    "connection_held": True,
                    "fault": str(earlier.kind),
                    "held_runner": "first",
                }
            else:
                text = (
                    f"job {key}: run again {how} a live worker's execution:"
                    f" {_when(first, origin)}, then {_when(again, origin)}; no worker was"
                    " killed, stopped or cut off"
                )
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
