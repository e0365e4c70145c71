"""The deploy judge on hand-made ledgers and fates, no process started: a job lost, run
twice, run beside a live holder, acknowledged twice; a redelivery after a SIGKILL that is
no finding; a worker SIGKILLed with nothing in hand."""

from __future__ import annotations

import os
import subprocess

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.deploys.judge import (
    WorkerFate,
    by_its_guard,
    fates_of_held,
    judge,
    judge_scheduled,
    with_fates,
)
from crashqueuelab.lab.deploys.plan import Scheduled
from crashqueuelab.lab.runs.executions import (
    ABANDONED,
    CUT,
    ENDED,
    KILLED,
    Death,
    DeathWatch,
    Execution,
    read_acknowledgements,
    with_deaths,
)
from crashqueuelab.systems.contract import JobStatus, StoredJob

DONE = StoredJob("successful", JobStatus.SUCCEEDED, 1)
PICKED = StoredJob("picked", JobStatus.LEASED, 1)


def test_an_open_execution_ends_with_its_workers_sigkill_or_its_exit() -> None:
    runs = [
        Execution("a", "w0", 1.0, None),
        Execution("b", "w1", 1.0, None),
        Execution("c", "w2", 1.0, None),
        Execution("d", "w0", 1.0, 2.0),
    ]
    fates = {
        "w0": WorkerFate("w0", stop_s=2.5, killed_s=3.5),
        "w1": WorkerFate("w1", stop_s=2.5, exit_s=2.6),
    }
    marked = with_fates(runs, fates)
    assert [(run.how, run.end_s) for run in marked] == [
        (KILLED, 3.5),
        (ABANDONED, 2.6),
        (ENDED, None),
        (ENDED, 2.0),
    ]
    assert marked[0].surely_until == 3.5


def test_a_job_redelivered_after_a_sigkill_cut_it_is_no_finding() -> None:
    runs = [Execution("a", "w0", 1.0, 3.0, how=KILLED, alive_until=3.0)]
    runs.append(Execution("a", "w1", 5.0, 7.0))
    fates = {"w0": WorkerFate("w0", stop_s=2.0, killed_s=3.0, held_when_killed=("a",))}
    anomalies, jobs = judge(["a"], runs, fates, {}, {"a": DONE}, "SIGTERM")
    assert anomalies == []
    assert jobs["a"] == {
        "runs": 2,
        "completed": 1,
        "cut": 1,
        "ended_by_its_guard": 0,
        "redelivered": 1,
        "acknowledged": 0,
        "stored": "successful",
        "status": "succeeded",
    }
    assert fates_of_held(fates, jobs) == {"w0": {"a": "ran again to completion"}}


DEAD = StoredJob("failed", JobStatus.DEAD, 2)


def test_a_job_the_librarys_guard_ended_each_time_and_the_store_gave_up_is_not_lost() -> None:
    # Cut twice by the library's timeout (an exception raised into the work), then dead in
    # the store: given up within its attempts, a terminal state.
    runs = [
        Execution("a", "w0", 1.0, 3.0, how=CUT, why="JobTimeoutException"),
        Execution("a", "w0", 3.5, 5.5, how=CUT, why="JobTimeoutException"),
    ]
    anomalies, jobs = judge(["a"], runs, {}, {}, {"a": DEAD}, "SIGTERM", max_attempts=2)
    assert anomalies == []
    assert (jobs["a"]["ended_by_its_guard"], jobs["a"]["redelivered"]) == (2, 1)
    # Still held (not dead): nothing gave it up, it is lost.
    anomalies, _ = judge(["a"], runs, {}, {}, {"a": PICKED}, "SIGTERM", max_attempts=2)
    assert [a.kind for a in anomalies] == [Kind.LOST_IN_DEPLOY]


def test_a_job_the_guard_ended_more_often_than_its_attempts_is_beyond_its_limit() -> None:
    runs = [Execution("a", "w0", float(i), i + 0.5, how=CUT) for i in range(3)]
    anomalies, _ = judge(["a"], runs, {}, {}, {"a": DEAD}, "SIGTERM", max_attempts=2)
    assert [(a.kind, a.attempt, a.limit) for a in anomalies] == [(Kind.ATTEMPT_BEYOND_LIMIT, 3, 2)]
    assert anomalies[0].text == (
        "job a: run 3 times, 3 of them ended by the library's own guard; its attempts are 2"
    )


