"""The heartbeat experiment: does a live worker keep the job it is running?

A library that hands a job out again when its holder has not sent a heartbeat for a while
(pgqueuer's retry timer) promises, in the same breath, that a holder which is alive and
heartbeating keeps its job. Users have reported the opposite (pgqueuer #430: heartbeats
sent too rarely for the retry timer, a live worker's job run a second time). The lab's own
worker cannot show it: it heartbeats on its own schedule through the adapter. Here the
library's own worker loop (``System.library_worker``) runs in each worker process, with its
own heartbeat task and buffers, on jobs whose work lasts several retry timers; no process
is killed, stopped, or cut off from the server.

Each execution's start and end are logged by the handler, one line each, in its worker's
ledger (``workers.py``). Every job must run exactly once (``judge.py``): a second execution,
beside the first or after it, happened while every worker was alive, so the library handed
out a job its live holder was running. The store's reading (the system's independent
reader) must hold each job done.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.errors import InvalidInput, SystemUnavailable
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.findings import Anomaly, texts, to_json
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import NetworkPlan
from crashqueuelab.lab.heartbeats.faults import (
    STRIKE_AFTER_TIMERS,
    HeartbeatFaults,
    Held,
    Running,
)
from crashqueuelab.lab.heartbeats.judge import (
    CUT,
    KILLED,
    Death,
    Execution,
    judge,
    read_ledgers,
    with_deaths,
)
from crashqueuelab.lab.heartbeats.pauses import PausesThenStops
from crashqueuelab.lab.heartbeats.upgrade import (
    Before,
    accounted,
    leftovers,
    library_logs,
    load_before,
    next_keys,
    not_exercised,
    problems,
    take_over,
)
from crashqueuelab.lab.heartbeats.workers import (
    STACKS_SIGNAL,
    WorkerSpec,
    drop_empty_stacks,
    failures,
    worker_main,
)
from crashqueuelab.lab.runs.executions import DeathWatch
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import forkserver_context, start_owned
from crashqueuelab.lab.runs.kinds import HEARTBEATS
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.systems.contract import JobSpec, JobStatus, OpenRequest, StoreReading, System
from crashqueuelab.systems.registry import resolve_system

HEARTBEATS_FILE = HEARTBEATS.record
DEFAULT_JOBS = 4
DEFAULT_WORKERS = 2
#: How long each job's work lasts, in the library's retry timers.
DEFAULT_WORK_TIMERS = 4.0
#: After the last job ended, the workers keep polling this many retry timers, so that a
#: job handed out again at the very end is seen.
GRACE_TIMERS = 2.0
#: How long a worker process may take to start its loop (imports, connection).
STARTUP_S = 60.0
#: How long a worker process may take to stop once asked (its loop waits for running work).
STOP_S = 30.0
#: How long a worker that did not stop has to write its threads' stacks before it is killed.
STACKS_WAIT_S = 2.0
_RETRY = RetryPolicy(base_delay_us=10_000, max_delay_us=200_000)
_POLL_S = 0.1
#: Past the system's ``recovery_s``, before its recovery runs at the end of an upgrade.
RECOVERY_MARGIN_S = 0.5
#: Each job's attempts: a library whose own guard ends its executions may retry it so often.
MAX_ATTEMPTS = 3


def _submit(system: System, store: Path, keys: Sequence[str]) -> None:
    client = system.open(OpenRequest(store, SystemClock(), RandomIds(), _RETRY))
    try:
        client.submit_many([JobSpec(key, "work", {}, max_attempts=MAX_ATTEMPTS) for key in keys])
    finally:
        client.close()


def _recover(system: System, store: Path, sleep: Callable[[float], None] = time.sleep) -> None:
    """The library's own recovery once the workers stopped: after ``recovery_s`` (dramatiq:
    a stopped worker's heartbeat is then older than the timeout), ``recover``."""
    sleep(system.recovery_s + RECOVERY_MARGIN_S)
    client = system.open(OpenRequest(store, SystemClock(), RandomIds(), _RETRY))
    try:
        client.recover()
    finally:
        client.close()


def _read_at_the_end(
    system: System, store: Path, before: Before | None, left: Sequence[str]
) -> tuple[StoreReading | None, dict[str, Any] | None, list[Anomaly]]:
    """The store's reading once the workers stopped; after an upgrade, read once the
    library's recovery ran, with the upgrade's accounting and what the store still holds
    that no lab job explains, when the run before left something (else None and none)."""
    if before is None:
        return _reading(system, store), None, []
    _recover(system, store)
    reading = _reading(system, store)
    accounting = accounted(before, left, problems(reading))
    return reading, accounting, leftovers(before, accounting) if left else []


def _reading(system: System, store: Path) -> StoreReading | None:
    return None if system.reader is None else system.reader(store.absolute())


def _stored(reading: StoreReading | None) -> dict[str, JobStatus] | None:
    return None if reading is None else {key: job.status for key, job in reading.jobs.items()}


