"""The deploy experiment: what a queue does when its workers are stopped the way every
process manager stops them, SIGTERM, a grace period, then SIGKILL.

Each worker process runs the library's own worker (``System.own_worker``: its worker loop
and its own signal handlers) or, for a system without one, the lab's own worker
(``labworker``). The lab only sends signals and records (``fleet``): every signal with its
time, each worker's exit, the jobs a SIGKILLed worker held. Producers submit through the
system's own client throughout the run (``plan.submissions``). Once the last deploy's grace
period ended, the run waits, at most its recovery bound (the system's lease or retry timer
and its recovery time, or what the run is told), for every job to have run to completion;
then it stops the workers, reads the store with the system's independent reader and judges
(``judge``); each finding is classified against what the library documents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.errors import InvalidInput, SystemUnavailable
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.findings import Kind, texts, to_json
from crashqueuelab.lab.deploys.fleet import Fleet, Worker
from crashqueuelab.lab.deploys.judge import (
    WorkerFate,
    fates_of_held,
    judge,
    judge_scheduled,
    with_fates,
    with_restart_facts,
)
from crashqueuelab.lab.deploys.labworker import DUE_FIELD, lab_worker
from crashqueuelab.lab.deploys.plan import (
    DeployPlan,
    Scheduled,
    Step,
    after_stops,
    due_tolerance,
    durations,
    job_keys,
    schedule,
    scheduled_jobs,
    server_fault_times,
    submissions,
)
from crashqueuelab.lab.deploys.rollout import MAX_ATTEMPTS, Rollout
from crashqueuelab.lab.deploys.serverfaults import fault_kinds, restart_failed, server_faults
from crashqueuelab.lab.deploys.serverrestarts import RESTART_WAIT_S, ServerRestarts
from crashqueuelab.lab.deploys.workers import DeployWorkerSpec
from crashqueuelab.lab.runs.executions import (
    DeathWatch,
    Execution,
    read_acknowledgements,
)
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.kinds import DEPLOYS
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.reopening import Calls, Reopening
from crashqueuelab.systems.contract import JobSpec, OpenRequest, OwnWorker, QueueClient, System
from crashqueuelab.systems.registry import resolve_system

DEPLOYS_FILE = DEPLOYS.record
#: The lab's own worker's lease, where the system heartbeats.
DEFAULT_LEASE_S = 1.0
#: A library's own worker hands out a dead worker's job after its own timer, which the lab
#: does not set: the recovery bound allows this much for it unless told otherwise
#: (pgqueuer's documented heartbeat timeout is 30 s).
OWN_WORKER_TIMER_S = 30.0
#: Beyond the timer, every job's work and the system's recovery time, the bound allows
#: this much for each job's hand-out (pgq run under a concurrency limit of 1 frees the slot
#: only once the last job's completion is logged: about 3 s a job on 1.0.x, measured), and
#: this margin.
HAND_OUT_S = 3.0
RECOVERY_MARGIN_S = 5.0
#: How long a worker process may take to start serving (imports, connection).
STARTUP_S = 60.0
_RETRY = RetryPolicy(base_delay_us=10_000, max_delay_us=200_000)


def _worker_of(system: System, lease_s: float) -> tuple[OwnWorker, bool]:
    """The worker each process runs (as the process will build it), and whether it is the
    lab's own."""
    if system.own_worker is not None:
        return system.own_worker, False
    if system.capabilities.single_owner:
        raise SystemUnavailable(
            system.name,
            "one process owns its store and its workers live inside it: the lab's deploy"
            " stops worker processes, and this system has no own_worker of its own",
        )
    return lab_worker(system, Path("ledger"), lease_s), True


