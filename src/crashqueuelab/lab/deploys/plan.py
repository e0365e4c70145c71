"""A deploy run's parameters and its schedule, worked out before anything starts.

A **rolling deploy** of ``workers`` worker processes stops them ``surge`` at a time, one
batch every ``interval_s``: each stopped worker gets the stop signal (SIGTERM, as
Kubernetes, systemd and every process manager send; or SIGINT, SIGQUIT, or SIGTERM and a
second SIGTERM half a grace period later), and if it has not exited ``grace_s`` after the
first signal, its whole process group gets SIGKILL. A replacement starts at once, or once
the old process is gone (``replace``). A **fleet restart** stops every worker at once.
The run makes ``deploys`` rolling deploys, then ``fleet_restarts`` fleet restarts.

Jobs are submitted throughout, through the system's own client; each job's work lasts a
time drawn from the seed, some shorter than the grace period (a worker that finishes the
job in hand in time loses nothing) and some longer (its worker is SIGKILLed holding it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crashqueuelab.core.errors import InvalidInput


class Replace(StrEnum):
    """When a stopped worker's replacement starts."""

    AT_ONCE = "at-once"  # with the stop signal: the rollout's surge runs beside the old one
    AFTER_EXIT = "after-exit"  # once the old process exited or was killed


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


#: The share of jobs whose work is longer than the grace period, by default.
LONG_SHARE = 0.3
#: A short job works this share of the grace period at most, a long one this many grace
#: periods at least and at most: a long job stopped in its first half still works when the
#: grace ends.
SHORT_MAX, LONG_MIN, LONG_MAX = 0.6, 2.0, 4.0
#: A short job works at least this long (seconds).
SHORT_MIN_S = 0.05


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

    def check(self) -> None:
        """Refuse what cannot be run, naming the option."""
        for name in ("workers", "jobs", "surge"):
            if getattr(self, name) < 1:
                raise InvalidInput(name, "must be at least 1")
        for name in ("deploys", "fleet_restarts"):
            if getattr(self, name) < 0:
                raise InvalidInput(name, "must be 0 or more")
        if self.deploys + self.fleet_restarts == 0:
            raise InvalidInput("deploys", "a deploy run makes at least one deploy or restart")
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


def submissions(keys: Sequence[str], steps: Sequence[Step]) -> list[tuple[float, str]]:
    """When each job is submitted (seconds from the start): half at once, the rest evenly
    until the last stop signal, so that jobs are waiting and running at every deploy."""
    end = steps[-1].at_s if steps else 0.0
    first = max(1, len(keys) // 2)
    rest = len(keys) - first
    times = [0.0] * first + [end * (index + 1) / rest for index in range(rest)]
    return list(zip(times, keys, strict=True))