def test_a_work_process_the_guard_killed_under_a_live_worker_is_an_attempt() -> None:
    """RQ's work horse killed past its job timeout: its execution ends where the lab saw
    the process gone (``with_deaths``), and the job's next run is a retry, not a run beside
    a live holder; a kill by the lab's SIGKILL is not the guard's."""
    opened = [Execution("a", "w0", 1.0, None, pid=41), Execution("a", "w1", 4.0, 6.0)]
    runs = with_deaths(opened, {("w0", "a", 1.0): Death(last_alive=2.0, first_gone=2.1)})
    fates = {"w0": WorkerFate("w0")}
    anomalies, jobs = judge(["a"], runs, fates, {}, {"a": DONE}, "SIGTERM", max_attempts=2)
    assert anomalies == []
    assert (jobs["a"]["ended_by_its_guard"], jobs["a"]["redelivered"]) == (1, 1)
    assert by_its_guard(runs[0], fates)
    lab_killed = Execution("a", "w0", 1.0, 3.0, how=KILLED)
    assert not by_its_guard(lab_killed, {"w0": WorkerFate("w0", stop_s=2.0, killed_s=3.0)})
    assert not by_its_guard(Execution("a", "w0", 1.0, None, how=KILLED), fates)
    assert not by_its_guard(Execution("a", "w0", 1.0, 2.0, how=ABANDONED), fates)


def test_the_death_watch_notes_a_work_process_gone_under_a_live_worker_only() -> None:
    with subprocess.Popen(["true"]) as finished:  # a process that ran and was reaped
        finished.wait(timeout=30)
    dead_pid = finished.pid
    ticks = iter([10.0, 11.0])
    watch = DeathWatch(lambda: next(ticks))
    me = os.getpid()
    runs = [
        Execution("a", "w0", 1.0, None, pid=dead_pid),  # its own process, gone
        Execution("b", "w0", 1.0, None, pid=me),  # alive
        Execution("c", "w0", 1.0, None, pid=1234),  # the worker's own process
        Execution("d", "w9", 1.0, None, pid=dead_pid),  # a worker not watched
        Execution("e", "w0", 1.0, 2.0, pid=dead_pid),  # ended
    ]
    watch.watch(runs, {"w0": 1234})
    assert watch.deaths == {("w0", "a", 1.0): Death(last_alive=1.0, first_gone=10.0)}
    assert watch.seen_alive == {("w0", "b", 1.0): 10.0}
    watch.watch(runs, {"w0": 1234})  # noted once
    assert list(watch.deaths) == [("w0", "a", 1.0)]


def test_a_job_never_completed_and_not_done_in_the_store_is_lost() -> None:
    runs = [Execution("a", "w0", 1.0, 3.0, how=KILLED, alive_until=3.0)]
    fates = {"w0": WorkerFate("w0", stop_s=2.0, killed_s=3.0, held_when_killed=("a",))}
    stored = {"a": PICKED}
    anomalies, jobs = judge(["a", "b"], runs, fates, {}, stored, "SIGTERM")
    assert [(a.kind, a.job, dict(a.facts)) for a in anomalies] == [
        (
            Kind.LOST_IN_DEPLOY,
            "a",
            {
                "executions": 1,
                "stored": "picked",
                "last_end": "killed",
                "signal": "SIGTERM",
                "scheduled": False,
                "waiting": False,
            },
        ),
        (
            Kind.LOST_IN_DEPLOY,
            "b",
            {
                "executions": 0,
                "stored": "nowhere",
                "last_end": "never ran",
                "signal": "SIGTERM",
                "scheduled": False,
                "waiting": False,
            },
        ),
    ]
    assert anomalies[0].text == (
        "job a: lost: 1 execution(s), none ran to completion (the last: killed), and the"
        " store holds it picked"
    )
    assert fates_of_held(fates, jobs) == {"w0": {"a": "lost (the store holds it picked)"}}


def test_a_job_the_store_still_holds_waiting_is_not_done_and_not_called_lost() -> None:
    """A job never run that the store still holds queued after the recovery wait is no
    gone job: its finding says "not done" and ``waiting``, which the headline and the page
    count apart from the lost."""
    queued = StoredJob("queued", JobStatus.PENDING, 0)
    anomalies, _ = judge(["a"], [], {}, {}, {"a": queued}, "SIGTERM")
    assert [(a.kind, a.facts["waiting"]) for a in anomalies] == [(Kind.LOST_IN_DEPLOY, True)]
    assert anomalies[0].text == (
        "job a: not done: 0 execution(s), none ran to completion (the last: never ran), and"
        " the store still holds it queued, waiting to be claimed, after the recovery wait"
    )


def test_a_job_still_running_at_the_end_and_not_done_is_lost_so_said() -> None:
    runs = [Execution("a", "w0", 1.0, None)]
    anomalies, _ = judge(["a"], runs, {}, {}, {"a": PICKED}, "SIGINT")
    assert anomalies[0].facts["last_end"] == "still running"


