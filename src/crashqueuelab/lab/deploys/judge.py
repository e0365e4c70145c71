"""The deploy run's judge, from retained files alone: the workers' ledgers (each
execution's start, end or cut, and the lab's own worker's acknowledgements), what the lab
did to each worker (its stop signal, its SIGKILL, its exit), and the store as the system's
independent reader found it at the end.

Per job: **lost** (no execution ran to completion and the store does not hold it done,
once the run waited its recovery bound), **ran twice** (run again after an execution that
ran to completion; one the lab's SIGKILL cut is the at-least-once redelivery of every
leased queue, no finding, and so is one whose work ended but whose worker was SIGKILLed
before the lab's own worker could acknowledge it), **ran beside a live holder**,
**acknowledged twice** (the lab's own worker's ``ack`` lines; a library's own worker
acknowledges inside itself, so that check does not run for it and the record says so).
An execution the **library's own guard** ended (``cut``: an exception raised into the work
past a timeout; or ``killed`` under a worker the lab had not stopped, as RQ kills its work
horse) is an attempt of its job, as in a heartbeat run: the job may run again, within its
attempts (``max_attempts``: more is ``attempt_beyond_limit``), and a job the store holds
dead once every execution was ended before completion, one at least by the guard, was
given up within its attempts: a terminal state, not lost.
A **scheduled** job (``judge_scheduled``) must also start, the first time, not before it is
due and at most the run's tolerance after: **early** or **late** otherwise, and one that never
started is lost as above (its finding says it was scheduled). The start is the one the
worker's ledger holds, never the lab's guess.
Per worker the record says whether it exited within its grace period and what became of
the jobs it held when SIGKILLed; a worker SIGKILLed with nothing in hand is no finding by
itself (no contract says how fast an idle worker exits): whatever it took with it shows
as a job lost or run twice.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.deploys.plan import Scheduled
from crashqueuelab.lab.runs.executions import (
    ABANDONED,
    CUT,
    ENDED,
    KILLED,
    Execution,
    beyond_its_attempts,
)
from crashqueuelab.systems.contract import JobStatus, StoredJob

#: An execution that ended this little before a server restart began may not have had its
#: acknowledgement reach the server (a library's own worker sends it after the work
#: returns, where the lab cannot see it): the restart's connection loss may send it back.
ACK_IN_FLIGHT_S = 1.0


@dataclass(frozen=True)
class WorkerFate:
    """What the lab did to one worker and how it ended (seconds on the run's clock)."""

    name: str
    stop_s: float | None = None
    killed_s: float | None = None
    exit_s: float | None = None
    held_when_killed: tuple[str, ...] = ()
    #: Whether it ran the lab's own worker (which writes ``ack`` lines).
    acknowledges_in_ledger: bool = False
    #: Whether it exited before the lab sent it any signal (its own error).
    crashed: bool = False


def with_fates(executions: Sequence[Execution], fates: Mapping[str, WorkerFate]) -> list[Execution]:
    """The executions, each one still open when its worker was SIGKILLed marked
    ``killed`` at that moment, and each still open when its worker exited by itself marked
    ``abandoned``."""
    marked = []
    for run in executions:
        fate = fates.get(run.worker)
        marked_run = run
        if run.end_s is None and fate is not None:
            if fate.killed_s is not None and run.start_s <= fate.killed_s:
                killed = fate.killed_s
                marked_run = replace(run, end_s=killed, how=KILLED, alive_until=killed)
            elif fate.exit_s is not None:
                marked_run = replace(run, end_s=fate.exit_s, how=ABANDONED)
        marked.append(marked_run)
    return marked


def _at(run: Execution) -> str:
    end = "still running" if run.end_s is None else f"to {run.end_s:.2f} s ({run.how})"
    return f"by {run.worker} from {run.start_s:.2f} s {end}"


def _worker_then(run: Execution, fate: WorkerFate | None) -> str:
    """How the worker of ``run`` ended: SIGKILLed, exited after a stop signal, exited with
    no signal (``crashed``: its own error, such as a lost connection in a run that fails
    its server over), or not at all."""
    if fate is not None and fate.killed_s is not None:
        return "sigkilled"
    if fate is not None and fate.exit_s is not None:
        return "crashed" if fate.crashed else "exited"
    return "alive"


def _acknowledged(
    run: Execution,
    fate: WorkerFate | None,
    acks: Mapping[str, Sequence[tuple[str, float]]],
    runs: Sequence[Execution],
) -> str:
    """Whether the lab's worker acknowledged ``run`` (an ``ack`` line after its end). A
    worker that ran the job again acknowledges each run before it starts the next: an ack
    after its next run of the job began is that run's, not this one's."""
    if fate is None or not fate.acknowledges_in_ledger:
        return "unknown"
    assert run.end_s is not None
    later = [
        other.start_s
        for other in runs
        if other.worker == run.worker and other.start_s >= run.end_s and other is not run
    ]
    until = min(later, default=float("inf"))
    times = [at for _, at in acks.get(run.worker, ())]
    return "yes" if any(run.end_s <= at < until for at in times) else "no"


#: One server restart: when it began and when the server served again (None: never).
Restart = tuple[float, float | None]


def _across(run: Execution, restarts: Sequence[Restart]) -> dict[str, bool]:
    """In a run that restarted its server: whether ``run`` was under way while a restart
    had the server down (from its beginning to its return), its acknowledgement perhaps
    not yet sent if it ended less than ``ACK_IN_FLIGHT_S`` before, so that the lost
    connection may send it back; and, where the library tells when its worker received
    the job, whether it received it before a restart began and started it after
    (``received_before_server_restart``: said, never an explanation, since a delivery held
    unstarted across a broker's crash and run afterwards is a stale one)."""
    if not restarts:
        return {}
    ended = run.end_s if run.end_s is not None else float("inf")
    across = any(
        run.start_s <= (at if back is None else back) and ended >= at - ACK_IN_FLIGHT_S
        for at, back in restarts
    )
    facts = {"across_server_restart": across}
    if run.received_s is not None:
        facts["received_before_server_restart"] = any(
            run.received_s < at <= run.start_s for at, _ in restarts
        )
    return facts


def _received_from_stop(run: Execution, fate: WorkerFate | None) -> dict[str, int]:
    """Where the library tells when its worker received the job and the lab stopped that
    worker: how many milliseconds after the stop signal it received it (negative: before).
    A job taken in the instant a warm shutdown began is where a library may leave it
    unacknowledged."""
    if run.received_s is None or fate is None or fate.stop_s is None:
        return {}
    return {"received_from_stop_ms": round((run.received_s - fate.stop_s) * 1000)}


def with_restart_facts(
    anomalies: Sequence[Anomaly], submitted: Mapping[str, float], restarts: Sequence[Restart]
) -> list[Anomaly]:
    """In a run that restarted its server, each finding of a job says whether the job was in
    the store when a restart began (``before_server_restart``): what a restart takes back
    can only be such a job's (``runs.promises``)."""
    if not restarts:
        return list(anomalies)
    last = max(at for at, _ in restarts)
    return [
        replace(
            finding,
            facts={
                **finding.facts,
                "before_server_restart": submitted.get(finding.job, float("inf")) < last,
            },
        )
        if finding.job is not None
        else finding
        for finding in anomalies
    ]


def _again(
    key: str,
    runs: Sequence[Execution],
    fates: Mapping[str, WorkerFate],
    acks: Mapping[str, Sequence[tuple[str, float]]],
    restarts: Sequence[Restart] = (),
) -> tuple[list[Anomaly], int]:
    """The findings of a job's later executions, and how many were redeliveries.
    ``restarts``: the run's server restarts."""
    anomalies, redelivered = [], 0
    for index, again in enumerate(runs[1:], 1):
        beside = [run for run in runs[:index] if run.overlaps(again)]
        if beside:
            holder = beside[-1]
            fate = fates.get(holder.worker)
            stopping = fate is not None and fate.stop_s is not None and fate.stop_s <= again.start_s
            anomalies.append(
                Anomaly(
                    Kind.RAN_BESIDE_LIVE_HOLDER,
                    f"job {key}: ran beside a live holder: {_at(holder)}, then {_at(again)}",
                    job=key,
                    facts={
                        "holder": holder.worker,
                        "holder_stopping": stopping,
                        **_across(holder, restarts),
                    },
                )
            )
            continue
        first = runs[index - 1]
        if first.how != ENDED:
            redelivered += 1  # its execution was cut: the job runs again, at least once
            continue
        key_acks = {
            worker: [entry for entry in entries if entry[0] == key]
            for worker, entries in acks.items()
        }
        fate = fates.get(first.worker)
        then = _worker_then(first, fate)
        acknowledged = _acknowledged(first, fate, key_acks, runs)
        if acknowledged == "no":
            # Its work ended and its acknowledgement never was (its worker killed first, or
            # the queue told it failure, as across a failover): the job runs again.
            redelivered += 1
            continue
        anomalies.append(
            Anomaly(
                Kind.RAN_TWICE,
                f"job {key}: ran again after an execution that ran to completion:"
                f" {_at(first)} (its worker then {then}, acknowledged: {acknowledged}),"
                f" then {_at(again)}",
                job=key,
                facts={
                    "times": len(runs),
                    "worker_then": then,
                    "acknowledged": acknowledged,
                    **_across(first, restarts),
                    **_received_from_stop(first, fate),
                },
            )
        )
    return anomalies, redelivered


def by_its_guard(run: Execution, fates: Mapping[str, WorkerFate]) -> bool:
    """Whether the library's own guard ended ``run``: cut, or killed while its worker was
    neither SIGKILLed by the lab nor yet (a killed execution the lab's SIGKILL ended ends
    at that SIGKILL)."""
    if run.how == CUT:
        return True
    if run.how != KILLED or run.end_s is None:
        return False
    fate = fates.get(run.worker)
    return fate is None or fate.killed_s is None or run.end_s < fate.killed_s


def judge(
    keys: Sequence[str],
    executions: Sequence[Execution],
    fates: Mapping[str, WorkerFate],
    acks: Mapping[str, Sequence[tuple[str, float]]],
    stored: Mapping[str, StoredJob] | None,
    signal: str,
    scheduled: Collection[str] = (),
    max_attempts: int | None = None,
    restarts: Sequence[Restart] = (),
) -> tuple[list[Anomaly], dict[str, dict[str, Any]]]:
    """The findings of a deploy run, and each job's summary. ``executions`` have their
    fates marked (``with_fates``) and the library's guard's kills (``with_deaths``);
    ``acks`` are the ``ack`` lines by worker; ``stored`` the reader's jobs (None: the
    system has no reader); ``max_attempts`` each job's attempts; ``restarts`` the run's
    server restarts, each when it began and when the server was back."""
    anomalies: list[Anomaly] = []
    jobs: dict[str, dict[str, Any]] = {}
    for key in keys:
        runs = sorted((run for run in executions if run.key == key), key=lambda r: r.start_s)
        found, redelivered = _again(key, runs, fates, acks, restarts)
        anomalies += found
        guarded = sum(1 for run in runs if by_its_guard(run, fates))
        beyond = beyond_its_attempts(key, len(runs), guarded, max_attempts)
        if beyond is not None:
            anomalies.append(beyond)
        times = sum(1 for entries in acks.values() for entry in entries if entry[0] == key)
        if times > 1:
            anomalies.append(
                Anomaly(
                    Kind.ACKNOWLEDGED_TWICE,
                    f"job {key}: acknowledged {times} times (each answered succeeded)",
                    job=key,
                    facts={"times": times},
                )
            )
        completed = sum(1 for run in runs if run.how == ENDED and run.end_s is not None)
        job = None if stored is None else stored.get(key)
        done = job is not None and job.status is JobStatus.SUCCEEDED
        state = "not read" if stored is None else "nowhere" if job is None else job.native_state
        # Every attempt ended before completion, by the guard among others, and the store
        # holds the job dead: given up within its attempts, a terminal state.
        given_up = (
            guarded > 0
            and job is not None
            and job.status is JobStatus.DEAD
            and all(run.end_s is not None for run in runs)
        )
        if not completed and not done and not given_up:
            last = runs[-1].how if runs and runs[-1].end_s is not None else "never ran"
            if runs and runs[-1].end_s is None:
                last = "still running"
            # Still waiting to be claimed (now, after a retry delay, or when due) once the
            # run waited its recovery bound: not done, and not gone from the store either,
            # so not counted as lost (a queue whose workers never take it again, pgqueuer
            # #630's, still breaks its promise).
            waiting = job is not None and job.status is JobStatus.PENDING
            said = (
                f"not done: {len(runs)} execution(s), none ran to completion (the last:"
                f" {last}), and the store still holds it {state}, waiting to be claimed,"
                " after the recovery wait"
                if waiting
                else f"lost: {len(runs)} execution(s), none ran to completion"
                f" (the last: {last}), and the store holds it {state}"
            )
            anomalies.append(
                Anomaly(
                    Kind.LOST_IN_DEPLOY,
                    f"job {key}: {said}",
                    job=key,
                    facts={
                        "executions": len(runs),
                        "stored": state,
                        "last_end": last,
                        "signal": signal,
                        "scheduled": key in scheduled,
                        "waiting": waiting,
                    },
                )
            )
        elif completed and stored is not None and not done:
            anomalies.append(
                Anomaly(
                    Kind.UNFINISHED,
                    f"job {key}: ran to completion, and the store holds it {state}",
                    job=key,
                    facts={"state": state, "ran": True},
                )
            )
        jobs[key] = {
            "runs": len(runs),
            "completed": completed,
            "cut": sum(1 for run in runs if run.how in (KILLED, ABANDONED, CUT)),
            "ended_by_its_guard": guarded,
            "redelivered": redelivered,
            "acknowledged": times,
            "stored": None if stored is None else state,
            "status": None if job is None else job.status.value,
        }
    return anomalies, jobs


#: The run's clock (each ledger's starts) and the wall clock a library schedules by are
#: read one after the other when the run starts: a start this close before its due time
#: is not early.
CLOCK_SLACK_S = 0.005


def judge_scheduled(
    planned: Sequence[Scheduled],
    executions: Sequence[Execution],
    tolerance_s: float,
    first_stop_s: float,
    twice: Collection[str],
) -> tuple[list[Anomaly], dict[str, dict[str, Any]]]:
    """The findings of the scheduled jobs, and each one's summary: its due time beside its
    executions' starts, and its verdict (``on time``, or what went wrong: ``never``,
    ``early``, ``late``, ``twice``). ``twice``: the keys the deploy's judge found run twice
    or beside a live holder (the first start alone is held to the due time; a redelivery
    after a cut starts when the cut allows)."""
    anomalies: list[Anomaly] = []
    summaries: dict[str, dict[str, Any]] = {}
    for job in planned:
        starts = sorted(run.start_s for run in executions if run.key == job.key)
        submitted = "before" if job.submit_s < first_stop_s else "during"
        facts: dict[str, str | int | bool] = {"window": job.window, "submitted": submitted}
        wrong = []
        if not starts:
            wrong.append("never")
        elif starts[0] < job.due_s - CLOCK_SLACK_S:
            early = starts[0] - job.due_s
            wrong.append("early")
            anomalies.append(
                Anomaly(
                    Kind.SCHEDULED_EARLY,
                    f"job {job.key}: started {-early:.3f} s before it was due: due at"
                    f" {job.due_s:.3f} s ({job.window}), started at {starts[0]:.3f} s",
                    job=job.key,
                    facts={"early_ms": round(-early * 1000)} | facts,
                )
            )
        elif starts[0] > job.due_s + tolerance_s:
            late = starts[0] - job.due_s
            wrong.append("late")
            anomalies.append(
                Anomaly(
                    Kind.SCHEDULED_LATE,
                    f"job {job.key}: started {late:.3f} s after it was due, past the"
                    f" tolerance of {tolerance_s:g} s: due at {job.due_s:.3f} s"
                    f" ({job.window}), started at {starts[0]:.3f} s",
                    job=job.key,
                    facts={"late_ms": round(late * 1000), "tolerance_ms": round(tolerance_s * 1000)}
                    | facts,
                )
            )
        if job.key in twice:
            wrong.append("twice")
        summaries[job.key] = job.to_json() | {
            "submitted": submitted,
            "starts_s": [round(start, 3) for start in starts],
            "first_start_after_due_s": None if not starts else round(starts[0] - job.due_s, 3),
            "verdict": ", ".join(wrong) or "on time",
        }
    return anomalies, summaries


def fates_of_held(
    fates: Mapping[str, WorkerFate], jobs: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, str]]:
    """What became of each job a SIGKILLed worker held, by worker."""
    told = {}
    for name, fate in fates.items():
        if fate.held_when_killed:
            told[name] = {
                key: (
                    "ran again to completion"
                    if jobs[key]["completed"]
                    else f"lost (the store holds it {jobs[key]['stored']})"
                )
                for key in fate.held_when_killed
                if key in jobs
            }
    return told
