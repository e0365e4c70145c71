"""The deploy judge on hand-made ledgers and fates, no process started: a job lost, run
twice, run beside a live holder, acknowledged twice; a redelivery after a SIGKILL that is
no finding; a worker SIGKILLed with nothing in hand."""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.deploys.judge import (
    WorkerFate,
    fates_of_held,
    judge,
    judge_scheduled,
    with_fates,
)
from crashqueuelab.lab.deploys.plan import Scheduled
from crashqueuelab.lab.runs.executions import (
    ABANDONED,
    ENDED,
    KILLED,
    Execution,
    read_acknowledgements,
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
        "redelivered": 1,
        "acknowledged": 0,
        "stored": "successful",
        "status": "succeeded",
    }
    assert fates_of_held(fates, jobs) == {"w0": {"a": "ran again to completion"}}


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
            },
        ),
    ]
    assert anomalies[0].text == (
        "job a: lost: 1 execution(s), none ran to completion (the last: killed), and the"
        " store holds it picked"
    )
    assert fates_of_held(fates, jobs) == {"w0": {"a": "lost (the store holds it picked)"}}


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