def _headline(
    system: System, plan: DeployPlan, jobs: dict[str, dict[str, Any]], record: dict[str, Any]
) -> str:
    not_done = [f for f in record["findings"] if f["kind"] == "lost_in_deploy"]
    waiting = sum(1 for finding in not_done if finding["facts"].get("waiting"))
    lost = len(not_done) - waiting
    left = f" ({waiting} more not done, still waiting in the store)" if waiting else ""
    # Jobs, not findings: a job may run again more than once.
    twice = len({f["job"] for f in record["findings"] if f["kind"] == "ran_twice"})
    killed = sum(1 for worker in record["workers"] if worker["killed_s"] is not None)
    stopped = sum(1 for worker in record["workers"] if worker["stop_s"] is not None)
    shape = (
        f"{plan.deploys} rolling deploy(s) and {plan.fleet_restarts} fleet restart(s) of"
        f" {plan.workers} worker(s), {plan.signal.value}, grace {plan.grace_s:g} s"
    )
    if plan.failovers:
        waits = [f["wait_s"]["max"] for f in record["failovers"]["failovers"] if f["wait_s"]]
        baseline = record["failovers"]["before_the_first"]["wait_s"]
        before = "none submitted" if baseline is None else f"{baseline['max']:g} s"
        shape += (
            f"; {plan.failovers} failover(s) of its PostgreSQL server, after which"
            f" {len(record['restarted_after_exit'])} worker(s) exited and were restarted and"
            f" a job waited at most {max(waits, default=0.0):g} s for a worker (before the"
            f" first: {before})"
        )
    if "server_restarts" in record:
        done = record["server_restarts"]["restarts"]
        downs = [r["down_s"] for r in done if r["down_s"] is not None]
        shape += (
            f"; {len(done)} crash(es) of {record['server_restarts']['server']}, each started"
            f" again on what it kept (down at most {max(downs, default=0.0):g} s);"
            f" {len(record['restarted_after_exit'])} worker exit(s) before any signal, each"
            " followed by a restart"
        )
    if record["error"]:
        return f"{system.version}: not judged: {record['error']['type']}"
    timed = record["scheduled"]["jobs"]
    verdicts = [job["verdict"] for job in timed.values()]
    on_schedule = (
        f" {verdicts.count('on time')} of {len(timed)} scheduled jobs ran once on time"
        f" ({sum('early' in v for v in verdicts)} early,"
        f" {sum('late' in v for v in verdicts)} late, {sum('never' in v for v in verdicts)}"
        f" never, {sum('twice' in v for v in verdicts)} twice);"
        if timed
        else ""
    )
    return (
        f"{system.version}: {lost} of {len(jobs)} jobs lost{left}, {twice} ran twice;"
        f"{on_schedule}"
        f" {killed} of {stopped} stopped workers SIGKILLed at the end of the grace;"
        f" {shape}"
    )


def _recovery_bound(
    system: System, labs: bool, lease_s: float, work: dict[str, float], given: float | None
) -> tuple[float, str]:
    """How long the run waits, after the last stop, for every job to run to completion,
    and what that is made of."""
    if given is not None:
        return given, "given by the run"
    timer = lease_s if labs else OWN_WORKER_TIMER_S
    total = round(sum(work.values()), 3)
    hand_outs = len(work) * (lease_s if labs else HAND_OUT_S)
    bound = timer + total + hand_outs + system.recovery_s + RECOVERY_MARGIN_S
    basis = (
        f"timer {timer:g} s ({'the lab worker lease' if labs else 'a library timer'})"
        f" + every job's work {total:g} s and {hand_outs:g} s for its hand-outs (a queue"
        f" may run them one at a time) + the system's recovery {system.recovery_s:g} s"
        f" + {RECOVERY_MARGIN_S:g} s"
    )
    return bound, basis


def _worker_json(worker: Worker, origin: float) -> dict[str, Any]:
    """A worker's record; where its library tells when it takes jobs, ``ready_s`` (None:
    it never said so)."""
    record = worker.to_json()
    if worker.tells_ready:
        at = worker.ready_at()
        record["ready_s"] = None if at is None else round(at - origin, 3)
    return record


def _executions(run: Rollout, origin: float) -> list[Execution]:
    """Every ledger's executions, on the run's clock."""
    return [
        Execution(
            r.key,
            r.worker,
            r.start_s - origin,
            None if r.end_s is None else r.end_s - origin,
            pid=r.pid,
            how=r.how,
            why=r.why,
            alive_until=None if r.alive_until is None else r.alive_until - origin,
            received_s=None if r.received_s is None else r.received_s - origin,
        )
        for r in run.executions()
    ]


def _clients(system: System, store: Path, *, failing_over: bool) -> tuple[QueueClient, Calls]:
    """The run's client (for scheduled jobs), and its producer's: across a failover one
    that opens its client anew after a call that raised."""
    request = OpenRequest(store, SystemClock(), RandomIds(), _RETRY)
    client = system.open(request)
    return client, Reopening(lambda: system.open(request)) if failing_over else client


def _close_run(
    restarts: ServerRestarts | None,
    fleet: Fleet,
    clients: tuple[QueueClient, Calls],
    sleep: Callable[[float], None],
) -> None:
    """The run's end, also on failure: a server restart under way ends first (the workers
    stop against a served server), then every worker stops (also when that wait is
    interrupted), then the clients close."""
    try:
        if restarts is not None:
            restarts.wait(RESTART_WAIT_S)
    finally:
        fleet.close(sleep)
        for each in {id(client): client for client in clients}.values():
            each.close()


