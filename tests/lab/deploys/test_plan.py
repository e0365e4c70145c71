"""The rollout, worked out before anything starts: its stops, each job's work, when each
job is submitted; and what a plan refuses."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from crashqueuelab.cli import build_parser
from crashqueuelab.cli.deploys import plan_of
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.deploys.plan import (
    SCHEDULE_LEAD_S,
    SCHEDULER_POLL_S,
    DeployPlan,
    StopSignal,
    StopWhen,
    after_stops,
    due_tolerance,
    durations,
    job_keys,
    schedule,
    scheduled_jobs,
    submissions,
)
from crashqueuelab.lab.faults.deploy import Replace
from crashqueuelab.lab.pages.deploys import command_of


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
    # Ended before the stops: no job arrives during them.
    DeployPlan(workers=2, deploys=2, warmup_s=1.0, submit_until_s=7.0).check()
    early = submissions(keys, schedule(plan), until_s=9.0, end_s=2.0)
    assert early == [(0.0, "job-00"), (0.0, "job-01"), (1.0, "job-02"), (2.0, "job-03")]


def test_jobs_at_stops_come_right_after_each_stops_signals_the_others_as_before() -> None:
    plan = DeployPlan(workers=1, deploys=2, grace_s=1.0, warmup_s=1.0, jobs=6, submit_at_stops=2)
    plan.check()
    assert plan.to_json()["submit_at_stops"] == 2
    left, after = after_stops(job_keys(6), schedule(plan), 2)
    assert left == ["job-00", "job-01"]
    assert after == {
        0: [(0.067, "job-02"), (0.133, "job-03")],
        1: [(0.067, "job-04"), (0.133, "job-05")],
    }
    assert submissions(left, schedule(plan)) == [(0.0, "job-00"), (3.0, "job-01")]
    assert after_stops(job_keys(2), schedule(plan), 0) == (["job-00", "job-01"], {})


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
        (DeployPlan(scheduled=-1), "scheduled"),
        (DeployPlan(jobs=2, scheduled=3), "scheduled"),
        (DeployPlan(due_tolerance_s=0.0), "due_tolerance_s"),
        (DeployPlan(submit_until_s=0.0), "submit_until_s"),
        # Past the last stop (7 s: two workers stopped one at a time, twice, from 1 s on, 2 s
        # apart): the run would stop waiting before the last jobs were submitted.
        (DeployPlan(workers=2, deploys=2, warmup_s=1.0, submit_until_s=7.5), "submit_until_s"),
        (DeployPlan(failovers=1, submit_until_s=1.0), "submit_until_s"),
        (DeployPlan(server_restarts=1, submit_until_s=1.0), "submit_until_s"),
        (DeployPlan(submit_at_stops=-1), "submit_at_stops"),
        (DeployPlan(failovers=1, stop_when=StopWhen.MID_JOB), "stop_when"),
        (DeployPlan(server_restarts=1, stop_when=StopWhen.MID_JOB), "stop_when"),
        (DeployPlan(submit_at_stops=1, submit_until_s=1.0), "submit_at_stops"),
        (DeployPlan(failovers=1, submit_at_stops=1), "submit_at_stops"),
        (DeployPlan(server_restarts=1, submit_at_stops=1), "submit_at_stops"),
        # Two stops of one worker each, two jobs after each: none left for the start.
        (DeployPlan(workers=1, deploys=2, jobs=4, submit_at_stops=2), "submit_at_stops"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_naming_its_option(plan: DeployPlan, name: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        plan.check()
    assert refused.value.field == name


def test_scheduled_jobs_are_due_in_the_grace_windows_after_them_and_across_the_rollout() -> None:
    plan = DeployPlan(workers=2, deploys=3, grace_s=1.0, jobs=12, scheduled=9, seed=4)
    steps = schedule(plan)
    keys = job_keys(plan.jobs)
    later = scheduled_jobs(keys, steps, plan)
    assert later == scheduled_jobs(keys, steps, plan)
    assert later != scheduled_jobs(keys, steps, DeployPlan(deploys=3, jobs=12, scheduled=9))
    assert len({job.key for job in later}) == 9
    assert [job.window for job in later] == ["grace", "replacement", "rollout"] * 3
    stops = [step.at_s for step in steps]
    for job in later:
        # Due after submission by the lead, inside what its window says.
        assert job.due_s - job.submit_s >= SCHEDULE_LEAD_S - 0.001
        if job.window == "grace":
            assert any(at <= job.due_s <= at + plan.grace_s for at in stops)
        elif job.window == "replacement":
            assert any(at + plan.grace_s <= job.due_s <= at + plan.grace_s + 1 for at in stops)
        else:
            assert stops[0] <= job.due_s <= stops[-1] + plan.grace_s
    # Half submitted before the first stop, the rest during the deploys.
    assert [job.submit_s == 0.0 for job in later][:5] == [True] * 5
    assert all(job.submit_s >= plan.warmup_s for job in later[5:])
    assert later[0].to_json().keys() == {"submit_s", "due_s", "window"}


def test_no_scheduled_jobs_unless_asked_and_the_other_draws_stay_what_they_were() -> None:
    plan = DeployPlan(jobs=6)
    keys = job_keys(6)
    assert scheduled_jobs(keys, schedule(plan), plan) == []
    with_some = DeployPlan(jobs=6, scheduled=3)
    assert durations(keys, with_some) == durations(keys, plan)
    every = DeployPlan(jobs=2, scheduled=2)
    assert len(scheduled_jobs(job_keys(2), schedule(every), every)) == 2
    assert submissions([], schedule(every)) == []


def test_the_due_tolerance_is_the_longest_poll_the_grace_and_the_longest_job_unless_given() -> None:
    plan = DeployPlan(grace_s=2.0)
    tolerance, basis = due_tolerance(plan, {"a": 0.5, "b": 3.25})
    assert tolerance == SCHEDULER_POLL_S + 2.0 + 3.25
    assert "procrastinate" in basis
    assert due_tolerance(DeployPlan(due_tolerance_s=1.5), {"a": 9.0}) == (1.5, "given by the run")
    assert DeployPlan(scheduled=2).to_json()["scheduled"] == 2


@pytest.mark.parametrize(
    "plan",
    [
        DeployPlan(workers=3, deploys=1, surge=2, grace_s=2.5, submit_until_s=2.0, scheduled=2),
        DeployPlan(server_restarts=2, interval_s=4.0, replace=Replace.AFTER_EXIT),
        DeployPlan(failovers=1, promote_after_s=0.5, fleet_restarts=1, due_tolerance_s=3.0),
        DeployPlan(jobs=12, submit_at_stops=2),
    ],
)
def test_the_pages_command_makes_the_plan_it_shows_again(plan: DeployPlan, tmp_path: Path) -> None:
    report = {
        "spec": "sqlite",
        "plan": plan.to_json(),
        "lease_s": None,
        "recovery": {"basis": "the grace", "wait_s": 9.0},
    }
    words = shlex.split(command_of(report, tmp_path / "again"))
    assert words[0] == "crashqueuelab"
    again = plan_of(build_parser().parse_args(words[1:]))
    assert again.to_json() == plan.to_json()