def _on_the_store_before(
    system: System, store: Path, before: Before | None, jobs: int
) -> tuple[list[str], list[str]]:
    """This run's jobs, and what the run ``before`` it left in the store (read before this
    run's jobs are submitted; nothing when there is no run before)."""
    if before is None:
        return [f"job-{index:02d}" for index in range(jobs)], []
    take_over(before, store)
    return next_keys(before, jobs), problems(_reading(system, store))


def _every_job_ended(keys: Sequence[str], executions: Sequence[Execution]) -> bool:
    ended = {run.key for run in executions if run.end_s is not None}
    running = any(run.end_s is None for run in executions)
    return not running and all(key in ended for key in keys)


@dataclass(frozen=True)
class _Worked:
    """How the workers' part of a run ended."""

    exits: dict[str, int | None]
    #: When every job had ended (None: the work did not end).
    all_ended_at: float | None
    held: dict[str, list[Held]]
    network: dict[str, Any] | None
    #: The executions whose process died under a live worker (the library's own guard).
    deaths: dict[tuple[str, str, float], Death]
    pauses: dict[str, Any] | None = None


@dataclass(frozen=True)
class _Plan:
    system: str
    store: Path
    keys: list[str]
    ledgers: dict[str, Path]
    work_s: float
    retry_after_s: float
    grace_s: float
    deadline: float


