"""The chaos supervisor: submit, start, signal, respawn, wait, judge; for any system.

The supervisor itself never touches the store after submitting and never forks while it
holds it open: workers and the maintenance process start from a multiprocessing fork
server (a clean process that has only imported the library), so a respawn costs a fork
instead of a fresh interpreter. It follows progress through the workers' logs, so it works
as well for a system with a single owner, whose store nobody else may open.

Pauses: a SIGSTOPped worker keeps its leases until they expire; where several processes
may work, the maintenance process recovers them and another worker takes the jobs over, and
only then is the paused worker continued. A single owner is continued once its leases have
run out. Either way its late acknowledgements must be refused by the lease fencing.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.validation import require_int
from crashqueuelab.lab.chaos.accounting import judge_run
from crashqueuelab.lab.chaos.longjobs import DEFAULT_LONG_JOBS, long_indexes, long_payload
from crashqueuelab.lab.chaos.poison import DEFAULT_POISON_JOBS, PoisonJob, poison_jobs
from crashqueuelab.lab.chaos.powercuts import PowerSupply
from crashqueuelab.lab.chaos.processes import (
    ERROR_SUFFIX,
    RunFiles,
    WorkerSpec,
    maintenance_main,
    open_client,
    worker_main,
)
from crashqueuelab.lab.chaos.schedule import SPAN, PlannedFault, plan, recorded
from crashqueuelab.lab.chaos.worklog import LOG_SUFFIX, LogFollower, acknowledged_keys, read_logs
from crashqueuelab.lab.faults.children import CLI_MODULE
from crashqueuelab.lab.faults.crashmodes import check_crash_mode
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import (
    MAINTENANCE_PATH,
    WINDOW_OF,
    NetworkPlan,
    RunNetwork,
    run_dsn,
    worker_path,
)
from crashqueuelab.lab.runs.commands import import_path
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import Interrupted, forkserver_context
from crashqueuelab.lab.runs.kinds import CHAOS
from crashqueuelab.lab.runs.modes import POWER_LOSS, PROCESS
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.systemcalls import calling
from crashqueuelab.lab.workloads.effects import Destination, EffectLedger
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY
from crashqueuelab.systems.contract import JobSpec, System
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system

CHAOS_FILE = CHAOS.record
TICK_S = 0.002
#: A paused worker is continued once its jobs were taken over, or after this many lease
#: lengths: its leases were taken before the stop, so by then each is past its deadline and
#: every late acknowledgement must be refused. Soon after the deadline, while the jobs are
#: still being recovered or redone, is when a queue without fencing gives itself away;
#: longer would only stall the workers waiting for a ledger lock the stopped worker holds.
PAUSE_LEASES = 1.2
PROGRESS_EVERY_S = 5.0
#: How often a pause looks for a moment when its worker holds a lease.
PAUSE_TRIES = 250
#: A worker is hit again only after it has lived this long (so kills land on work).
MIN_WORKER_AGE_S = 0.01
#: Workers get this long to notice the end of the work and exit on their own.
DRAIN_S = 10.0
#: A run stops once workers died this often without being killed (the system raised).
MAX_WORKER_FAILURES = 5
#: More worker processes than this would only measure the machine's process table.
MAX_WORKERS = 64


@dataclass
class _Slot:
    index: int
    generation: int = 0
    process: Any = None
    worker_id: str = ""
    started_at: float = 0.0


@dataclass
class _RunState:
    delivered: list[dict[str, Any]] = field(default_factory=list)
    respawns: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: Every worker process started: its id, slot and start (seconds into the run).
    workers: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    #: Why the run stopped waiting before its work was done (None: it did not).
    gave_up: str | None = None
    # slot index -> (the pause's record, the leases it held, when to continue it anyway)
    paused: dict[int, tuple[dict[str, Any], set[tuple[str, str]], float]] = field(
        default_factory=dict
    )


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


class _Watcher(LogFollower):
    """What the workers' logs say: how much is done, and who holds what."""

    def finished(self) -> int:
        """Jobs whose acknowledgement a worker heard accepted."""
        return len(self.acknowledged)

    def progressed(self) -> int:
        """Jobs whose acknowledgement was accepted or sent: what the faults' progress marks
        count. A job acknowledged by a worker killed before it could log the answer is done
        in the store yet absent from ``finished``; counted here, the marks stay reachable
        until the work ends (a refused acknowledgement's job is done later under the same
        key, so nothing counts twice)."""
        return len(self.acknowledged | self.sent)

    def found_no_work(self, worker_ids: Iterable[str]) -> bool:
        """Whether one of these workers found no unfinished job left."""
        return any(
            self.logs[worker_id].idle_at is not None
            for worker_id in worker_ids
            if worker_id in self.logs
        )

    def leases_of(self, worker_id: str) -> set[tuple[str, str]]:
        """(key, lease token) of every lease the worker holds, as far as its log tells."""
        log = self.logs.get(worker_id)
        return set() if log is None else log.held()

    def claimed_by_others(self, worker_id: str, keys: set[str], since: float) -> set[str]:
        """The keys another worker claimed after ``since`` (monotonic seconds)."""
        return {
            key
            for key in keys
            if any(other != worker_id and at > since for other, at in self.claimers.get(key, []))
        }