def _worker_failed(run: Rollout) -> dict[str, str] | None:
    """The run's error when a worker could not run (what each such worker said), or its
    server did not start again after a restart."""
    restart_failed(run)
    if not run.failed:
        return None
    if "server" in run.failed:
        return {"type": "ServerFailed", "message": run.failed["server"]}
    told = "; ".join(f"{name}: {message}" for name, message in run.failed.items())
    return {"type": "WorkerFailed", "message": told}


def _fates(fleet: Fleet, labs: bool) -> dict[str, WorkerFate]:
    """What the deploy did to each worker. A worker the end of the run stopped is not part
    of the deploy (its stop is the lab's cleanup, after every job ran or the bound passed):
    only the exit of one that exited by itself is kept."""
    return {
        w.name: WorkerFate(
            w.name,
            w.stop_s,
            w.killed_s if w.stop_s is not None else None,
            w.exit_s if w.stop_s is not None or w.killed_s is None else None,
            tuple(w.held_when_killed) if w.stop_s is not None else (),
            acknowledges_in_ledger=labs,
            crashed=w.exit_s is not None and not w.signals,
        )
        for w in fleet.workers
    }


def _check(
    plan: DeployPlan,
    lease_s: float | None,
    recovery_wait_s: float | None,
    fail_over: Callable[..., dict[str, Any]] | None = None,
    restart_server: Callable[[], None] | None = None,
) -> None:
    plan.check()
    if lease_s is not None and not lease_s > 0:
        raise InvalidInput("lease_s", "must be a positive number of seconds")
    if recovery_wait_s is not None and not recovery_wait_s >= 0:
        raise InvalidInput("recovery_wait_s", "must be 0 or more seconds")
    if plan.failovers and fail_over is None:
        raise InvalidInput(
            "failovers",
            "needs a primary and a standby this run started: a system on PostgreSQL, run"
            " without --dsn",
        )
    if plan.server_restarts and restart_server is None:
        raise InvalidInput(
            "server_restarts",
            "needs a server this run started: a system on Redis, RabbitMQ or PostgreSQL,"
            " run without --dsn and without a RabbitMQ node the environment names (as a"
            " versions matrix names its own to each release)",
        )


def _lease(system: System, given: float | None, longest: float) -> float:
    """The lab's own worker's lease: as given, else ``DEFAULT_LEASE_S`` where the system
    heartbeats and, where it does not, longer than the longest job."""
    if given is not None:
        return given
    return DEFAULT_LEASE_S if system.capabilities.heartbeats else longest + DEFAULT_LEASE_S


def _planned_jobs(
    jobs: dict[str, dict[str, Any]],
    work: dict[str, float],
    plan: DeployPlan,
    submitted: dict[str, float],
) -> None:
    """Each job's summary, with what the plan gave it and when it was submitted."""
    for key, job in jobs.items():
        job |= {
            "work_s": work[key],
            "long": work[key] > plan.grace_s,
            "submitted_s": None if key not in submitted else round(submitted[key], 3),
        }


@dataclass(frozen=True)
class _Prepared:
    """What a run works out before anything starts."""

    keys: list[str]
    work: dict[str, float]
    lease_s: float
    worker: OwnWorker
    labs: bool
    bound: float
    basis: str
    tolerance: float
    tolerance_basis: str
    steps: list[Step]
    later: list[Scheduled]
    planned: list[tuple[float, str]]
    #: By step: the jobs submitted right after its signals, each with how long after.
    after_stops: dict[int, list[tuple[float, str]]]


def _prepare(
    system: System, plan: DeployPlan, lease_s: float | None, recovery_wait_s: float | None
) -> _Prepared:
    keys = job_keys(plan.jobs)
    work = durations(keys, plan)
    lease = _lease(system, lease_s, max(work.values()))
    worker, labs = _worker_of(system, lease)
    _check_scheduling(system, plan, worker, labs)
    bound, basis = _recovery_bound(system, labs, lease, work, recovery_wait_s)
    tolerance, tolerance_basis = due_tolerance(plan, work)
    if plan.scheduled and recovery_wait_s is None:
        bound, basis = _with_tolerance(bound, basis, tolerance)
    steps = schedule(plan)
    later, planned, after = _submissions(plan, keys, steps)
    return _Prepared(
        keys, work, lease, worker, labs, bound, basis, tolerance, tolerance_basis, steps,
        later, planned, after,
    )  # fmt: skip


