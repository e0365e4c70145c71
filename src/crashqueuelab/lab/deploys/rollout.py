"""A deploy run as it goes (``Rollout``): the fleet started, the producer submitting on
schedule, each step's stop signals to a batch of workers, each grace period enforced with a
SIGKILL, replacements started, and the wait for every job to have run to completion;
with the executions each worker's ledger holds, those the library's own guard ended
marked so."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.lab.deploys.fleet import Fleet, Worker
from crashqueuelab.lab.deploys.plan import DeployPlan, Step, StopSignal, StopWhen
from crashqueuelab.lab.deploys.serverrestarts import ServerRestarts
from crashqueuelab.lab.faults.deploy import Replace
from crashqueuelab.lab.runs.executions import (
    ENDED,
    DeathWatch,
    Execution,
    read_ledger,
    with_deaths,
)
from crashqueuelab.lab.runs.reopening import Calls
from crashqueuelab.systems.contract import JobSpec

#: Every job's attempts: a long job may be SIGKILLed at several deploys.
MAX_ATTEMPTS = 25
#: How long a run that fails its server over keeps submitting a job whose calls raise.
SUBMIT_RETRY_S = 60.0
_POLL_S = 0.02
#: How much longer than the grace a mid-job stop wants its worker's job to run on, so that a
#: SIGKILL sent late on a loaded machine still finds the job running (one came 0.08 s late,
#: after a job that had outlasted the grace by less).
MID_JOB_MARGIN_S = 0.25
#: Once every job ran to completion, the workers run on this long (the last
#: acknowledgements reach the store) before they are stopped.
SETTLE_S = 0.5


class Rollout:
    """One deploy run as it goes: the fleet, the schedule, the producer."""

    def __init__(
        self,
        plan: DeployPlan,
        fleet: Fleet,
        steps: Sequence[Step],
        planned: Sequence[tuple[float, str]],
        client: Calls,
        clock: Callable[[], float],
        schedule_at: Callable[[str, float], None] | None = None,
        due: dict[str, float] | None = None,
        wall_origin: float = 0.0,
        deaths: DeathWatch | None = None,
        startup_s: float = 60.0,
        fail_over: Callable[..., dict[str, Any]] | None = None,
        failovers_at: Sequence[float] = (),
        server_restarts: ServerRestarts | None = None,
        after_stops: Mapping[int, Sequence[tuple[float, str]]] | None = None,
        work: Mapping[str, float] | None = None,
        ledger_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan, self.fleet, self.steps, self.clock = plan, fleet, steps, clock
        #: Executions whose process died under their live worker, not stopped by the lab
        #: (the library's own guard), on the ledgers' clock.
        self.deaths = deaths or DeathWatch(time.monotonic)
        self.planned = list(planned)
        #: By step: the jobs submitted that long after its signals, planned once it is made.
        self.after_stops = after_stops or {}
        self.client = client
        #: Each job's work (seconds), and the clock its workers' ledgers keep.
        self.work, self.ledger_clock = work or {}, ledger_clock
        #: Submits a scheduled job due at a time on the run's clock; each one's due time.
        self.schedule_at, self.due = schedule_at, due or {}
        #: The wall clock (seconds since the epoch) at the run clock's zero.
        self.wall_origin = wall_origin
        self.submitted: dict[str, float] = {}
        self.done_steps = 0
        self.skipped: list[dict[str, Any]] = []
        self.failed: dict[str, str] = {}
        #: How long a stop waits for a worker that has not reached its loop yet.
        self.startup_s = startup_s
        #: Fails the system's server over (its record); when each failover is due.
        self.fail_over = fail_over
        self.pending_failovers = list(failovers_at)
        #: Each failover done: when it began and when the clients reached the promoted
        #: standby (the run's clock), with the cluster's record of it.
        self.failovers: list[dict[str, Any]] = []
        #: Crashes of the system's server, each started again on what it kept.
        self.server_restarts = server_restarts
        #: Each worker that exited by itself while the run fails its server over, restarted
        #: at once as a process manager restarts a service that exited.
        self.restarted: list[dict[str, Any]] = []
        #: The jobs whose submission raised while the server failed over (made again on
        #: the next turn): when first, how many calls, the last error.
        self.submit_failures: dict[str, dict[str, Any]] = {}
        #: Past this many restarts of one slot, an exit is a worker that cannot run.
        faults = len(failovers_at) + (server_restarts.count if server_restarts else 0)
        self.restarts_per_slot = 2 * faults + 2

    @property
    def server_faulted(self) -> bool:
        """Whether the run fails its server over or restarts it: a worker or a submission
        its server went away under is given another go."""
        return self.fail_over is not None or self.server_restarts is not None

    def submit_due(self) -> None:
        while self.planned and self.planned[0][0] <= self.clock():
            _, key = self.planned[0]
            submit: Callable[[], object]
            if key in self.due and self.schedule_at is not None:
                submit = partial(self.schedule_at, key, self.wall_origin + self.due[key])
            else:
                job = JobSpec(key, "work", {}, max_attempts=MAX_ATTEMPTS)
                submit = partial(self.client.submit, job)
            if not self._submitted(key, submit):
                return  # tried again on the next turn of the loop
            self.planned.pop(0)
            self.submitted[key] = self.clock()

    def _submitted(self, key: str, submit: Callable[[], object]) -> bool:
        """Whether the submission of ``key`` (a job, or a scheduled one through the
        library's own call) was acknowledged. In a run that fails its server over or
        restarts it, a call that raised is made again with the same key on the loop's next
        turn (the key makes a repeat find the job if the first call committed it), for at
        most ``SUBMIT_RETRY_S``, and each job's failed calls are written down; otherwise it
        is the run's failure."""
        try:
            submit()
        except Exception as error:
            failed = self.submit_failures.setdefault(
                key, {"first_at_s": round(self.clock(), 3), "calls": 0}
            )
            failed["calls"] += 1
            failed["error"] = f"{type(error).__name__}: {error}"[:300]
            if not self.server_faulted or self.clock() - failed["first_at_s"] > SUBMIT_RETRY_S:
                raise
            return False
        return True

    def current(self, slot: int) -> Worker | None:
        """The slot's worker not yet asked to stop."""
        return next(
            (w for w in self.fleet.workers if w.slot == slot and w.running and w.stop_s is None),
            None,
        )

    def stop_due(self) -> None:
        while (
            self.done_steps < len(self.steps) and self.steps[self.done_steps].at_s <= self.clock()
        ):
            step = self.steps[self.done_steps]
            if not self._ready(step.slots) or not self._working(step):
                return  # asked again on the next turn of the loop
            stopped = []
            for slot in step.slots:
                worker = self.current(slot)
                if worker is None:
                    self.skipped.append({"step": self.done_steps, "slot": slot})
                    continue
                worker.step = self.done_steps
                worker.stop_due_s = step.at_s
                worker.held_when_stopped = worker.jobs_in_hand()
                worker.stop_s = self.clock()
                worker.grace_end_s = worker.stop_s + self.plan.grace_s
                self.fleet.send(worker, self.plan.signal.first)
                stopped.append(slot)
            # Every worker of the batch is signalled before any replacement starts: a
            # batch (a fleet restart) is stopped at one instant, as a process manager does.
            if self.plan.replace is Replace.AT_ONCE:
                for slot in stopped:
                    self.fleet.start(slot)
            signalled = self.clock()
            for after, key in self.after_stops.get(self.done_steps, ()):
                bisect.insort(self.planned, (signalled + after, key))
            self.done_steps += 1

    def _ready(self, slots: Sequence[int]) -> bool:
        """Whether every worker a step stops serves: a stop falls due on a worker once it
        reached its worker loop (a busy machine can take seconds to import it) and, where
        its library tells, takes jobs (Celery's worker boots for seconds more), or once it
        had ``startup_s`` to, after which the stop finds whatever is there."""
        for slot in slots:
            worker = self.current(slot)
            if worker is None or worker.serving():
                continue
            if self.clock() - worker.started_s < self.startup_s:
                return False
        return True

    def _working(self, step: Step) -> bool:
        """Whether the step's stop may go as ``plan.stop_when`` says: at once when due;
        ``mid-job``, once every worker it stops holds a job with more than the grace period
        (and ``MID_JOB_MARGIN_S``) of its work left, or one interval after it fell due (the
        stop then finds whatever is there)."""
        if self.plan.stop_when is StopWhen.DUE or self.clock() - step.at_s >= self.plan.interval:
            return True
        workers = [self.current(slot) for slot in step.slots]
        return all(worker is None or self._outlasts_grace(worker) for worker in workers)

    def _outlasts_grace(self, worker: Worker) -> bool:
        now = self.ledger_clock()
        return any(
            self.work.get(run.key, 0.0) - (now - run.start_s) > self.plan.grace_s + MID_JOB_MARGIN_S
            for run in worker.open_runs()
        )

    def enforce_grace(self) -> None:
        now = self.clock()
        for worker in self.fleet.running():
            if worker.stop_s is None or worker.grace_end_s is None:
                continue
            sent = sum(1 for _, name in worker.signals if name != "SIGKILL")
            twice = self.plan.signal is StopSignal.SIGTERM_TWICE
            if twice and sent == 1 and now >= worker.stop_s + self.plan.grace_s / 2:
                self.fleet.send(worker, "SIGTERM")
            if now >= worker.grace_end_s and worker.killed_s is None:
                self.fleet.kill(worker)

    def fail_over_due(self) -> None:
        while self.pending_failovers and self.pending_failovers[0] <= self.clock():
            self.pending_failovers.pop(0)
            assert self.fail_over is not None
            began = self.clock()
            record = self.fail_over(promote_after_s=self.plan.promote_after_s)
            promoted = began + record["promoted_s"]
            self.failovers.append(
                {"at_s": round(began, 3), "promoted_at_s": round(promoted, 3), **record}
            )

    def restart_server_due(self) -> None:
        restarts = self.server_restarts
        if restarts is None:
            return
        restarts.strike_due()
        if restarts.error is not None:
            self.failed["server"] = f"the server did not start again: {restarts.error}"

    def note_exits(self) -> None:
        for worker in self.fleet.poll():
            restarts = sum(1 for one in self.restarted if one["slot"] == worker.slot)
            if worker.stop_s is None and self.server_faulted and restarts < self.restarts_per_slot:
                # The worker's server went away under it: a process manager starts it again.
                error = Path(f"{worker.ledger}.error")
                self.restarted.append(
                    {
                        "worker": worker.name,
                        "slot": worker.slot,
                        "exit_s": None if worker.exit_s is None else round(worker.exit_s, 3),
                        "exit": worker.exit_word(),
                        "said": error.read_text().strip().splitlines()[-1]
                        if error.is_file()
                        else None,
                    }
                )
                self.fleet.start(worker.slot)
            elif worker.stop_s is None:
                error = Path(f"{worker.ledger}.error")
                told = (
                    error.read_text().strip().splitlines()[-1]
                    if error.is_file()
                    else f"exited by itself ({worker.exit_word()}) before any signal"
                )
                self.failed[worker.name] = told
            elif self.plan.replace is Replace.AFTER_EXIT:
                self.fleet.start(worker.slot)

    def watch_deaths(self) -> None:
        """Note each execution whose own process died while its worker ran and had not yet
        been told to stop: the library's guard ended it, not the deploy."""
        live = {w.name: w.pid for w in self.fleet.running() if w.stop_s is None}
        self.deaths.watch(self.executions(), live)

    def draining(self) -> bool:
        """Whether a stopped worker is still inside its grace period (or being killed)."""
        return any(w.stop_s is not None for w in self.fleet.running())

    def executions(self) -> list[Execution]:
        """Every ledger's executions, each one the library's guard ended marked so."""
        runs = [
            run
            for worker in self.fleet.workers
            if worker.ledger.is_file()
            for run in read_ledger(worker.ledger.read_text(), worker.name)
        ]
        return with_deaths(runs, self.deaths.deaths)

    def every_job_completed(self, keys: Sequence[str]) -> bool:
        runs = self.executions()
        # An execution open in the ledger of a worker that is gone ended with it.
        live = {worker.name for worker in self.fleet.running()}
        if any(run.end_s is None and run.worker in live for run in runs) or self.planned:
            return False
        # An open execution's ``how`` is ENDED too until it ends: only a closed one counts.
        ended = {run.key for run in runs if run.how == ENDED and run.end_s is not None}
        return all(key in ended for key in keys)

    def drive(
        self, keys: Sequence[str], bound: float, sleep: Callable[[float], None]
    ) -> tuple[float | None, float | None]:
        """Start the fleet, submit, stop, kill and replace as planned, then wait at most
        ``bound`` for every job to run to completion: when every job had (None: never),
        and when the last stop's grace was over (None: the run ended before)."""
        for slot in range(self.plan.workers):
            self.fleet.start(slot)
        last_stop_end: float | None = None
        while not self.failed:
            self.submit_due()
            self.note_exits()
            self.stop_due()
            self.fail_over_due()
            self.restart_server_due()
            self.enforce_grace()
            self.watch_deaths()
            done = (
                self.done_steps == len(self.steps)
                and not self.pending_failovers
                and (self.server_restarts is None or self.server_restarts.finished())
            )
            if done and not self.draining():
                last_stop_end = last_stop_end if last_stop_end is not None else self.clock()
                if self.every_job_completed(keys):
                    completed = self.clock()
                    sleep(SETTLE_S)
                    return completed, last_stop_end
                if self.clock() - last_stop_end > bound:
                    break
            sleep(_POLL_S)
        return None, last_stop_end
