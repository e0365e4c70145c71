"""A deploy run's parameters and its schedule, worked out before anything starts.

A **rolling deploy** of ``workers`` worker processes stops them ``surge`` at a time, one
batch every ``interval_s``: each stopped worker gets the stop signal (SIGTERM, as
Kubernetes, systemd and every process manager send; or SIGINT, SIGQUIT, or SIGTERM and a
second SIGTERM half a grace period later), and if it has not exited ``grace_s`` after the
first signal, every process of its session gets SIGKILL. A replacement starts at once, or once
the old process is gone (``replace``). A **fleet restart** stops every worker at once.
The run makes ``deploys`` rolling deploys, then ``fleet_restarts`` fleet restarts.

Jobs are submitted throughout, through the system's own client; each job's work lasts a
time drawn from the seed, some shorter than the grace period (a worker that finishes the
job in hand in time loses nothing) and some longer (its worker is SIGKILLed holding it).

``scheduled`` of the jobs are **scheduled**: submitted through the library's own scheduling
call (or, on the lab's queues, held by the queue's retry delay), due at a time drawn from the
seed: inside a stop's grace window, just after it while the replacement starts, or anywhere
in the rollout; half submitted before the first stop, the rest during the deploys, each at
least ``SCHEDULE_LEAD_S`` before it is due. Each must start once, not before it is due and
at most ``due_tolerance_s`` after.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.faults.deploy import Replace


class StopSignal(StrEnum):
    """What a stopped worker is sent first."""

    SIGTERM = "SIGTERM"
    SIGINT = "SIGINT"
    SIGQUIT = "SIGQUIT"
    #: SIGTERM, then a second SIGTERM half a grace period later (an impatient operator,
    #: or a process manager that repeats itself).
    SIGTERM_TWICE = "SIGTERM-twice"

    @property
    def first(self) -> str:
        return "SIGTERM" if self is StopSignal.SIGTERM_TWICE else self.value


class StopWhen(StrEnum):
    """When a stop signal goes: at its time in the schedule, or from then on once the worker
    it stops holds a job with more than the grace period of its work left, so that the
    SIGKILL at the grace's end finds it in hand (at most one interval late, then whatever it
    holds): the crash window of a worker killed mid-job, reached every run instead of when
    the schedule happens to meet a long job early in its work."""

    DUE = "due"
    MID_JOB = "mid-job"


#: The share of jobs whose work is longer than the grace period, by default.
LONG_SHARE = 0.3
#: A short job works this share of the grace period at most, a long one this many grace
#: periods at least and at most: a long job stopped in its first half still works when the
#: grace ends.
SHORT_MAX, LONG_MIN, LONG_MAX = 0.6, 2.0, 4.0
#: The jobs ``submit_at_stops`` places after a stop's signals arrive within this many
#: seconds of them: while the stopped worker's connection, and a fetch it left pending (a
#: BRPOP on Redis), may still be open (Celery's worker exits about 0.06 s after SIGTERM
#: where it holds no task, on an idle machine).
AT_STOP_S = 0.2
#: A short job works at least this long (seconds).
SHORT_MIN_S = 0.05
#: A scheduled job is submitted at least this long before it is due: a due time in the
#: future also for RQ, which keeps whole seconds.
SCHEDULE_LEAD_S = 1.0
#: The longest a library's worker may take to notice a due job, in its documented default
#: (procrastinate's worker polls for jobs every 5 s, ``fetch_job_polling_interval``; a
#: scheduled job comes due with no notification. RQ's active scheduler checks once every
#: second and keeps whole seconds, huey's scheduler ticks once a second, the lab's ``pgq
#: run`` waits 1 s for a notification before it polls, the lab's worker 0.05 s): the
#: default tolerance adds it to the grace period and the longest job's work, the most a
#: due job may wait for a worker that is draining or busy.
SCHEDULER_POLL_S = 5.0
#: Where in the rollout a scheduled job is due, in turn.
WINDOWS = ("grace", "replacement", "rollout")


@dataclass(frozen=True)
class DeployPlan:
    """What a deploy run does, all of it decided before it starts."""

    workers: int = 2
    deploys: int = 2
    grace_s: float = 1.0
    surge: int = 1
    replace: Replace = Replace.AT_ONCE
    fleet_restarts: int = 0
    signal: StopSignal = StopSignal.SIGTERM
    jobs: int = 8
    seed: int = 0
    #: Between one batch's stop signal and the next's; None: the grace period and a second.
    interval_s: float | None = None
    long_share: float = LONG_SHARE
    #: From the start of the run to the first stop signal (the first workers start).
    warmup_s: float = 1.0
    #: How many of the jobs are scheduled (due later, ``scheduled_jobs``).
    scheduled: int = 0
    #: How late a scheduled job may start; None: ``SCHEDULER_POLL_S`` + the grace + the
    #: longest job's work (``due_tolerance``).
    due_tolerance_s: float | None = None
    #: Failovers of the system's PostgreSQL server (its primary killed, its standby
    #: promoted), each half an interval after a stop (``failover_times``).
    failovers: int = 0
    #: How long no server answers the clients between a failover's kill and its promotion.
    promote_after_s: float = 0.0
    #: Crashes of the system's server (its broker, for a library on RabbitMQ): every process
    #: of it SIGKILLed, then started again on what it kept, each half an interval after a
    #: stop (``server_fault_times``), as failovers are.
    server_restarts: int = 0
    #: Until when the jobs not submitted at the start are submitted (seconds from the start);
    #: None: the last stop signal (or past the last server fault), so that one arrives at
    #: the last stop. Earlier: no job arrives during the stops after it.
    submit_until_s: float | None = None
    #: This many jobs are submitted right after each stop's signals, inside the ``AT_STOP_S``
    #: that follows them (``after_stops``); of the others, half at the start and the rest
    #: evenly, as above.
    submit_at_stops: int = 0
    #: Whether a stop waits for its worker to hold a job (``StopWhen``).
    stop_when: StopWhen = StopWhen.DUE

    def check(self) -> None:
        """Refuse what cannot be run, naming the option."""
        for name in ("workers", "jobs", "surge"):
            if getattr(self, name) < 1:
                raise InvalidInput(name, "must be at least 1")
        for name in ("deploys", "fleet_restarts", "failovers", "server_restarts"):
            if getattr(self, name) < 0:
                raise InvalidInput(name, "must be 0 or more")
        if self.deploys + self.fleet_restarts + self.failovers + self.server_restarts == 0:
            raise InvalidInput(
                "deploys",
                "a deploy run makes at least one deploy, restart, failover or server restart",
            )
        if self.failovers and self.server_restarts:
            raise InvalidInput(
                "server_restarts", "one kind of server fault a run: not with --failovers"
            )
        if self.surge > self.workers:
            raise InvalidInput("surge", f"at most the {self.workers} workers")
        if not self.grace_s > 0:
            raise InvalidInput("grace_s", "must be a positive number of seconds")
        if self.interval_s is not None and not self.interval_s > 0:
            raise InvalidInput("interval_s", "must be a positive number of seconds")
        if not 0 <= self.long_share <= 1:
            raise InvalidInput("long_share", "must be between 0 and 1")
        if not self.warmup_s >= 0:
            raise InvalidInput("warmup_s", "must be 0 or more seconds")
        if self.scheduled < 0:
            raise InvalidInput("scheduled", "must be 0 or more")
        if self.scheduled > self.jobs:
            raise InvalidInput("scheduled", f"at most the {self.jobs} jobs")
        if not self.promote_after_s >= 0:
            raise InvalidInput("promote_after_s", "must be 0 or more seconds")
        if self.promote_after_s and not self.failovers:
            raise InvalidInput("promote_after_s", "a failover's: needs --failovers")
        if self.submit_until_s is not None:
            self._check_submit_until(self.submit_until_s)
        if self.submit_at_stops:
            self._check_submit_at_stops(self.submit_at_stops)
        if self.stop_when is StopWhen.MID_JOB and (self.failovers or self.server_restarts):
            raise InvalidInput(
                "stop_when",
                "mid-job not with server faults: each is timed half an interval after a stop"
                " falls due, and a stop that waits for a job would land after it",
            )
        if self.due_tolerance_s is not None and not self.due_tolerance_s > 0:
            raise InvalidInput("due_tolerance_s", "must be a positive number of seconds")

    def _check_submit_until(self, until_s: float) -> None:
        if not until_s > 0:
            raise InvalidInput("submit_until_s", "must be a positive number of seconds")
        if self.failovers or self.server_restarts:
            raise InvalidInput(
                "submit_until_s", "not with server faults: their jobs come after the last one"
            )
        last_stop = schedule(self)[-1].at_s
        if until_s > last_stop:
            raise InvalidInput(
                "submit_until_s",
                f"at most the last stop signal, {last_stop:g} s: the run waits for the jobs"
                " from there",
            )

    def _check_submit_at_stops(self, each: int) -> None:
        if each < 0:
            raise InvalidInput("submit_at_stops", "must be 0 or more")
        if self.submit_until_s is not None:
            raise InvalidInput(
                "submit_at_stops", "not with --submit-until-s: its jobs come after every stop"
            )
        if self.failovers or self.server_restarts:
            raise InvalidInput(
                "submit_at_stops", "not with server faults: their jobs come after the last one"
            )
        stops = len(schedule(self))
        unscheduled = self.jobs - self.scheduled
        if each * stops >= unscheduled:
            raise InvalidInput(
                "submit_at_stops",
                f"{each} after each of the {stops} stops takes {each * stops} jobs, and one at"
                f" least comes at the start: {unscheduled} jobs are not scheduled",
            )

    @property
    def interval(self) -> float:
        return self.grace_s + 1.0 if self.interval_s is None else self.interval_s

    def to_json(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "deploys": self.deploys,
            "grace_s": self.grace_s,
            "surge": self.surge,
            "replace": self.replace.value,
            "fleet_restarts": self.fleet_restarts,
            "signal": self.signal.value,
            "jobs": self.jobs,
            "seed": self.seed,
            "interval_s": self.interval,
            "long_share": self.long_share,
            "warmup_s": self.warmup_s,
            "scheduled": self.scheduled,
            "due_tolerance_s": self.due_tolerance_s,
            "failovers": self.failovers,
            "promote_after_s": self.promote_after_s,
            "server_restarts": self.server_restarts,
            "submit_until_s": self.submit_until_s,
            "submit_at_stops": self.submit_at_stops,
            "stop_when": self.stop_when.value,
        }


@dataclass(frozen=True)
class Step:
    """One stop of the rollout: when (seconds from the run's start), which worker slots,
    and as part of what (``rolling`` deploy number ``deploy``, or a ``fleet`` restart)."""

    at_s: float
    slots: tuple[int, ...]
    kind: str
    deploy: int

    def to_json(self) -> dict[str, Any]:
        return {"at_s": round(self.at_s, 3), "slots": list(self.slots), "kind": self.kind}


def schedule(plan: DeployPlan) -> list[Step]:
    """Every stop, in order: each rolling deploy's batches of ``surge`` slots, then the
    fleet restarts, one ``interval`` apart from ``warmup_s`` on."""
    steps: list[Step] = []
    batches = math.ceil(plan.workers / plan.surge)
    for deploy in range(plan.deploys):
        for batch in range(batches):
            slots = tuple(range(batch * plan.surge, min((batch + 1) * plan.surge, plan.workers)))
            steps.append(Step(0.0, slots, "rolling", deploy))
    for restart in range(plan.fleet_restarts):
        steps.append(Step(0.0, tuple(range(plan.workers)), "fleet", plan.deploys + restart))
    return [
        Step(plan.warmup_s + index * plan.interval, step.slots, step.kind, step.deploy)
        for index, step in enumerate(steps)
    ]


def server_fault_times(plan: DeployPlan) -> list[float]:
    """When each failover or server restart strikes, on the run's clock: half an interval
    after each stop in turn (after the first stop's time without stops), so that it never
    lands on a stop and the workers a stop started have had time to start."""
    faults = plan.failovers + plan.server_restarts
    return [plan.warmup_s + (index + 0.5) * plan.interval for index in range(faults)]


def job_keys(jobs: int) -> list[str]:
    width = max(2, len(str(jobs - 1)))
    return [f"job-{index:0{width}d}" for index in range(jobs)]


def durations(keys: Sequence[str], plan: DeployPlan) -> dict[str, float]:
    """Each job's work, seeded: ``long_share`` of them (rounded, at least one of each kind
    where there are two jobs or more and the share allows) longer than the grace period,
    the rest shorter."""
    rng = random.Random(plan.seed)
    count = round(len(keys) * plan.long_share)
    if len(keys) >= 2 and 0 < plan.long_share < 1:
        count = min(max(count, 1), len(keys) - 1)
    long_keys = set(rng.sample(list(keys), count))
    grace = plan.grace_s
    chosen = {}
    for key in keys:
        if key in long_keys:
            chosen[key] = round(rng.uniform(LONG_MIN * grace, LONG_MAX * grace), 3)
        else:
            chosen[key] = round(max(SHORT_MIN_S, rng.uniform(0.1, SHORT_MAX) * grace), 3)
    return chosen


def submissions(
    keys: Sequence[str],
    steps: Sequence[Step],
    until_s: float = 0.0,
    end_s: float | None = None,
) -> list[tuple[float, str]]:
    """When each job is submitted (seconds from the start): half at once, the rest evenly
    until the last stop signal (or ``until_s``, if later: past the last server fault), so that
    jobs are waiting and running at every deploy; or until ``end_s`` where it is given."""
    if not keys:
        return []  # every job is scheduled
    end = max(steps[-1].at_s if steps else 0.0, until_s) if end_s is None else end_s
    first = max(1, len(keys) // 2)
    rest = len(keys) - first
    times = [0.0] * first + [end * (index + 1) / rest for index in range(rest)]
    return list(zip(times, keys, strict=True))


def after_stops(
    keys: Sequence[str], steps: Sequence[Step], each: int
) -> tuple[list[str], dict[int, list[tuple[float, str]]]]:
    """The jobs submitted right after each stop's signals (``submit_at_stops``): the last
    ``each`` keys per stop, by step, each with how long after the signals it comes (evenly
    inside ``AT_STOP_S``), measured from when they were sent, not from when the stop fell
    due (a stop waits for a worker still starting); and the keys left for ``submissions``."""
    count = each * len(steps)
    if count == 0:
        return list(keys), {}
    left, taken = list(keys[: len(keys) - count]), iter(keys[len(keys) - count :])
    offsets = [round(AT_STOP_S * (index + 1) / (each + 1), 3) for index in range(each)]
    return left, {step: [(offset, next(taken)) for offset in offsets] for step in range(len(steps))}


@dataclass(frozen=True)
class Scheduled:
    """One scheduled job: when it is submitted and when it is due (seconds from the run's
    start), and where in the rollout its due time falls (``WINDOWS``)."""

    key: str
    submit_s: float
    due_s: float
    window: str

    def to_json(self) -> dict[str, Any]:
        return {
            "submit_s": round(self.submit_s, 3),
            "due_s": round(self.due_s, 3),
            "window": self.window,
        }


def scheduled_jobs(keys: Sequence[str], steps: Sequence[Step], plan: DeployPlan) -> list[Scheduled]:
    """``plan.scheduled`` of the jobs, drawn from the seed (a source of their own, so that
    every other draw of the plan stays what it was without them), each due in turn inside
    a stop's grace window, in the second after it (the replacement starting), or anywhere
    from the first stop to the end of the last grace; the first half submitted at the start,
    the rest during the rollout, each at least ``SCHEDULE_LEAD_S`` before its due time."""
    if not plan.scheduled or not steps:
        return []
    rng = random.Random(f"scheduled-{plan.seed}")
    chosen = sorted(rng.sample(list(keys), plan.scheduled))
    first, last = steps[0].at_s, steps[-1].at_s + plan.grace_s
    planned = []
    for index, key in enumerate(chosen):
        window = WINDOWS[index % len(WINDOWS)]
        step = rng.choice(list(steps))
        if window == "grace":
            due = step.at_s + rng.uniform(0.0, plan.grace_s)
        elif window == "replacement":
            due = step.at_s + plan.grace_s + rng.uniform(0.0, 1.0)
        else:
            due = rng.uniform(first, last)
        due = max(due, SCHEDULE_LEAD_S)
        before = index < (len(chosen) + 1) // 2
        latest = due - SCHEDULE_LEAD_S
        submit = 0.0 if before or latest <= plan.warmup_s else rng.uniform(plan.warmup_s, latest)
        planned.append(Scheduled(key, round(submit, 3), round(due, 3), window))
    return planned


def due_tolerance(plan: DeployPlan, work: Mapping[str, float]) -> tuple[float, str]:
    """How late a scheduled job may start, and what that is made of."""
    if plan.due_tolerance_s is not None:
        return plan.due_tolerance_s, "given by the run"
    longest = max(work.values(), default=0.0)
    tolerance = round(SCHEDULER_POLL_S + plan.grace_s + longest, 3)
    basis = (
        f"{SCHEDULER_POLL_S:g} s for a worker to notice a due job (procrastinate's polling"
        f" interval, the longest default) + the grace {plan.grace_s:g} s (a worker draining)"
        f" + the longest job's work {longest:g} s (every worker busy)"
    )
    return tolerance, basis