def test_a_job_done_in_the_store_is_not_lost_even_without_a_completed_execution() -> None:
    runs = [Execution("a", "w0", 1.0, 2.0, how=ABANDONED)]
    anomalies, _ = judge(["a"], runs, {}, {}, {"a": DONE}, "SIGTERM")
    assert anomalies == []


def test_without_a_reader_only_the_ledgers_judge() -> None:
    anomalies, jobs = judge(["a"], [Execution("a", "w0", 1.0, 2.0)], {}, {}, None, "SIGTERM")
    assert anomalies == []
    assert jobs["a"]["stored"] is None


def test_a_job_completed_that_the_store_does_not_hold_done_is_unfinished() -> None:
    runs = [Execution("a", "w0", 1.0, 2.0)]
    anomalies, _ = judge(["a"], runs, {}, {}, {"a": PICKED}, "SIGTERM")
    assert [(a.kind, dict(a.facts)) for a in anomalies] == [
        (Kind.UNFINISHED, {"state": "picked", "ran": True})
    ]


def test_a_job_run_again_after_it_completed_is_ran_twice_with_what_its_worker_did() -> None:
    runs = [
        Execution("a", "w0", 1.0, 2.0),
        Execution("a", "w1", 4.0, 5.0),
        Execution("b", "w2", 1.0, 2.0),
        Execution("b", "w1", 6.0, 7.0),
        Execution("c", "w3", 1.0, 2.0),
        Execution("c", "w1", 8.0, 9.0),
    ]
    fates = {
        "w0": WorkerFate("w0", stop_s=1.5, killed_s=2.5),
        "w2": WorkerFate("w2", stop_s=1.5, exit_s=2.1),
    }
    done = dict.fromkeys("abc", DONE)
    anomalies, jobs = judge(["a", "b", "c"], runs, fates, {}, done, "SIGTERM")
    assert [(a.kind, a.job, dict(a.facts)) for a in anomalies] == [
        (Kind.RAN_TWICE, "a", {"times": 2, "worker_then": "sigkilled", "acknowledged": "unknown"}),
        (Kind.RAN_TWICE, "b", {"times": 2, "worker_then": "exited", "acknowledged": "unknown"}),
        (Kind.RAN_TWICE, "c", {"times": 2, "worker_then": "alive", "acknowledged": "unknown"}),
    ]
    assert jobs["a"]["completed"] == 2


def test_the_lab_workers_ack_lines_tell_a_kill_before_the_acknowledgement_from_a_duplicate() -> (
    None
):
    runs = [
        Execution("a", "w0", 1.0, 2.0),
        Execution("a", "w1", 4.0, 5.0),
        Execution("b", "w2", 1.0, 2.0),
        Execution("b", "w1", 4.0, 5.0),
    ]
    fates = {
        "w0": WorkerFate("w0", stop_s=1.5, killed_s=2.01, acknowledges_in_ledger=True),
        "w1": WorkerFate("w1", acknowledges_in_ledger=True),
        "w2": WorkerFate("w2", stop_s=1.5, killed_s=3.0, acknowledges_in_ledger=True),
    }
    acks = {
        "w1": [("a", 5.1), ("b", 5.1)],
        "w2": [("b", 2.05)],
    }
    done = dict.fromkeys("ab", DONE)
    anomalies, jobs = judge(["a", "b"], runs, fates, acks, done, "SIGTERM")
    # a: its work ended, its worker was killed before it acknowledged: at least once.
    assert jobs["a"]["redelivered"] == 1
    # b: acknowledged, then run and acknowledged again.
    assert [(a.kind, a.job, dict(a.facts)) for a in anomalies] == [
        (Kind.RAN_TWICE, "b", {"times": 2, "worker_then": "sigkilled", "acknowledged": "yes"}),
        (Kind.ACKNOWLEDGED_TWICE, "b", {"times": 2}),
    ]


def test_a_run_whose_acknowledgement_failed_is_redelivered_and_a_later_runs_ack_is_its_own() -> (
    None
):
    """One worker ran each job twice: ``a``'s first acknowledgement failed (the queue told
    it failure across a failover) and only the second run's ack is in its ledger, so the
    second run is a redelivery; ``c`` was acknowledged after each run, so it ran twice."""
    runs = [
        Execution("a", "w0", 1.0, 2.0),
        Execution("a", "w0", 5.0, 6.0),
        Execution("c", "w0", 7.0, 8.0),
        Execution("c", "w0", 9.0, 10.0),
    ]
    fates = {"w0": WorkerFate("w0", acknowledges_in_ledger=True)}
    acks = {"w0": [("a", 6.1), ("c", 8.1), ("c", 10.1)]}
    anomalies, jobs = judge(["a", "c"], runs, fates, acks, dict.fromkeys("ac", DONE), "SIGTERM")
    assert jobs["a"]["redelivered"] == 1
    assert [(a.kind, a.job, dict(a.facts)) for a in anomalies] == [
        (Kind.RAN_TWICE, "c", {"times": 2, "worker_then": "alive", "acknowledged": "yes"}),
        (Kind.ACKNOWLEDGED_TWICE, "c", {"times": 2}),
    ]