def _check_scheduling(system: System, plan: DeployPlan, worker: OwnWorker, labs: bool) -> None:
    if plan.scheduled and not labs and worker.schedule is None:
        raise SystemUnavailable(
            system.name, "its own worker has no scheduling call: --scheduled needs one"
        )


def _with_tolerance(bound: float, basis: str, tolerance: float) -> tuple[float, str]:
    """The recovery bound, with the time a scheduled job due at the end of the last grace
    may start after it."""
    return bound + tolerance, f"{basis} + the scheduled jobs' due tolerance {tolerance:g} s"


def _submissions(
    plan: DeployPlan, keys: Sequence[str], steps: Sequence[Step]
) -> tuple[list[Scheduled], list[tuple[float, str]], dict[int, list[tuple[float, str]]]]:
    """The scheduled jobs; when every other job is submitted, in order, but for those
    submitted right after a stop's signals, given by step (``after_stops``)."""
    later = scheduled_jobs(keys, steps, plan)
    due = {job.key for job in later}
    left, after = after_stops([key for key in keys if key not in due], steps, plan.submit_at_stops)
    failovers = server_fault_times(plan)
    # Jobs are submitted past the last failover too: those after a promotion show how soon
    # the workers are woken again.
    until = failovers[-1] + plan.interval / 2 if failovers else 0.0
    planned = sorted(
        submissions(left, steps, until, plan.submit_until_s)
        + [(job.submit_s, job.key) for job in later]
    )
    return later, planned, after


def _scheduler(
    worker: OwnWorker, labs: bool, client: QueueClient, store: Path
) -> Callable[[str, float], None]:
    """How a scheduled job is submitted, due at a time since the epoch: the library's own
    scheduling call, or, on the lab's queues, a job whose payload names its due time, held
    by the lab's worker with the queue's retry delay (``labworker.hold_until_due``)."""
    if labs or worker.schedule is None:

        def held(key: str, due_epoch_s: float) -> None:
            client.submit(JobSpec(key, "scheduled", {DUE_FIELD: due_epoch_s}, MAX_ATTEMPTS))

        return held
    own = worker.schedule
    return lambda key, due_epoch_s: own(store.absolute(), key, due_epoch_s)


