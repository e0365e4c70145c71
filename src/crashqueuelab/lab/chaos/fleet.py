"""A chaos run's processes: the worker slots, the maintenance process, and what the run
does to them (start, respawn, continue a pause, cut the power, shut down).

The supervisor (the command's own process, which drives the run in ``drive.py``) never
touches the store after submitting and never forks while it holds it open: workers and the
maintenance process start from a multiprocessing fork server (a clean process that has only
imported the library), so a respawn costs a fork instead of a fresh interpreter.

Pauses: a SIGSTOPped worker keeps its leases until they expire; where several processes
may work, the maintenance process recovers them and another worker takes the jobs over, and
only then is the paused worker continued. A single owner is continued once its leases have
run out. Either way its late acknowledgements must be refused by the lease fencing.

Deploys: a SIGTERMed worker is watched through its grace (``stops.py``); its replacement
starts with the SIGTERM (``Replace.AT_ONCE``: the slot takes a new worker while the old one
drains beside it) or once the old one is gone (``AFTER_EXIT``: the slot waits for it).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly
from crashqueuelab.lab.chaos.powercuts import PowerSupply
from crashqueuelab.lab.chaos.processes import (
    ERROR_SUFFIX,
    RunFiles,
    WorkerSpec,
    maintenance_main,
    worker_main,
)
from crashqueuelab.lab.chaos.stops import Stopping, Stops
from crashqueuelab.lab.chaos.watcher import Watcher
from crashqueuelab.lab.chaos.worklog import (
    LOG_SUFFIX,
    WorkerLog,
    acknowledged_keys,
    read_log,
    read_logs,
)
from crashqueuelab.lab.faults.children import CLI_MODULE
from crashqueuelab.lab.faults.delivery import Record
from crashqueuelab.lab.faults.deploy import Replace, Rollout
from crashqueuelab.lab.faults.network.plan import MAINTENANCE_PATH, RunNetwork, worker_path
from crashqueuelab.lab.faults.signals import is_started, kill_session, send_signal
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import forkserver_context, start_owned
from crashqueuelab.systems.contract import System

#: A paused worker is continued once its jobs were taken over, or after this many lease
#: lengths: its leases were taken before the stop, so by then each is past its deadline and
#: every late acknowledgement must be refused. Soon after the deadline, while the jobs are
#: still being recovered or redone, is when a queue without fencing gives itself away;
#: longer would only stall the workers waiting for a ledger lock the stopped worker holds.
PAUSE_LEASES = 1.2
#: A worker is hit again only after it has lived this long (so kills land on work).
MIN_WORKER_AGE_S = 0.01
#: Workers get this long to notice the end of the work and exit on their own.
DRAIN_S = 10.0
#: A run stops once workers died this often without being killed (the system raised).
MAX_WORKER_FAILURES = 5


@dataclass
class Slot:
    index: int
    generation: int = 0
    process: Any = None
    worker_id: str = ""
    started_at: float = 0.0


@dataclass
class RunState:
    delivered: list[dict[str, Any]] = field(default_factory=list)
    respawns: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: Every worker process started: its id, slot and start (seconds into the run).
    workers: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    #: Why the run stopped waiting before its work was done (None: it did not).
    gave_up: Anomaly | None = None
    # slot index -> (the pause's record, the leases it held, when to continue it anyway)
    paused: dict[int, tuple[dict[str, Any], set[tuple[str, str]], float]] = field(
        default_factory=dict
    )


class ChaosRun:
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
        rollout: Rollout | None = None,
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
        self.state = RunState()
        self.slots = [Slot(index) for index in range(workers)]
        # Replaced workers whose logs have not been read to the end yet.
        self.retired: set[str] = set()
        self.maintenance: Any = None
        #: The power-loss disk under the store, in power-loss mode.
        self.power: PowerSupply | None = None
        #: Crashes and restarts the system's server, where the run started one.
        self.restart_server: Callable[[], None] | None = None
        #: Fails the replicated server over to its standby, where the run started one.
        self.fail_over: Callable[[], dict[str, Any]] | None = None
        #: Holds COMMITs open while every client connection is reset, where the run started
        #: a replicated server.
        self.hold_commits: Callable[[], dict[str, Any]] | None = None
        #: The fault proxy between the processes and the server, where the run has one.
        self.network: RunNetwork | None = None
        #: How deploys stop workers (None: the run has none), and the workers being stopped.
        self.rollout = rollout
        self.stops = Stops(lambda: time.monotonic() - self.state.started, kill_session)

    def inherited(self, path: str) -> Inherited:
        """What a process on ``path`` must see: through the proxy, where there is one."""
        return Inherited.capture() if self.network is None else self.network.inherited(path)

    def follow(self, watcher: Watcher) -> None:
        """Read the new lines of the live workers' logs, and the last ones of retired workers."""
        retired, self.retired = self.retired, set()
        stopping = self.stops.worker_ids()
        watcher.refresh([*retired, *stopping, *(slot.worker_id for slot in self.slots)])

    def start(self, slot: Slot) -> None:
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
            own_session=self.rollout is not None,
        )
        slot.process = self.context.Process(target=worker_main, args=(spec,), daemon=True)
        try:
            start_owned(slot.process)
        finally:
            # Recorded once started, also when an interrupt is raised as the start returns.
            if slot.process.pid is not None:
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
        start_owned(self.maintenance)

    def respawn_maintenance(self) -> None:
        """Maintenance is never signalled, and ends by itself (status 0) once the work is
        done: one that exited otherwise died of its system's error (its recovery raised).
        Record it, and start it again."""
        process = self.maintenance
        if not is_started(process) or process.exitcode in (None, 0) or self.stop_file.exists():
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

    def target_for(self, planned: int, *, ready: bool = False) -> Slot | None:
        """The planned slot, or the next one round the table if it is paused or too fresh;
        with ``ready``, also one whose worker has not begun its loop (its log is empty: a
        SIGTERM would find no handler yet and end it as the interpreter's default does).

        A paused worker is left alone until it is continued, a worker being stopped by a
        deploy until it is gone, and a worker that has just been started gets a moment to
        reach real work before it is hit again.
        """
        now = time.monotonic()
        for step in range(len(self.slots)):
            slot = self.slots[(planned + step) % len(self.slots)]
            if (
                not self.held(slot)
                and not self.stopping(slot)
                and now - slot.started_at >= MIN_WORKER_AGE_S
                and (not ready or self.began(slot))
            ):
                return slot
        return None

    def began(self, slot: Slot) -> bool:
        """Whether the slot's worker has begun its loop: its first line is in its log."""
        try:
            return (self.logs / f"{slot.worker_id}{LOG_SUFFIX}").stat().st_size > 0
        except FileNotFoundError:
            return False

    def held(self, slot: Slot) -> bool:
        """Whether the slot's worker is paused."""
        return slot.index in self.state.paused

    def stopping(self, slot: Slot) -> bool:
        """Whether the slot's worker was SIGTERMed and its replacement waits for it."""
        return self.stops.in_slot(slot.index, slot.worker_id)

    def work_done(self) -> bool:
        """A worker that found no work left exits with status 0 by itself (a SIGTERMed one
        exits 0 too: that is its deploy, not the end of the work)."""
        return any(slot.process.exitcode == 0 and not self.stopping(slot) for slot in self.slots)

    def failed(self) -> bool:
        """Workers keep dying by themselves: the system raises, and respawning cannot help."""
        return len(self.state.failures) >= MAX_WORKER_FAILURES

    def note_exit(self, slot: Slot) -> None:
        """Record a worker that died without being killed, with its system's error."""
        self.note_code(slot.worker_id, slot.process.exitcode)

    def note_code(self, worker_id: str, code: int | None) -> None:
        """Record ``worker_id``'s exit ``code`` if it died by itself, with its system's error."""
        if code in (0, -signal.SIGKILL):
            return
        error_file = self.logs / f"{worker_id}{LOG_SUFFIX}{ERROR_SUFFIX}"
        error = error_file.read_text().strip().splitlines() if error_file.is_file() else []
        self.state.failures.append(
            {
                "worker_id": worker_id,
                "exit_code": code,
                "error": error[-1] if error else "no error recorded",
            }
        )

    def respawn_dead(self) -> None:
        self.respawn_maintenance()
        for slot in self.slots:
            if self.held(slot) or self.stopping(slot):
                continue
            if slot.process.exitcode is not None:
                self.note_exit(slot)
                if self.failed():
                    return
                self.state.respawns += 1
                self.start(slot)

    def replace(self, slot: Slot) -> None:
        """Start a new worker in the slot of one a fault found dead, recording its death."""
        self.note_exit(slot)
        self.state.respawns += 1
        self.start(slot)

    def hold_stopping(self, slot: Slot, stopped: Record) -> None:
        """Watch a SIGTERMed worker through its grace; with ``Replace.AT_ONCE`` its
        replacement starts now, beside it."""
        assert self.rollout is not None
        self.stops.hold(slot.index, slot.worker_id, slot.process, stopped)
        if self.rollout.replace is Replace.AT_ONCE:
            self.state.respawns += 1
            self.start(slot)

    def settle_stops(self, *, force: bool = False) -> None:
        """End each SIGTERMed worker that exited or whose grace is over (every one, when
        ``force``); start the replacement of one whose slot waited for it (not once the
        run ends)."""
        for stopping in self.stops.settle(self._log_of, force=force):
            self._stopped(stopping, replace=not force)

    def _log_of(self, worker_id: str) -> WorkerLog:
        return read_log(self.logs / f"{worker_id}{LOG_SUFFIX}")

    def _stopped(self, stopping: Stopping, *, replace: bool) -> None:
        # Its log's last lines are read once more; an exit other than 0 (or the SIGKILL)
        # is its system's failure, as for any worker.
        self.retired.add(stopping.worker_id)
        self.note_code(stopping.worker_id, stopping.stopped.get("exit_code"))
        slot = self.slots[stopping.slot]
        if replace and slot.worker_id == stopping.worker_id and not self.failed():
            self.state.respawns += 1
            self.start(slot)

    def hold_paused(self, slot: Slot, record: Record, leases: set[tuple[str, str]]) -> None:
        """Keep a stopped worker stopped; ``continue_paused`` continues it once another
        worker took its jobs over, or after PAUSE_LEASES lease lengths at the latest."""
        self.state.paused[slot.index] = (
            record,
            leases,
            time.monotonic() + PAUSE_LEASES * self.lease_ms / 1000,
        )

    def continue_paused(self, watcher: Watcher, *, force: bool) -> None:
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
            send_signal(self.slots[index].process, signal.SIGCONT)
            record["continued_at_s"] = round(time.monotonic() - self.state.started, 6)
            del self.state.paused[index]

    def cut_power(self, watcher: Watcher) -> dict[str, Any]:
        """Every process dies at once, the disk forgets what was not synced, all restart."""
        assert self.power is not None
        stopping = list(self.stops)
        processes = [slot.process for slot in self.slots] + [self.maintenance]
        processes += [each.process for each in stopping]
        for process in processes:
            if process is not None:
                send_signal(process, signal.SIGKILL)
        for process in processes:
            if process is not None:
                process.join(timeout=10)
        for record, _, _ in self.state.paused.values():
            record["ended_by_power_cut"] = True
        self.state.paused.clear()
        for each in stopping:
            each.stopped["ended_by_power_cut"] = True
            each.stopped["exit_code"] = each.process.exitcode
            del self.stops.watching[each.worker_id]
            self.retired.add(each.worker_id)
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
        # A deploy's SIGTERMed workers get the rest of their grace, then the SIGKILL.
        for stopping in self.stops:
            ends = self.state.started + stopping.stopped["grace_end_s"]
            stopping.process.join(timeout=max(0.0, min(ends, drained) - time.monotonic()))
        self.settle_stops(force=True)
        started = [slot.process for slot in self.slots if is_started(slot.process)]
        for process in started:
            process.join(timeout=max(0.0, drained - time.monotonic()))
        for process in started:
            if send_signal(process, signal.SIGCONT):
                # SIGTERM: the worker finishes its batch and exits 0; SIGKILL if it does not.
                process.terminate()
                process.join(timeout=10)
                if process.exitcode is None:
                    process.kill()
                    process.join(timeout=10)
        if is_started(self.maintenance):
            self.maintenance.join(timeout=10)
            if self.maintenance.exitcode is None:
                self.maintenance.kill()
                self.maintenance.join(timeout=10)
