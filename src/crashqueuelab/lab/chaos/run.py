"""A chaos run from end to end, for any system: submit the jobs, start the workers,
deliver the faults, judge the run and write its record (``chaos.json``).

``run_chaos`` is the entry point. ``plan.py`` refuses what a run could not deliver and
schedules the faults, ``fleet.py`` holds the run's processes, ``drive.py`` delivers the
faults as the work progresses, ``accounting.py`` and ``verdict.py`` judge, ``record.py``
assembles the record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.lab.chaos.accounting import judge_run
from crashqueuelab.lab.chaos.drive import run_workers
from crashqueuelab.lab.chaos.fleet import ChaosRun
from crashqueuelab.lab.chaos.longjobs import DEFAULT_LONG_JOBS, long_indexes, long_payload
from crashqueuelab.lab.chaos.plan import planned_faults, runnable
from crashqueuelab.lab.chaos.poison import DEFAULT_POISON_JOBS, PoisonJob, poison_jobs
from crashqueuelab.lab.chaos.powercuts import PowerSupply
from crashqueuelab.lab.chaos.processes import RunFiles, open_client
from crashqueuelab.lab.chaos.record import chaos_record
from crashqueuelab.lab.chaos.verdict import judge_deploys, judge_pauses
from crashqueuelab.lab.chaos.worklog import read_logs
from crashqueuelab.lab.faults.deploy import Rollout
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import NetworkPlan, RunNetwork, run_server
from crashqueuelab.lab.runs.kinds import CHAOS
from crashqueuelab.lab.runs.modes import POWER_LOSS, PROCESS
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.systemcalls import calling
from crashqueuelab.lab.workloads.effects import Destination, EffectLedger
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY
from crashqueuelab.systems.contract import JobSpec
from crashqueuelab.systems.registry import DEFAULT_SYSTEM

CHAOS_FILE = CHAOS.record


def run_chaos(
    output_dir: Path,
    *,
    seed: int,
    jobs: int,
    workers: int,
    kills: int,
    pauses: int = 0,
    lease_ms: int = 500,
    batch: int = 4,
    deadline_s: float = 600.0,
    system: str = DEFAULT_SYSTEM,
    crash_mode: str = PROCESS,
    power_cuts: int = 0,
    server_restarts: int = 0,
    session_kills: int = 0,
    restart_server: Callable[[], None] | None = None,
    failovers: int = 0,
    fail_over: Callable[[], dict[str, Any]] | None = None,
    held_commits: int = 0,
    hold_commits: Callable[[], dict[str, Any]] | None = None,
    progress: Progress | None = None,
    poison_count: int = DEFAULT_POISON_JOBS,
    long_count: int = DEFAULT_LONG_JOBS,
    schedule: Sequence[Mapping[str, Any]] | None = None,
    replay_of: str | None = None,
    network: NetworkPlan | None = None,
    deploys: int = 0,
    rollout: Rollout | None = None,
) -> dict[str, Any]:
    """Run one chaos experiment into ``output_dir`` (new or empty) and return its report.

    ``restart_server`` crashes and restarts the system's server (the run's own throwaway
    server); server restarts need it. ``fail_over`` fails a replicated server the run started
    over to its standby; ``failovers`` need it. ``hold_commits`` holds the COMMITs made on
    that server open while every client connection is reset; ``held_commits`` need it.
    ``schedule`` (a run's recorded one) is delivered instead of the seed's; its faults must
    be the ones the counts name. ``network`` puts a fault proxy between the processes and the
    server (systems behind a server only).
    ``deploys`` SIGTERM a batch of workers each, stopped as ``rollout`` says (its grace,
    surge and replacement; the defaults when None).
    """
    network = network or NetworkPlan()
    counts = {
        FaultKind.KILL: kills,
        FaultKind.PAUSE: pauses,
        FaultKind.POWER_CUT: power_cuts,
        FaultKind.SERVER_RESTART: server_restarts,
        FaultKind.SESSION_KILL: session_kills,
        FaultKind.DEPLOY: deploys,
    } | network.counts()
    if failovers:
        # Only a run that asks for them plans them: every other seed's schedule is unchanged.
        counts[FaultKind.FAILOVER] = failovers
    if held_commits:
        counts[FaultKind.HELD_COMMITS] = held_commits
    rollout = rollout or Rollout()
    chosen = runnable(
        system, crash_mode, counts, jobs=jobs, workers=workers, network=network,
        restart_server=restart_server, rollout=rollout, fail_over=fail_over,
        hold_commits=hold_commits,
    )  # fmt: skip
    planned = planned_faults(schedule, seed=seed, jobs=jobs, workers=workers, counts=counts)
    schedule_record = [fault.to_json() for fault in planned]
    prepare_output_directory(output_dir)
    files = RunFiles(
        store=str(output_dir / STORE_DIRECTORY),
        effects=str(output_dir / "effects-idempotent.sqlite"),
        executions=str(output_dir / "executions-non-idempotent.sqlite"),
    )
    notes = []
    if chosen.capabilities.single_owner and workers != 1:
        notes.append(
            f"{chosen.name} has a single owner: one owner process runs the claim, effect and "
            f"acknowledgement loop (and its own maintenance) instead of {workers} workers; "
            "the faults hit the owner"
        )
        workers = 1
    power = None
    if crash_mode == POWER_LOSS:
        power = PowerSupply(output_dir, Path(files.store), seed)
        power.start()
    try:
        # Enough attempts that a job killed again and again is never dead-lettered.
        poison = poison_jobs(poison_count)
        # Only a system with heartbeats can keep a lease past its length.
        long_jobs = long_indexes(jobs, long_count if chosen.capabilities.heartbeats else 0)
        keys = _submit(system, files, jobs, 1000, poison, long_jobs)
        pending = planned
        run = ChaosRun(
            output_dir,
            files,
            system=(system, chosen),
            lease_ms=lease_ms,
            batch=batch,
            workers=workers,
            rollout=rollout if deploys else None,
        )
        run.power = power
        run.restart_server = restart_server
        run.fail_over = fail_over
        run.hold_commits = hold_commits
        run.poison_keys = {job.key for job in poison}
        with contextlib.ExitStack() as proxied:
            if network.active:
                run.network = proxied.enter_context(
                    RunNetwork(
                        network,
                        # A broker beside the server (RabbitMQ) carries the jobs: its
                        # connections are the ones faulted, the results' server's are not.
                        server=run_server(chosen.broker or chosen.server),
                        lease_ms=lease_ms,
                        started=run.state.started,
                    )
                )
            finished_in_time = run_workers(
                run,
                pending,
                jobs=jobs,
                deadline_s=deadline_s,
                progress=labelled(progress, f"chaos {system} ({crash_mode})"),
                described={"system": chosen.describe(), "crash_mode": crash_mode},
            )
        store = Path(files.store) if power is None else power.finish()
    finally:
        if power is not None:
            power.stop()
    started = run.state.started
    # Faults planned after the last job finished would only have hit idle workers.
    run.state.delivered.extend(
        {"index": fault.index, "kind": fault.kind.value, "skipped": "no work left"}
        for fault in pending
    )
    elapsed = time.monotonic() - started
    pause_anomalies = judge_pauses(run.state.delivered, run.logs)
    accounting = judge_run(
        system=chosen,
        store=store,
        effects=Path(files.effects),
        executions=Path(files.executions),
        keys=keys,
        poison=poison,
        log_dir=run.logs,
        lease_s=lease_ms / 1000,
        started_s=started,
    )
    deployed = judge_deploys(run.state.delivered, read_logs(run.logs), accounting)
    report = chaos_record(
        run,
        system=system,
        chosen=chosen,
        seed=seed,
        crash_mode=crash_mode,
        notes=notes,
        jobs=jobs,
        workers=workers,
        kills=kills,
        pauses=pauses,
        power_cuts=power_cuts,
        server_restarts=server_restarts,
        failovers=failovers,
        held_commits=held_commits,
        session_kills=session_kills,
        deploys=(deploys, rollout, deployed),
        network=network,
        poison_count=poison_count,
        long_jobs=long_jobs,
        lease_ms=lease_ms,
        batch=batch,
        counts=counts,
        accounting=accounting,
        pause_anomalies=pause_anomalies,
        finished_in_time=finished_in_time,
        schedule_record=schedule_record,
        replay_of=replay_of,
        store=store,
        output_dir=output_dir,
        elapsed=elapsed,
    )
    write_json(output_dir / CHAOS_FILE, report)
    return report


def _submit(
    system: str,
    files: RunFiles,
    jobs: int,
    max_attempts: int,
    poison: list[PoisonJob],
    long_jobs: set[int],
) -> list[str]:
    keys = [f"chaos-{index:06d}" for index in range(jobs)]
    with calling(system, "open"):
        client = open_client(system, files.store)
    try:
        with calling(system, "submit_many"):
            for start in range(0, jobs, 500):
                client.submit_many(
                    [
                        JobSpec(
                            key=key,
                            job_type="synthetic.effect",
                            payload={
                                "effect_key": key,
                                "value": start + offset,
                                **(long_payload() if start + offset in long_jobs else {}),
                            },
                            max_attempts=max_attempts,
                        )
                        for offset, key in enumerate(keys[start : start + 500])
                    ]
                )
            if poison:
                client.submit_many([job.spec() for job in poison])
    finally:
        client.close()
    for path, destination in (
        (files.effects, Destination.IDEMPOTENT),
        (files.executions, Destination.NON_IDEMPOTENT),
    ):
        EffectLedger(path, destination=destination).close()
    return keys