def _kind_count(records: list[dict[str, Any]], kind: FaultKind) -> int:
    return sum(1 for record in records if record["kind"] == kind.value and "at_s" in record)


class _ChaosRun:
    """One run's processes, schedule and bookkeeping."""

    def __init__(
        self,
        output_dir: Path,
        files: RunFiles,
        *,
        system: tuple[str, System],
        lease_ms: int,
        batch: int,
        workers: int,
    ) -> None:
        self.logs = output_dir / "worker-logs"
        self.logs.mkdir()
        self.spec, self.system = system
        self.single_owner = self.system.capabilities.single_owner
        self.files = files
        self.lease_ms = lease_ms
        self.batch = batch
        # A respawn should cost a fork, not imports: the system's adapter, and the command
        # line, which the ``crashqueuelab`` console script imports again in every child
        # (multiprocessing re-runs a main script in each; ``python -m`` it skips).
        self.context = forkserver_context(
            [CLI_MODULE, "crashqueuelab.lab.chaos.processes", self.system.open.__module__]
        )
        self.stop_file = output_dir / "stop-maintenance"
        self.release_file = output_dir / "faults-delivered"
        self.released = False
        #: How many normal jobs had been acknowledged when that count last moved, and when.
        self.progress_seen: tuple[int, float] | None = None
        #: The poison jobs' keys, which the normal work's progress leaves out.
        self.poison_keys: set[str] = set()
        self.state = _RunState()
        self.slots = [_Slot(index) for index in range(workers)]
        # Replaced workers whose logs have not been read to the end yet.
        self.retired: set[str] = set()
        self.maintenance: Any = None
        #: The power-loss disk under the store, in power-loss mode.
        self.power: PowerSupply | None = None
        #: Crashes and restarts the system's server, where the run started one.
        self.restart_server: Callable[[], None] | None = None
        #: The fault proxy between the processes and the server, where the run has one.
        self.network: RunNetwork | None = None

    def inherited(self, path: str) -> Inherited:
        """What a process on ``path`` must see: through the proxy, where there is one."""
        return Inherited.capture() if self.network is None else self.network.inherited(path)

    def follow(self, watcher: _Watcher) -> None:
        """Read the new lines of the live workers' logs, and the last ones of retired workers."""
        retired, self.retired = self.retired, set()
        watcher.refresh([*retired, *(slot.worker_id for slot in self.slots)])

    def start(self, slot: _Slot) -> None:
        if slot.worker_id:
            self.retired.add(slot.worker_id)
        slot.generation += 1
        slot.worker_id = f"worker-{slot.index}.{slot.generation}"
        log = str(self.logs / f"{slot.worker_id}{LOG_SUFFIX}")
        spec = WorkerSpec(
            self.spec,
            self.files,
            slot.worker_id,
            self.lease_ms * 1000,
            self.batch,
            log,
            does_maintenance=self.single_owner,
            release_file=str(self.release_file),
            inherited=self.inherited(worker_path(slot.index)),
        )
        slot.process = self.context.Process(target=worker_main, args=(spec,), daemon=True)
        slot.process.start()
        slot.started_at = time.monotonic()
        self.state.workers.append(
            {
                "worker_id": slot.worker_id,
                "slot": slot.index,
                "started_at_s": round(slot.started_at - self.state.started, 6),
            }
        )

    def launch(self) -> None:
        self.stop_file.unlink(missing_ok=True)
        if not self.single_owner:
            self.start_maintenance()
        for slot in self.slots:
            self.start(slot)

    def start_maintenance(self) -> None:
        self.maintenance = self.context.Process(
            target=maintenance_main,
            args=(
                self.spec,
                self.files.store,
                str(self.stop_file),
                str(self.release_file),
                self.inherited(MAINTENANCE_PATH),
            ),
            daemon=True,
        )
        self.maintenance.start()

    def respawn_maintenance(self) -> None:
        """Maintenance is never signalled, and ends by itself (status 0) once the work is
        done: one that exited otherwise died of its system's error (its recovery raised).
        Record it, and start it again."""
        process = self.maintenance
        if not _started(process) or process.exitcode in (None, 0) or self.stop_file.exists():
            return
        error_file = Path(f"{self.stop_file}{ERROR_SUFFIX}")
        error = error_file.read_text().strip().splitlines() if error_file.is_file() else []
        self.state.failures.append(
            {
                "worker_id": "maintenance",
                "exit_code": process.exitcode,
                "error": error[-1] if error else "no error recorded",
            }
        )
        if not self.failed():
            self.start_maintenance()

    def target_for(self, planned: int) -> _Slot | None:
        """The planned slot, or the next one round the table if it is paused or too fresh.

        A paused worker is left alone until it is continued, and a worker that has just
        been started gets a moment to reach real work before it is hit again.
        """
        now = time.monotonic()
        for step in range(len(self.slots)):
            slot = self.slots[(planned + step) % len(self.slots)]
            if slot.index not in self.state.paused and now - slot.started_at >= MIN_WORKER_AGE_S:
                return slot
        return None

    def work_done(self) -> bool:
        """A worker that found no work left exits with status 0 by itself."""
        return any(slot.process.exitcode == 0 for slot in self.slots)

    def failed(self) -> bool:
        """Workers keep dying by themselves: the system raises, and respawning cannot help."""
        return len(self.state.failures) >= MAX_WORKER_FAILURES

    def note_exit(self, slot: _Slot) -> None:
        """Record a worker that died without being killed, with its system's error."""
        code = slot.process.exitcode
        if code in (0, -signal.SIGKILL):
            return
        error_file = self.logs / f"{slot.worker_id}{LOG_SUFFIX}{ERROR_SUFFIX}"
        error = error_file.read_text().strip().splitlines() if error_file.is_file() else []
        self.state.failures.append(
            {
                "worker_id": slot.worker_id,
                "exit_code": code,
                "error": error[-1] if error else "no error recorded",
            }
        )

    def respawn_dead(self) -> None:
        self.respawn_maintenance()
        for slot in self.slots:
            if slot.index not in self.state.paused and slot.process.exitcode is not None:
                self.note_exit(slot)
                if self.failed():
                    return
                self.state.respawns += 1
                self.start(slot)

    def continue_paused(self, watcher: _Watcher, *, force: bool) -> None:
        """Continue each paused worker once its leases were taken over (or its time is up).

        A single owner has nobody to take over: it is continued once its leases expired.
        """
        for index, (record, leases, until) in list(self.state.paused.items()):
            worker_id = self.slots[index].worker_id
            held = {key for key, _ in leases}
            # Only a claim made after the stop takes a job over (an earlier one was a
            # previous attempt, before this worker's own claim).
            stopped = self.state.started + record["at_s"]
            taken = watcher.claimed_by_others(worker_id, held, stopped)
            waiting = self.single_owner or taken != held
            if waiting and not force and time.monotonic() < until:
                continue
            record["taken_over"] = bool(held) and taken == held
            _signal(self.slots[index].process, signal.SIGCONT)
            record["continued_at_s"] = round(time.monotonic() - self.state.started, 6)
            del self.state.paused[index]

    def cut_power(self, watcher: _Watcher) -> dict[str, Any]:
        """Every process dies at once, the disk forgets what was not synced, all restart."""
        assert self.power is not None
        processes = [slot.process for slot in self.slots] + [self.maintenance]
        for process in processes:
            if process is not None:
                _signal(process, signal.SIGKILL)
        for process in processes:
            if process is not None:
                process.join(timeout=10)
        for record, _, _ in self.state.paused.values():
            record["ended_by_power_cut"] = True
        self.state.paused.clear()
        self.follow(watcher)  # the dead workers' last lines
        record = self.power.cut()
        self.launch()
        return record

    def release(self) -> None:
        """Every planned fault has landed: workers may now stop once the work is done."""
        if not self.released:
            self.release_file.touch()
            self.released = True

    def so_far(self, jobs: int) -> dict[str, Any]:
        """What an interrupted run had done: the faults that landed, the workers started,
        the jobs the workers' logs say were acknowledged."""
        return {
            "jobs": jobs,
            "jobs_acknowledged": len(acknowledged_keys(read_logs(self.logs))),
            "faults": self.state.delivered,
            "workers_started": self.state.workers,
        }

    def shut_down(self, *, drain: bool = True) -> None:
        """Let workers drain and exit on their own (unless the run was interrupted); stop
        whatever is still running."""
        self.release()
        self.stop_file.touch()
        drained = time.monotonic() + (DRAIN_S if drain else 0.0)
        started = [slot.process for slot in self.slots if _started(slot.process)]
        for process in started:
            process.join(timeout=max(0.0, drained - time.monotonic()))
        for process in started:
            if _signal(process, signal.SIGCONT):
                process.terminate()
                process.join(timeout=10)
        if _started(self.maintenance):
            self.maintenance.join(timeout=10)
            if self.maintenance.exitcode is None:
                self.maintenance.kill()
                self.maintenance.join(timeout=10)


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
    progress: Progress | None = None,
    poison_count: int = DEFAULT_POISON_JOBS,
    long_count: int = DEFAULT_LONG_JOBS,
    schedule: Sequence[Mapping[str, Any]] | None = None,
    replay_of: str | None = None,
    network: NetworkPlan | None = None,
) -> dict[str, Any]:
    """Run one chaos experiment into ``output_dir`` (new or empty) and return its report.

    ``restart_server`` crashes and restarts the system's server (the run's own throwaway
    server); server restarts need it. ``schedule`` (a run's recorded one) is delivered
    instead of the seed's; its faults must be the ones the counts name. ``network`` puts a
    fault proxy between the processes and the server (systems behind a server only).
    """
    network = network or NetworkPlan()
    counts = {
        FaultKind.KILL: kills,
        FaultKind.PAUSE: pauses,
        FaultKind.POWER_CUT: power_cuts,
        FaultKind.SERVER_RESTART: server_restarts,
        FaultKind.SESSION_KILL: session_kills,
    } | network.counts()
    chosen = _runnable(
        system, crash_mode, counts, jobs=jobs, workers=workers, network=network,
        restart_server=restart_server,
    )  # fmt: skip
    planned = _planned(schedule, seed=seed, jobs=jobs, workers=workers, counts=counts)
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
        run = _ChaosRun(
            output_dir,
            files,
            system=(system, chosen),
            lease_ms=lease_ms,
            batch=batch,
            workers=workers,
        )
        run.power = power
        run.restart_server = restart_server
        run.poison_keys = {job.key for job in poison}
        with contextlib.ExitStack() as proxied:
            if network.active:
                run.network = proxied.enter_context(
                    RunNetwork(network, dsn=run_dsn(), lease_ms=lease_ms, started=run.state.started)
                )
            finished_in_time = _run_workers(
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
    pause_anomalies = _judge_pauses(run.state.delivered, run.logs)
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
    delivered = run.state.delivered
    kills_delivered = _kind_count(delivered, FaultKind.KILL)
    pauses_delivered = _kind_count(delivered, FaultKind.PAUSE)
    cuts_delivered = _kind_count(delivered, FaultKind.POWER_CUT)
    restarts_delivered = _kind_count(delivered, FaultKind.SERVER_RESTART)
    session_kills_delivered = _kind_count(delivered, FaultKind.SESSION_KILL)
    report = {
        "system": chosen.describe(),
        "system_spec": system,
        "system_import_path": import_path(system),
        "seed": seed,
        "crash_mode": crash_mode,
        "notes": notes,
        "parameters": {
            "jobs": jobs,
            "workers": workers,
            "kills": kills,
            "pauses": pauses,
            "power_cuts": power_cuts,
            "server_restarts": server_restarts,
            "session_kills": session_kills,
            **{
                name: value
                for name, value in network.to_json(lease_ms).items()
                if network.active or name != "window_ms"
            },
            "poison_jobs": poison_count,
            "long_jobs": len(long_jobs),
            "lease_ms": lease_ms,
            "batch": batch,
        },
        "kills_delivered": kills_delivered,
        "pauses_delivered": pauses_delivered,
        "power_cuts_delivered": cuts_delivered,
        "server_restarts_delivered": restarts_delivered,
        "session_kills_delivered": session_kills_delivered,
        "network_faults_delivered": {
            kind.value: _kind_count(delivered, kind) for kind in network.counts()
        },
        "network": run.network.report() if run.network is not None else None,
        "pauses_with_takeover": sum(1 for record in delivered if record.get("taken_over")),
        "pauses_fenced": sum(1 for record in delivered if record.get("fenced")),
        "respawns": run.state.respawns,
        "accounting": accounting,
        "worker_failures": run.state.failures,
        "anomalies": [
            f"{failure['worker_id']} exited with status {failure['exit_code']}: {failure['error']}"
            for failure in run.state.failures
        ]
        + accounting["anomalies"]
        + pause_anomalies,
        "ok": (
            accounting["ok"]
            and not run.state.failures
            and not pause_anomalies
            and all(_kind_count(delivered, kind) == count for kind, count in counts.items())
        ),
        "reasons": _reasons(
            accounting,
            run.state.failures,
            pause_anomalies,
            delivered,
            planned=counts,
            finished_in_time=finished_in_time,
            gave_up=run.state.gave_up,
        ),
        "finished_in_time": finished_in_time,
        # What was planned, as data: ``chaos --replay`` delivers it again.
        "schedule": schedule_record,
        "replay_of": replay_of,
        "faults": delivered,
        "artifacts": {
            "store_directory": str(store.relative_to(output_dir)),
            "idempotent_ledger": "effects-idempotent.sqlite",
            "non_idempotent_ledger": "executions-non-idempotent.sqlite",
            "worker_logs": "worker-logs",
        },
        "workers_started": run.state.workers,
        # The run's start on the machine's monotonic clock, which the worker logs also use.
        "started_monotonic_s": started,
        "timings": {"elapsed_s": round(elapsed, 3)},
    }
    report["promises"] = _promises(chosen, crash_mode, report, run.state.gave_up)
    write_json(output_dir / CHAOS_FILE, report)
    return report


def _promises(
    chosen: System, crash_mode: str, report: dict[str, Any], gave_up: str | None
) -> dict[str, Any]:
    """The run against the system's own promises, judged job by job (the reasons' counts
    say "lost" of a job still held, too) with the run's stall; a fault the schedule could
    not deliver says nothing of the system."""
    judged = list(report["anomalies"])
    if not report["finished_in_time"]:
        judged.append(gave_up or "the work did not finish before the deadline")
    kinds = sorted({str(record["kind"]) for record in report["faults"] if "at_s" in record})
    return classify(chosen, crash_mode, judged, kinds)


def _runnable(
    system: str,
    crash_mode: str,
    counts: Mapping[FaultKind, int],
    *,
    jobs: int,
    workers: int,
    network: NetworkPlan,
    restart_server: Callable[[], None] | None,
) -> System:
    """The system, once every planned fault is known to be deliverable in this run."""
    network.check()
    _check_parameters(
        jobs=jobs,
        workers=workers,
        kills=counts[FaultKind.KILL],
        pauses=counts[FaultKind.PAUSE],
        cuts=counts[FaultKind.POWER_CUT],
        server_faults=sum(counts.values())
        - counts[FaultKind.KILL]
        - counts[FaultKind.PAUSE]
        - counts[FaultKind.POWER_CUT],
    )
    if counts[FaultKind.POWER_CUT] and crash_mode != POWER_LOSS:
        raise InvalidInput("power_cuts", "a power cut needs --crash-mode power-loss")
    if counts[FaultKind.SERVER_RESTART] and restart_server is None:
        raise InvalidInput(
            "server_restarts", "needs a server this run started (not one given with --dsn)"
        )
    chosen = resolve_system(system)
    if counts[FaultKind.SESSION_KILL] and chosen.terminate_sessions is None:
        raise InvalidInput("session_kills", f"{chosen.name} has no server sessions to end")
    if network.active and chosen.server != "postgres":
        raise InvalidInput(
            "network", f"{chosen.name} talks to no server: there is no connection to fault"
        )
    check_crash_mode(crash_mode, chosen, experiment="chaos")
    return chosen


def _planned(
    schedule: Sequence[Mapping[str, Any]] | None,
    *,
    seed: int,
    jobs: int,
    workers: int,
    counts: Mapping[FaultKind, int],
) -> list[PlannedFault]:
    """The seed's schedule, or the recorded one given, which must hold the counts asked."""
    if schedule is None:
        return plan(
            seed=seed,
            jobs=jobs,
            workers=workers,
            kills=counts[FaultKind.KILL],
            pauses=counts[FaultKind.PAUSE],
            cuts=counts[FaultKind.POWER_CUT],
            restarts=counts[FaultKind.SERVER_RESTART],
            session_kills=counts[FaultKind.SESSION_KILL],
            others={kind: count for kind, count in counts.items() if kind in WINDOW_OF},
        )
    planned = recorded(schedule)
    for kind in FaultKind:
        found = sum(fault.kind == kind for fault in planned)
        if found != counts.get(kind, 0):
            raise InvalidInput(
                "schedule",
                f"it holds {found} faults of kind {kind.value}, not {counts.get(kind, 0)}",
            )
    return planned


def _check_parameters(
    *, jobs: int, workers: int, kills: int, pauses: int, cuts: int, server_faults: int = 0
) -> None:
    """Refuse, before anything starts, a run that could not deliver what it plans."""
    require_int("jobs", jobs, minimum=1)
    require_int("workers", workers, minimum=1, maximum=MAX_WORKERS)
    require_int("kills", kills, minimum=0)
    require_int("pauses", pauses, minimum=0)
    require_int("power_cuts", cuts, minimum=0)
    require_int("server_faults", server_faults, minimum=0)
    # Faults fire at progress marks spread over the first SPAN of the jobs, one mark each.
    room = int(jobs * SPAN)
    faults = kills + pauses + cuts + server_faults
    if faults > room:
        raise InvalidInput(
            "kills",
            (
                f"{kills} kills, {pauses} pauses and {cuts} power cuts"
                if cuts
                else f"{kills} kills and {pauses} pauses"
            )
            + f" need at least {math.ceil(faults / SPAN)} jobs; {jobs} jobs leave room for"
            f" {room} faults",
        )


def _run_workers(
    run: _ChaosRun,
    pending: list[PlannedFault],
    *,
    jobs: int,
    deadline_s: float,
    progress: Progress | None,
    described: dict[str, Any],
) -> bool:
    """Start the workers, deliver the faults, shut the workers down; True once the work was
    done. An interrupted run stops its workers at once and says what it had done."""
    try:
        run.launch()
        return _drive(run, pending, jobs=jobs, deadline_s=deadline_s, progress=progress)
    except Interrupted as interruption:
        run.shut_down(drain=False)
        interruption.partial.update(described | run.so_far(jobs))
        raise
    finally:
        # Workers drain and exit on their own, unless the run gave up waiting for them.
        run.shut_down(drain=run.state.gave_up is None)


#: After every fault was delivered, how long the run waits for one more job to be
#: acknowledged before it stops, in leases (at least STALL_GRACE_MIN_S). Poison jobs need at
#: most three expiries or failures and long jobs a few leases each; a queue that never buries
#: a poison job, or never lets a long job finish, must not hold the run for its deadline.
STALL_GRACE_LEASES = 10
STALL_GRACE_MIN_S = 5.0


def _stalled(run: _ChaosRun, watcher: _Watcher, jobs: int) -> bool:
    """Whether no job was acknowledged for so long that the jobs still holding the run up
    will not end; then the run stops waiting, and says why.

    "Acknowledged" counts acknowledgements sent, answered or not, as the progress marks do: a
    worker killed between its commit and its answer's line never logs the answer."""
    done = len((watcher.acknowledged | watcher.sent) - run.poison_keys)
    now = time.monotonic()
    if run.progress_seen is None or done != run.progress_seen[0]:
        run.progress_seen = (done, now)
        return False
    grace = max(STALL_GRACE_MIN_S, STALL_GRACE_LEASES * run.lease_ms / 1000)
    if now - run.progress_seen[1] < grace:
        return False
    if done >= jobs:
        run.state.gave_up = (
            f"every other job was acknowledged, but the work did not end within {grace:.0f} s"
            " after: jobs are left that never reach the dead letter (see the poison jobs)"
        )
    else:
        run.state.gave_up = (
            f"the work stalled: no job was acknowledged for {grace:.0f} s after every fault"
            f" was delivered, with {jobs - done} of {jobs} jobs never acknowledged"
        )
    return True


def _drive(
    run: _ChaosRun,
    pending: list[PlannedFault],
    *,
    jobs: int,
    deadline_s: float,
    progress: Progress | None,
) -> bool:
    """Deliver the planned faults as the work progresses; True once the work is done."""
    watcher = _Watcher(run.logs)
    started = run.state.started
    next_report = started + PROGRESS_EVERY_S
    try:
        while time.monotonic() < started + deadline_s:
            if not pending:
                run.release()
            run.follow(watcher)
            if run.work_done():
                return True
            if not pending and _stalled(run, watcher, jobs):
                return False
            finished = watcher.progressed()
            run.respawn_dead()
            if run.failed():
                return False
            run.continue_paused(watcher, force=False)
            while pending and pending[0].after_finished <= finished:
                if pending[0].kind is FaultKind.POWER_CUT:
                    _deliver_power_cut(pending.pop(0), run, watcher)
                    continue
                if pending[0].kind is FaultKind.SERVER_RESTART:
                    _deliver_server_restart(pending.pop(0), run)
                    continue
                if pending[0].kind in WINDOW_OF:
                    if not _deliver_network_fault(pending[0], run):
                        break  # every worker is paused or too fresh: try again next tick
                    pending.pop(0)
                    continue
                if pending[0].kind is FaultKind.SESSION_KILL:
                    if not _deliver_session_kill(pending[0], run):
                        break  # no worker has a session right now: try again next tick
                    pending.pop(0)
                    continue
                target = run.target_for(pending[0].worker_slot)
                if target is None:
                    break  # every worker is paused or too fresh: try again next tick
                fault = pending.pop(0)
                time.sleep(fault.delay_ms / 1000)
                _deliver(fault, run, watcher, target)
            if (
                pending
                and pending[0].after_finished > finished
                and watcher.found_no_work(slot.worker_id for slot in run.slots)
            ):
                # The idle line was written after every acknowledgement had been sent, so
                # the logs read again now hold them all: only a mark still out of reach
                # then will never be reached (a power cut lost acknowledged jobs), and the
                # work ended under the plan (those faults are reported as not delivered).
                run.follow(watcher)
                if pending[0].after_finished > watcher.progressed():
                    run.release()
            if progress is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + PROGRESS_EVERY_S
                kills_so_far = _kind_count(run.state.delivered, FaultKind.KILL)
                progress(
                    f"{watcher.finished()}/{jobs} jobs acknowledged, {kills_so_far} kills,"
                    f" {time.monotonic() - started:.1f} s"
                )
            time.sleep(TICK_S)
        return False
    finally:
        run.continue_paused(watcher, force=True)


def _reasons(
    accounting: dict[str, Any],
    failures: list[dict[str, Any]],
    pause_anomalies: list[str],
    delivered: list[dict[str, Any]],
    *,
    planned: dict[FaultKind, int],
    finished_in_time: bool,
    gave_up: str | None = None,
) -> list[str]:
    """Why a run is not ok, one line each (empty when it is)."""
    reasons = [
        f"{failure['worker_id']} exited with status {failure['exit_code']}: {failure['error']}"
        for failure in failures
    ]
    if not finished_in_time:
        reasons.append(gave_up or "the work did not finish before the deadline")
    for kind, count in planned.items():
        landed = _kind_count(delivered, kind)
        if landed != count:
            reasons.append(
                f"{count - landed} of {count} planned {kind.value}s not delivered"
                " (the work ended first or no worker could be hit)"
            )
    for name in ("lost", "dead", "unexpected", "duplicated_effects", "effects_missing"):
        if accounting[name]:
            reasons.append(f"{name.replace('_', ' ')}: {accounting[name]}")
    if accounting["acknowledged_twice"]:
        reasons.append(f"jobs acknowledged twice: {accounting['acknowledged_twice']}")
    poison = accounting.get("poison", {}).get("anomalies", [])
    if poison:
        reasons.append(
            f"poison jobs not dead-lettered at their limit: {len(poison)} (first: {poison[0]})"
        )
    if accounting.get("overlapping_leases"):
        reasons.append(
            f"second leases granted while another was live: {accounting['overlapping_leases']}"
            f" (first: {accounting['overlapping_lease_proofs'][0]})"
        )
    if not accounting["judge_ok"]:
        reasons.append(
            f"the reader found the store inconsistent: {accounting['judge_problems'][:3]}"
        )
    if not all(accounting["integrity_check_ok"].values()):
        reasons.append(f"ledger integrity: {accounting['integrity_check_ok']}")
    return reasons + pause_anomalies


def _judge_pauses(delivered: list[dict[str, Any]], log_dir: Path) -> list[str]:
    """What each paused worker was told about the leases it held when it was stopped.

    It was continued only after its leases' deadlines had passed or other workers had
    claimed its jobs, so every one of its late acknowledgements must have been refused.
    """
    logs = read_logs(log_dir)
    anomalies = []
    for record in delivered:
        held = {(key, token) for key, token in record.get("held_leases", ())}
        if record["kind"] != FaultKind.PAUSE.value or not held:
            continue
        log = logs.get(record["worker_id"])
        refused = set(log.stale) & held if log else set()
        accepted = set(log.acks) & held if log else set()
        # A worker killed soon after it was continued may never have heard an answer.
        record["late_acknowledgements"] = {
            "refused": len(refused),
            "accepted": len(accepted),
            "unanswered": len(held - refused - accepted),
        }
        record["fenced"] = not accepted
        anomalies += [
            f"job {key}: {record['worker_id']}, stopped past its lease, had its late "
            "acknowledgement accepted"
            for key, _ in sorted(accepted)
        ]
    return anomalies


def _started(process: Any) -> bool:
    """Whether ``process`` was started (a run interrupted while launching may hold one that
    never was, which can be neither joined nor signalled)."""
    return process is not None and process.pid is not None


def _signal(process: Any, signum: int) -> bool:
    """Signal a worker that is still running; False when it has already exited.

    Workers are children of the fork server, not of this process, so a worker that
    finished its work may already be gone; checking ``exitcode`` first also keeps a
    signal from reaching a recycled process id.
    """
    if not _started(process) or process.exitcode is not None:
        return False
    try:
        os.kill(process.pid, signum)
    except ProcessLookupError:
        return False
    return True


def _deliver_power_cut(fault: PlannedFault, run: _ChaosRun, watcher: _Watcher) -> None:
    time.sleep(fault.delay_ms / 1000)
    record: dict[str, Any] = {
        "index": fault.index,
        "kind": fault.kind.value,
        "after_finished": fault.after_finished,
        "at_s": round(time.monotonic() - run.state.started, 6),
        "workers_killed": [slot.worker_id for slot in run.slots],
    }
    record |= run.cut_power(watcher)
    run.state.delivered.append(record)


def _deliver_server_restart(fault: PlannedFault, run: _ChaosRun) -> None:
    """The server dies without a checkpoint and starts again; the workers live on and must
    reconnect, and every transition they were told was committed must still be there."""
    assert run.restart_server is not None
    time.sleep(fault.delay_ms / 1000)
    record: dict[str, Any] = {
        "index": fault.index,
        "kind": fault.kind.value,
        "after_finished": fault.after_finished,
        "at_s": round(time.monotonic() - run.state.started, 6),
    }
    run.restart_server()
    record["back_after_s"] = round(time.monotonic() - run.state.started - record["at_s"], 6)
    run.state.delivered.append(record)


def _deliver_network_fault(fault: PlannedFault, run: _ChaosRun) -> bool:
    """Start a network fault on the planned worker's path (or the next worker's round the
    table, if that one is paused or too fresh); a partition cuts every path. False when no
    worker could be struck now."""
    assert run.network is not None
    record: dict[str, Any] = {
        "index": fault.index,
        "kind": fault.kind.value,
        "after_finished": fault.after_finished,
    }
    paths: list[str] | None = None
    partial = run.network.plan.partition_workers is not None
    if fault.kind is not FaultKind.PARTITION or partial:
        slot = run.target_for(fault.worker_slot)
        if slot is None:
            return False
        record |= {"planned_slot": fault.worker_slot, "worker_slot": slot.index,
                   "worker_id": slot.worker_id}  # fmt: skip
        paths = [worker_path(slot.index)]
        if fault.kind is FaultKind.PARTITION:
            paths = run.network.plan.partition_paths(slot.index, len(run.slots))
    time.sleep(fault.delay_ms / 1000)
    record |= run.network.strike(fault.kind, paths)
    run.state.delivered.append(record)
    return True


def _deliver_session_kill(fault: PlannedFault, run: _ChaosRun) -> bool:
    """End the database session of the planned worker (or the next one round the table that
    has a session); False when no worker had one."""
    assert run.system.terminate_sessions is not None
    for step in range(len(run.slots)):
        slot = run.slots[(fault.worker_slot + step) % len(run.slots)]
        if slot.index in run.state.paused or slot.process.exitcode is not None:
            continue
        ended = run.system.terminate_sessions(slot.process.pid)
        if ended:
            run.state.delivered.append(
                {
                    "index": fault.index,
                    "kind": fault.kind.value,
                    "planned_slot": fault.worker_slot,
                    "worker_slot": slot.index,
                    "worker_id": slot.worker_id,
                    "pid": slot.process.pid,
                    "after_finished": fault.after_finished,
                    "at_s": round(time.monotonic() - run.state.started, 6),
                    "sessions_ended": ended,
                }
            )
            return True
    return False


def _deliver(fault: PlannedFault, run: _ChaosRun, watcher: _Watcher, slot: _Slot) -> None:
    """Send one planned signal to the worker in ``slot`` and record when it really landed."""
    state, lease_ms = run.state, run.lease_ms
    record: dict[str, Any] = {
        "index": fault.index,
        "kind": fault.kind.value,
        "planned_slot": fault.worker_slot,
        "worker_slot": slot.index,
        "after_finished": fault.after_finished,
    }
    process = slot.process
    if process.exitcode is not None:
        run.note_exit(slot)
        state.respawns += 1
        run.start(slot)
        process = slot.process
    record["worker_id"] = slot.worker_id
    record["pid"] = process.pid
    if fault.kind is FaultKind.KILL:
        if not _signal(process, signal.SIGKILL):
            record["skipped"] = "worker exited before the signal"
            state.delivered.append(record)
            return
        record["at_s"] = round(time.monotonic() - state.started, 6)
        record["worker_age_s"] = round(time.monotonic() - slot.started_at, 6)
        process.join(timeout=10)
        # What the dead worker left behind: leases that only expiry can free now.
        run.follow(watcher)
        record["leases_held_at_death"] = len(watcher.leases_of(slot.worker_id))
        state.delivered.append(record)
        return
    # Stop it at a moment when it holds leases (read while it is stopped, so they are
    # exactly what it holds); a worker between batches is continued and tried again.
    leases: set[tuple[str, str]] = set()
    for _ in range(PAUSE_TRIES):
        if not _signal(process, signal.SIGSTOP):
            break
        record["at_s"] = round(time.monotonic() - state.started, 6)
        run.follow(watcher)
        leases = watcher.leases_of(slot.worker_id)
        if leases:
            break
        _signal(process, signal.SIGCONT)
        time.sleep(TICK_S)
    if "at_s" not in record:
        record["skipped"] = "worker exited before the signal"
        state.delivered.append(record)
        return
    record["leases_held"] = len(leases)
    record["held_leases"] = [list(lease) for lease in sorted(leases)]
    # The main loop continues it once another worker took its jobs over (bounded).
    state.paused[slot.index] = (record, leases, time.monotonic() + PAUSE_LEASES * lease_ms / 1000)
    state.delivered.append(record)
