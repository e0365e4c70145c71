"""A chaos run driven: the supervisor's loop that follows the work through the workers'
logs, delivers each planned fault once its progress mark is reached, respawns dead
workers, continues pauses, ends deployed workers' grace periods, and stops when the work is
done, stalls or runs out of time.

Every fault is delivered through the deliverer ``lab/faults`` has for its kind
(``DELIVERERS``), which sees the run only through ``_Target``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.chaos.fleet import ChaosRun, Slot
from crashqueuelab.lab.chaos.schedule import PlannedFault
from crashqueuelab.lab.chaos.watcher import Watcher
from crashqueuelab.lab.faults.delivery import Deliverer, Record, by_kind, landed_count
from crashqueuelab.lab.faults.deploy import DEPLOY, Rollout
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.deliverer import NETWORK_FAULT
from crashqueuelab.lab.faults.network.plan import RunNetwork
from crashqueuelab.lab.faults.powercut import POWER_CUT
from crashqueuelab.lab.faults.server import FAILOVER, HELD_COMMITS, SERVER_RESTART, SESSION_KILL
from crashqueuelab.lab.faults.signals import SIGNALS
from crashqueuelab.lab.runs.interrupts import Interrupted
from crashqueuelab.lab.runs.progress import Progress

TICK_S = 0.002
PROGRESS_EVERY_S = 5.0
#: After every fault was delivered, how long the run waits for one more job to be
#: acknowledged before it stops, in leases (at least STALL_GRACE_MIN_S). Poison jobs need at
#: most three expiries or failures and long jobs a few leases each; a queue that never buries
#: a poison job, or never lets a long job finish, must not hold the run for its deadline.
STALL_GRACE_LEASES = 10
STALL_GRACE_MIN_S = 5.0
#: How many of the system's declared recoveries the grace makes room for: a poison job
#: needs one after each of its attempts (three) before it reaches its limit.
RECOVERIES_WAITED = 3


class _Target:
    """The run as its faults' deliverers see it: its workers, the leases their logs show
    (read through the run's watcher), and its power supply, server and fault proxy."""

    def __init__(self, run: ChaosRun, watcher: Watcher) -> None:
        self.run = run
        self.watcher = watcher

    @property
    def started(self) -> float:
        return self.run.state.started

    @property
    def workers(self) -> Sequence[Slot]:
        return self.run.slots

    @property
    def network(self) -> RunNetwork | None:
        return self.run.network

    @property
    def restart_server(self) -> Callable[[], None] | None:
        return self.run.restart_server

    @property
    def fail_over(self) -> Callable[[], dict[str, Any]] | None:
        return self.run.fail_over

    @property
    def hold_commits(self) -> Callable[[], dict[str, Any]] | None:
        return self.run.hold_commits

    @property
    def terminate_sessions(self) -> Callable[[int], int] | None:
        return self.run.system.terminate_sessions

    def target_for(self, planned: int) -> Slot | None:
        return self.run.target_for(planned)

    def is_paused(self, slot: int) -> bool:
        return slot in self.run.state.paused

    def replace(self, slot: int) -> Slot:
        self.run.replace(self.run.slots[slot])
        return self.run.slots[slot]

    def leases_of(self, worker_id: str) -> set[tuple[str, str]]:
        self.run.follow(self.watcher)
        return self.watcher.leases_of(worker_id)

    def hold_paused(self, slot: int, record: Record, leases: set[tuple[str, str]]) -> None:
        self.run.hold_paused(self.run.slots[slot], record, leases)

    @property
    def rollout(self) -> Rollout:
        assert self.run.rollout is not None
        return self.run.rollout

    def ready_for(self, planned: int) -> Slot | None:
        return self.run.target_for(planned, ready=True)

    def hold_stopping(self, slot: int, stopped: Record) -> None:
        self.run.hold_stopping(self.run.slots[slot], stopped)

    def cut_power(self) -> Record:
        return self.run.cut_power(self.watcher)


#: Every kind of fault a chaos run plans, to the deliverer that delivers it.
DELIVERERS: dict[FaultKind, Deliverer[_Target]] = by_kind(
    SIGNALS,
    DEPLOY,
    POWER_CUT,
    SERVER_RESTART,
    FAILOVER,
    HELD_COMMITS,
    SESSION_KILL,
    NETWORK_FAULT,
)


def run_workers(
    run: ChaosRun,
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


def stall_grace_s(lease_ms: int, recovery_s: float) -> float:
    """How long a run waits without an acknowledgement before it says the work stalled: ten
    leases (at least ``STALL_GRACE_MIN_S``), plus the recovery time the system declares for
    each of the recoveries a poison job needs to reach its limit, so a recovery that runs on
    the wall clock gets to finish."""
    floor = max(STALL_GRACE_MIN_S, STALL_GRACE_LEASES * lease_ms / 1000)
    return floor + RECOVERIES_WAITED * recovery_s


def _stalled(run: ChaosRun, watcher: Watcher, jobs: int, unreached: int = 0) -> bool:
    """Whether no job was acknowledged for so long that the jobs still holding the run up
    will not end; then the run stops waiting, and says why (``unreached``: the planned
    faults whose mark of acknowledged jobs the run never reached).

    "Acknowledged" counts acknowledgements sent, answered or not, as the progress marks do: a
    worker killed between its commit and its answer's line never logs the answer."""
    done = len((watcher.acknowledged | watcher.sent) - run.poison_keys)
    now = time.monotonic()
    if run.progress_seen is None or done != run.progress_seen[0]:
        run.progress_seen = (done, now)
        return False
    grace = stall_grace_s(run.lease_ms, run.system.recovery_s)
    if now - run.progress_seen[1] < grace:
        return False
    if done >= jobs:
        # A refused acknowledgement counts as progress (its job's taker should finish it);
        # said apart here, where the run gives up on exactly those jobs.
        refused = len(watcher.refused_unfinished() - run.poison_keys)
        said = (
            f"every other job's acknowledgement was sent, but {refused} were refused as stale"
            " and their jobs never acknowledged since; the work did not end within"
            f" {grace:.0f} s after"
            if refused
            else "every other job was acknowledged, but the work did not end within"
            f" {grace:.0f} s after: jobs are left that never reach the dead letter (see the"
            " poison jobs)"
        )
        run.state.gave_up = Anomaly(
            Kind.WORK_NEVER_ENDED,
            said,
            facts={"waited_s": round(grace), "refused_unfinished": refused},
        )
    else:
        after = (
            f", with {unreached} planned fault(s) never reached"
            if unreached
            else " after every fault was delivered"
        )
        run.state.gave_up = Anomaly(
            Kind.WORK_STALLED,
            f"the work stalled: no job was acknowledged for {grace:.0f} s{after}, with"
            f" {jobs - done} of {jobs} jobs never acknowledged",
            facts={
                "waited_s": round(grace),
                "unacknowledged": jobs - done,
                "faults_unreached": unreached,
            },
        )
    return True


def _drive(
    run: ChaosRun,
    pending: list[PlannedFault],
    *,
    jobs: int,
    deadline_s: float,
    progress: Progress | None,
) -> bool:
    """Deliver the planned faults as the work progresses; True once the work is done."""
    watcher = Watcher(run.logs)
    target = _Target(run, watcher)
    started = run.state.started
    next_report = started + PROGRESS_EVERY_S
    try:
        while time.monotonic() < started + deadline_s:
            if not pending:
                run.release()
            run.follow(watcher)
            if run.work_done():
                return True
            # A fault planned after more acknowledgements than the stalled work reaches never
            # comes: the stall is judged as if none were left.
            if (not pending or pending[0].after_finished > watcher.progressed()) and _stalled(
                run, watcher, jobs, unreached=len(pending)
            ):
                run.release()
                return False
            finished = watcher.progressed()
            run.settle_stops()
            run.respawn_dead()
            if run.failed():
                return False
            run.continue_paused(watcher, force=False)
            while pending and pending[0].after_finished <= finished:
                record = DELIVERERS[pending[0].kind].deliver(pending[0], target)
                if record is None:
                    # Every worker is paused or too fresh, or none has a session right
                    # now: try again next tick.
                    break
                pending.pop(0)
                run.state.delivered.append(record)
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
                kills_so_far = landed_count(run.state.delivered, FaultKind.KILL)
                progress(
                    f"{watcher.finished()}/{jobs} jobs acknowledged, {kills_so_far} kills,"
                    f" {time.monotonic() - started:.1f} s"
                )
            time.sleep(TICK_S)
        return False
    finally:
        run.continue_paused(watcher, force=True)