def _scheduled_record(
    plan: DeployPlan,
    labs: bool,
    tolerance: float,
    basis: str,
    timed: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    verdicts = [job["verdict"] for job in timed.values()]
    return {
        "count": plan.scheduled,
        "through": "the lab's worker: a job claimed before it is due is failed with the"
        " queue's retry delay, to its due time (the lab's queues take no due time at"
        " submission)"
        if labs
        else "the library's own scheduling call (OwnWorker.schedule)",
        "tolerance_s": tolerance,
        "tolerance_basis": basis,
        "on_time": verdicts.count("on time"),
        "jobs": timed,
    }


def run_deploys(
    output_dir: Path,
    *,
    system: str,
    plan: DeployPlan,
    lease_s: float | None = None,
    recovery_wait_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    fail_over: Callable[..., dict[str, Any]] | None = None,
    restart_server: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run ``plan`` against ``system``; the record, also written to ``deploys.json``.
    ``fail_over`` fails the system's server over (the plan's ``failovers`` need it);
    ``restart_server`` crashes it and starts it again (its ``server_restarts`` do)."""
    resolved = resolve_system(system)
    _check(plan, lease_s, recovery_wait_s, fail_over, restart_server)
    ready = _prepare(resolved, plan, lease_s, recovery_wait_s)
    keys, work, lease_s, worker, labs = (
        ready.keys,
        ready.work,
        ready.lease_s,
        ready.worker,
        ready.labs,
    )
    bound, basis, steps, later = ready.bound, ready.basis, ready.steps, ready.later
    due = {job.key: job.due_s for job in later}
    prepare_output_directory(output_dir)
    store = output_dir / "store"
    store.mkdir()
    inherited = Inherited.capture()

    def spec_for(name: str, ledger: Path) -> DeployWorkerSpec:
        return DeployWorkerSpec(system, str(store), name, str(ledger), work, lease_s, inherited)

    origin = now()
    # Read right after the run's clock: a due time on the run's clock is this plus it on
    # the wall clock a library schedules by (judge.CLOCK_SLACK_S).
    wall_origin = time.time()

    def clock() -> float:
        return now() - origin

    if progress is not None:
        progress(f"deploys {resolved.name}: {len(steps)} stops of {plan.workers} workers")
    faulted = fail_over is not None or (restart_server is not None and plan.server_restarts > 0)
    client, producer = _clients(resolved, store, failing_over=faulted)
    fleet = Fleet(output_dir, spec_for, clock, tells_ready=worker.tells_ready)
    scheduler = _scheduler(worker, labs, client, store)
    restarts = (
        ServerRestarts(restart_server, server_fault_times(plan), clock)
        if restart_server is not None and plan.server_restarts
        else None
    )
    run = Rollout(
        plan, fleet, steps, ready.planned, producer, clock, scheduler, due, wall_origin,
        DeathWatch(now), STARTUP_S, fail_over,
        server_fault_times(plan) if plan.failovers else (), restarts, ready.after_stops,
        work, now,
    )  # fmt: skip
    try:
        recovered_at, last_stop_end = run.drive(keys, bound, sleep)
    finally:
        _close_run(restarts, fleet, (client, producer), sleep)
    finished = clock()
    error = _worker_failed(run)
    judged_fates = _fates(fleet, labs)
    executions = with_fates(_executions(run, origin), judged_fates)
    acks = {
        w.name: [(key, at - origin) for key, at in read_acknowledgements(w.ledger.read_text())]
        for w in fleet.workers
        if w.ledger.is_file()
    }
    restarted = [(r["at_s"], r["back_at_s"]) for r in restarts.done] if restarts is not None else []
    reading = read_store(resolved, store, keys)
    reader_failed = [p for p in reading.problems if p.startswith("the reader raised")]
    if error is None and reader_failed:
        error = {"type": "ReaderFailed", "message": reader_failed[0]}
    anomalies, jobs = judge(
        keys,
        executions,
        judged_fates,
        acks,
        reading.jobs,
        plan.signal.value,
        set(due),
        max_attempts=MAX_ATTEMPTS,
        restarts=restarted,
    )
    again = {
        f.job
        for f in anomalies
        if f.job and f.kind in (Kind.RAN_TWICE, Kind.RAN_BESIDE_LIVE_HOLDER)
    }
    first_stop = steps[0].at_s if steps else 0.0
    on_schedule, timed = judge_scheduled(later, executions, ready.tolerance, first_stop, again)
    anomalies = with_restart_facts(anomalies + on_schedule, run.submitted, restarted)
    _planned_jobs(jobs, work, plan, run.submitted)
    # What a restart took back of the jobs in the store when it began is the server's
    # persistence's to explain (``with_restart_facts``).
    promises = (
        None
        if error
        else classify(resolved, "deploys", anomalies, fault_kinds(resolved, restarted))
    )
    workers = [_worker_json(w, origin) for w in fleet.workers]
    record: dict[str, Any] = {
        "ok": not anomalies and error is None,
        "anomalies": texts(anomalies),
        "findings": to_json(anomalies),
        "error": error,
        "system": resolved.describe(),
        "spec": system,
        "worker": {
            "describe": worker.describe,
            "lab_worker": labs,
            "tells_ready": worker.tells_ready,
            "shutdown": dict(worker.shutdown),
            "source": worker.source,
        },
        "plan": plan.to_json(),
        "steps": [step.to_json() for step in steps],
        "skipped": run.skipped,
        "lease_s": lease_s if labs else None,
        "recovery": {
            "wait_s": round(bound, 3),
            "basis": basis,
            "last_stop_end_s": None if last_stop_end is None else round(last_stop_end, 3),
            "every_job_completed_s": None if recovered_at is None else round(recovered_at, 3),
        },
        "workers": workers,
        "held_when_killed": fates_of_held(judged_fates, jobs),
        "executions": [
            run_.to_json(0.0) for run_ in sorted(executions, key=lambda r: (r.start_s, r.worker))
        ],
        "jobs": jobs,
        "scheduled": _scheduled_record(plan, labs, ready.tolerance, ready.tolerance_basis, timed),
        "store": {
            "judge": reading.judge,
            "ok": reading.ok,
            "problems": list(reading.problems),
            "facts": dict(reading.facts),
            "independent": resolved.reader is not None,
        },
        "checks": {
            "acknowledged_twice": "judged from the lab worker's ack lines"
            if labs
            else "not run: the library acknowledges inside its own worker",
        },
        "promises": promises,
        "timings": {"run_s": round(finished, 3)},
    }
    record |= server_faults(resolved, plan, run, executions, ready.planned)
    record["headline"] = _headline(resolved, plan, jobs, record)
    write_json(output_dir / DEPLOYS_FILE, record)
    return record
