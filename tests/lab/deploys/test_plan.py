"""The rollout, worked out before anything starts: its stops, each job's work, when each
job is submitted; and what a plan refuses."""

from __future__ import annotations

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.deploys.plan import (
    DeployPlan,
    Replace,
    StopSignal,
    durations,
    job_keys,
    schedule,
    submissions,
)


def test_a_rolling_deploy_stops_surge_workers_at_a_time_then_the_fleet_restarts_at_once() -> None:
    plan = DeployPlan(workers=3, deploys=2, surge=2, fleet_restarts=1, grace_s=1.0, warmup_s=0.5)
    steps = schedule(plan)
    assert [(step.at_s, step.slots, step.kind, step.deploy) for step in steps] == [
        (0.5, (0, 1), "rolling", 0),
        (2.5, (2,), "rolling", 0),
        (4.5, (0, 1), "rolling", 1),
        (6.5, (2,), "rolling", 1),
        (8.5, (0, 1, 2), "fleet", 2),
    ]
    assert steps[-1].to_json() == {"at_s": 8.5, "slots": [0, 1, 2], "kind": "fleet"}


def test_the_interval_is_the_grace_and_a_second_unless_given() -> None:
    assert DeployPlan(grace_s=2.0).interval == 3.0
    assert DeployPlan(interval_s=0.25).interval == 0.25
    assert DeployPlan(interval_s=0.25).to_json()["interval_s"] == 0.25


def test_jobs_longer_and_shorter_than_the_grace_are_drawn_from_the_seed() -> None:
    keys = job_keys(10)
    plan = DeployPlan(jobs=10, grace_s=2.0, seed=7, long_share=0.3)
    work = durations(keys, plan)
    assert work == durations(keys, plan)
    assert work != durations(keys, DeployPlan(jobs=10, grace_s=2.0, seed=8))
    long_jobs = [key for key, seconds in work.items() if seconds > plan.grace_s]
    assert len(long_jobs) == 3
    assert all(4.0 <= work[key] <= 8.0 for key in long_jobs)
    assert all(0.05 <= work[key] <= 1.2 for key in keys if key not in long_jobs)


def test_two_jobs_or_more_have_one_of_each_length_whatever_the_share_rounds_to() -> None:
    keys = job_keys(2)
    few = durations(keys, DeployPlan(jobs=2, long_share=0.1))
    assert sorted(seconds > 1.0 for seconds in few.values()) == [False, True]
    none = durations(keys, DeployPlan(jobs=2, long_share=0.0))
    assert all(seconds < 1.0 for seconds in none.values())
    every = durations(job_keys(1), DeployPlan(jobs=1, long_share=1.0))
    assert all(seconds > 1.0 for seconds in every.values())


def test_half_the_jobs_are_submitted_at_once_the_rest_until_the_last_stop() -> None:
    plan = DeployPlan(workers=1, deploys=2, grace_s=1.0, warmup_s=1.0)
    keys = job_keys(4)
    planned = submissions(keys, schedule(plan))
    assert planned == [(0.0, "job-00"), (0.0, "job-01"), (1.5, "job-02"), (3.0, "job-03")]
    assert submissions(["a"], []) == [(0.0, "a")]


def test_keys_are_as_wide_as_the_largest() -> None:
    assert job_keys(3) == ["job-00", "job-01", "job-02"]
    assert job_keys(101)[-1] == "job-100"


def test_the_second_sigterm_mode_starts_with_sigterm() -> None:
    assert StopSignal.SIGTERM_TWICE.first == "SIGTERM"
    assert StopSignal.SIGQUIT.first == "SIGQUIT"
    assert DeployPlan(replace=Replace.AFTER_EXIT).to_json()["replace"] == "after-exit"


@pytest.mark.parametrize(
    ("plan", "name"),
    [
        (DeployPlan(workers=0), "workers"),
        (DeployPlan(jobs=0), "jobs"),
        (DeployPlan(surge=0), "surge"),
        (DeployPlan(deploys=-1), "deploys"),
        (DeployPlan(fleet_restarts=-1), "fleet_restarts"),
        (DeployPlan(deploys=0, fleet_restarts=0), "deploys"),
        (DeployPlan(workers=2, surge=3), "surge"),
        (DeployPlan(grace_s=0.0), "grace_s"),
        (DeployPlan(interval_s=0.0), "interval_s"),
        (DeployPlan(long_share=1.5), "long_share"),
        (DeployPlan(warmup_s=-1.0), "warmup_s"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_naming_its_option(plan: DeployPlan, name: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        plan.check()
    assert refused.value.field == name