def test_a_job_run_while_its_holder_still_ran_is_beside_a_live_holder() -> None:
    runs = [
        Execution("a", "w0", 1.0, 5.0, how=KILLED, alive_until=5.0),
        Execution("a", "w1", 3.0, 4.0),
        Execution("b", "w0", 1.0, 6.0),
        Execution("b", "w1", 0.5, 2.0),
    ]
    fates = {"w0": WorkerFate("w0", stop_s=2.0, killed_s=5.0, held_when_killed=("a", "b"))}
    done = dict.fromkeys("ab", DONE)
    anomalies, _ = judge(["a", "b"], runs, fates, {}, done, "SIGTERM")
    assert [(a.kind, a.job, dict(a.facts)) for a in anomalies] == [
        (Kind.RAN_BESIDE_LIVE_HOLDER, "a", {"holder": "w0", "holder_stopping": True}),
        (Kind.RAN_BESIDE_LIVE_HOLDER, "b", {"holder": "w1", "holder_stopping": False}),
    ]
    assert anomalies[0].text == (
        "job a: ran beside a live holder: by w0 from 1.00 s to 5.00 s (killed), then by w1"
        " from 3.00 s to 4.00 s (ended)"
    )


def test_ack_lines_are_read_and_torn_ones_skipped() -> None:
    text = "start a 1.0 7\nack a 2.5\nack b x\nack c\nend a 2.0\nack d 3.0"
    assert read_acknowledgements(text) == [("a", 2.5), ("d", 3.0)]


SCHEDULED = [
    Scheduled("on-time", 0.0, 2.0, "grace"),
    Scheduled("early", 0.0, 2.0, "grace"),
    Scheduled("late", 1.5, 2.0, "replacement"),
    Scheduled("never", 1.5, 3.0, "rollout"),
    Scheduled("twice", 0.0, 2.0, "rollout"),
]
LEDGER = [
    Execution("on-time", "w0", 2.0, 2.5),
    Execution("early", "w0", 1.9, 2.2),
    Execution("late", "w1", 5.01, 5.5),
    Execution("twice", "w1", 2.1, 2.3),
    Execution("twice", "w0", 2.6, 2.9),
]


def test_each_scheduled_job_is_on_time_early_late_never_or_twice_from_its_ledger() -> None:
    anomalies, jobs = judge_scheduled(SCHEDULED, LEDGER, 3.0, 1.0, {"twice"})
    assert {key: job["verdict"] for key, job in jobs.items()} == {
        "on-time": "on time",
        "early": "early",
        "late": "late",
        "never": "never",
        "twice": "twice",
    }
    assert [(a.kind, a.job) for a in anomalies] == [
        (Kind.SCHEDULED_EARLY, "early"),
        (Kind.SCHEDULED_LATE, "late"),
    ]
    early, late = anomalies
    assert early.facts == {"early_ms": 100, "window": "grace", "submitted": "before"}
    assert late.facts == {
        "late_ms": 3010,
        "tolerance_ms": 3000,
        "window": "replacement",
        "submitted": "during",
    }
    assert jobs["twice"]["starts_s"] == [2.1, 2.6]
    assert jobs["late"]["first_start_after_due_s"] == 3.01
    assert jobs["never"]["starts_s"] == []
    assert jobs["never"]["first_start_after_due_s"] is None


def test_a_start_at_its_due_time_or_at_the_tolerance_is_on_time() -> None:
    planned = [Scheduled("a", 0.0, 2.0, "grace"), Scheduled("b", 0.0, 2.0, "grace")]
    # The clocks' slack before, the whole tolerance after.
    runs = [Execution("a", "w0", 1.996, 2.5), Execution("b", "w0", 5.0, 5.5)]
    anomalies, jobs = judge_scheduled(planned, runs, 3.0, 1.0, ())
    assert anomalies == []
    assert {job["verdict"] for job in jobs.values()} == {"on time"}


def test_a_scheduled_job_never_run_is_lost_and_its_finding_says_it_was_scheduled() -> None:
    anomalies, _ = judge(["s", "t"], [], {}, {}, {}, "SIGTERM", scheduled={"s"})
    assert [(a.kind, a.job, a.facts["scheduled"]) for a in anomalies] == [
        (Kind.LOST_IN_DEPLOY, "s", True),
        (Kind.LOST_IN_DEPLOY, "t", False),
    ]