def run_heartbeats(
    output_dir: Path,
    *,
    system: str,
    jobs: int = DEFAULT_JOBS,
    workers: int = DEFAULT_WORKERS,
    work_timers: float = DEFAULT_WORK_TIMERS,
    retry_after_s: float | None = None,
    network: NetworkPlan | None = None,
    strike_after_timers: float = STRIKE_AFTER_TIMERS,
    pauses_then_stops: int = 0,
    after: Path | None = None,
    progress: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run ``jobs`` jobs of ``work_timers`` retry timers each on ``workers`` processes of
    the library's own worker loop (its retry timer ``retry_after_s``, by default the
    library worker's), with the ``network`` faults (``faults.py``), each striking once a job
    has worked ``strike_after_timers`` retry timers, and ``pauses_then_stops`` pauses of a
    worker followed by its stop (``pauses.py``), on the store the heartbeat run in ``after``
    left when one is named (``upgrade.py``); the record, also written to
    ``heartbeats.json``."""
    resolved = resolve_system(system)
    loop = resolved.library_worker
    if loop is None:
        raise SystemUnavailable(
            system,
            "the heartbeat experiment runs the system's own worker loop, and this system"
            " declares none (System.library_worker; pgqueuer's and dramatiq's are shipped)",
        )
    timer = loop.retry_after_s if retry_after_s is None else retry_after_s
    if not timer > 0:
        raise InvalidInput("retry_timer_s", "must be a positive number of seconds")
    network = network or NetworkPlan()
    network.check()
    if not strike_after_timers >= 0:
        raise InvalidInput("network_fault_after_timers", "must be a number of timers >= 0")
    if network.active and resolved.server != "postgres":
        raise InvalidInput("network", f"{resolved.name} talks to no server: nothing to fault")
    before = None if after is None else load_before(after, resolved)
    prepare_output_directory(output_dir)
    store = output_dir / "store"
    store.mkdir()
    keys, left = _on_the_store_before(resolved, store, before, jobs)
    _submit(resolved, store, keys)
    work_s = work_timers * timer
    origin = now()
    plan = _Plan(
        system=system,
        store=store,
        keys=keys,
        ledgers={f"worker-{slot}": output_dir / f"worker-{slot}.ledger" for slot in range(workers)},
        work_s=work_s,
        retry_after_s=timer,
        grace_s=GRACE_TIMERS * timer,
        deadline=origin + STARTUP_S + jobs * work_s,
    )
    if progress is not None:
        progress(f"heartbeats {resolved.name}: {jobs} jobs of {work_s:g} s on {workers} workers")
    pauses = (
        PausesThenStops(
            pauses_then_stops, retry_after_s=timer, strike_after_timers=strike_after_timers
        )
        if pauses_then_stops
        else None
    )
    worked = _work(plan, network, strike_after_timers, origin, now, pauses)
    drop_empty_stacks(plan.ledgers)
    failed = failures(plan.ledgers, worked.exits)
    finished = now()
    executions = with_deaths(read_ledgers(plan.ledgers), worked.deaths)
    reading, accounting, kept = _read_at_the_end(resolved, store, before, left)
    stored = _stored(reading)
    anomalies = judge(keys, executions, stored, origin, worked.held, MAX_ATTEMPTS) + kept
    error = None
    if before is not None and not left:
        error = not_exercised(before)
    elif failed:
        told = "; ".join(f"{worker}: {message}" for worker, message in failed.items())
        error = {"type": "WorkerFailed", "message": told}
    elif worked.all_ended_at is None:
        error = {
            "type": "Unfinished",
            "message": f"the work did not end within {plan.deadline - origin:.0f} s",
        }
    delivered = [] if worked.network is None else worked.network["delivered"]
    faults_seen = sorted({FaultKind(entry["kind"]).value for entry in delivered})
    promises = None if error else classify(resolved, "live workers", anomalies, faults_seen)
    record = {
        "ok": not anomalies and error is None,
        "anomalies": texts(anomalies),
        "findings": to_json(anomalies),
        "error": error,
        "system": resolved.describe(),
        "spec": system,
        "library_worker": loop.describe,
        "parameters": {
            "jobs": jobs,
            "workers": workers,
            "work_timers": work_timers,
            "retry_after_s": timer,
            "work_s": work_s,
            "grace_s": plan.grace_s,
        },
        "network": worked.network,
        "pauses": worked.pauses,
        "executions": [run.to_json(origin) for run in sorted(executions, key=lambda r: r.start_s)],
        "jobs": {
            key: {
                "runs": sum(1 for run in executions if run.key == key),
                "ended_by_the_library": sum(
                    1 for run in executions if run.key == key and run.how in (CUT, KILLED)
                ),
                "stored": None if stored is None or key not in stored else stored[key].value,
            }
            for key in keys
        },
        "workers": {
            worker: {"exit": code, "failed": failed.get(worker)}
            for worker, code in worked.exits.items()
        },
        "promises": promises,
        "store_problems": problems(reading),
        "library_logs": library_logs(store),
        "upgrade": accounting,
        "timings": {"run_s": round(finished - origin, 3)},
    }
    write_json(output_dir / HEARTBEATS_FILE, record)
    return record


def _work(
    plan: _Plan,
    network: NetworkPlan,
    strike_after_timers: float,
    origin: float,
    now: Callable[[], float],
    pauses: PausesThenStops | None = None,
) -> _Worked:
    """Start the workers (behind the fault proxy when there are network faults), strike
    the faults as jobs work, wait for every job to end and the grace after it, stop them."""
    context = forkserver_context(())
    all_ended_at: float | None = None
    deaths = DeathWatch(time.monotonic)
    with ExitStack() as stack:
        faults = (
            stack.enter_context(
                HeartbeatFaults(
                    network,
                    retry_after_s=plan.retry_after_s,
                    started=origin,
                    strike_after_timers=strike_after_timers,
                )
            )
            if network.active
            else None
        )
        processes = {
            worker: context.Process(
                target=worker_main,
                args=(
                    WorkerSpec(
                        plan.system,
                        str(plan.store),
                        worker,
                        str(ledger),
                        plan.work_s,
                        plan.retry_after_s,
                        Inherited.capture() if faults is None else faults.inherited(worker),
                    ),
                ),
                daemon=True,
            )
            for worker, ledger in plan.ledgers.items()
        }
        try:
            for process in processes.values():
                start_owned(process)
            while now() < plan.deadline:
                stopped = set() if pauses is None else pauses.stopped
                if any(
                    process.exitcode is not None and worker not in stopped
                    for worker, process in processes.items()
                ):
                    break  # a worker's loop ended by itself: the run cannot go on as planned
                executions = read_ledgers(plan.ledgers)
                deaths.watch(executions, {w: p.pid for w, p in processes.items()})
                executions = with_deaths(executions, deaths.deaths)
                running = [
                    Running(run.worker, run.start_s) for run in executions if run.end_s is None
                ]
                if faults is not None:
                    faults.strike_due(running)
                if pauses is not None:
                    pauses.strike_due(running, {w: p.pid for w, p in processes.items()})
                if _every_job_ended(plan.keys, executions):
                    all_ended_at = all_ended_at or now()
                    if now() - all_ended_at >= plan.grace_s:
                        break
                else:
                    all_ended_at = None
                time.sleep(_POLL_S)
        finally:
            if pauses is not None:
                pauses.thaw()
            exits = _stop(processes, plan.work_s)
        held = {} if faults is None else faults.held()
        for worker, windows in ({} if pauses is None else pauses.windows).items():
            held.setdefault(worker, []).extend(windows)
        return _Worked(
            exits=exits,
            all_ended_at=all_ended_at,
            held=held,
            network=None if faults is None else faults.report(),
            deaths=deaths.deaths,
            pauses=None if pauses is None else pauses.report(origin),
        )


def _stop(processes: Mapping[str, Any], work_s: float) -> dict[str, int | None]:
    """Ask every worker to stop (SIGTERM: its loop ends after its running work, at most
    ``work_s``), then have what is still there ``STOP_S`` later write its threads' stacks
    and kill it; each worker's exit code."""
    for process in processes.values():
        if process.exitcode is None and process.pid is not None:
            process.terminate()
    ends = time.monotonic() + work_s + STOP_S
    for process in processes.values():
        if process.pid is None:
            continue  # never started: the run was interrupted while it started the others
        process.join(max(0.0, ends - time.monotonic()))
        if process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # it exited since the join
                os.kill(process.pid, STACKS_SIGNAL)
            process.join(STACKS_WAIT_S)
        if process.exitcode is None:
            process.kill()
            process.join(5.0)
    codes = {worker: process.exitcode for worker, process in processes.items()}
    for process in processes.values():
        process.close()
    return codes
