"""The fleet's acts on processes that are already gone, and a job's work cut by what the
library raised into it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crashqueuelab.lab.deploys.fleet import Fleet, Worker
from crashqueuelab.lab.deploys.plan import DeployPlan, Step, StopWhen
from crashqueuelab.lab.deploys.rollout import Rollout
from crashqueuelab.lab.deploys.workers import DeployWorkerSpec, work_for
from crashqueuelab.lab.faults.deploy import Replace
from crashqueuelab.lab.faults.signals import session_members
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.systems.contract import JobWork


def _spec(ledger: Path) -> DeployWorkerSpec:
    return DeployWorkerSpec("sqlite", "store", "w", str(ledger), {"a": 0.0}, 1.0, Inherited())


def test_a_signal_or_a_kill_for_a_worker_that_is_gone_does_nothing(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    process.wait(10)
    log = (tmp_path / "w.log").open("wb")
    worker = Worker("w0.0", 0, 0, tmp_path / "w0.0.ledger", process, 0.0, log)
    fleet = Fleet(tmp_path, lambda name, ledger: _spec(ledger), lambda: 1.0)
    fleet.workers.append(worker)
    assert worker.exit_word() is None
    fleet.kill(worker)  # its group is empty: nothing to kill, nothing recorded
    assert worker.killed_s is None
    assert fleet.poll() == [worker]
    assert worker.exit_word() == "exit 0"
    fleet.send(worker, "SIGTERM")
    assert worker.signals == []
    fleet.close(lambda seconds: None)
    assert session_members(process.pid) == []


def test_close_kills_what_a_worker_left_in_its_session_in_a_group_of_its_own(
    tmp_path: Path,
) -> None:
    # The worker exits at once and leaves a child behind, in a process group of its own as
    # RQ's work horse is: the session still holds it, as a container's cgroup would.
    child = "import os, time; os.setpgrp(); time.sleep(30)"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    process.wait(10)
    ends = time.monotonic() + 10
    while not session_members(process.pid) and time.monotonic() < ends:
        time.sleep(0.01)
    assert session_members(process.pid)
    log = (tmp_path / "w.log").open("wb")
    worker = Worker("w0.0", 0, 0, tmp_path / "w0.0.ledger", process, 0.0, log)
    fleet = Fleet(tmp_path, lambda name, ledger: _spec(ledger), lambda: 1.0)
    fleet.workers.append(worker)
    fleet.close(lambda seconds: None)
    ends = time.monotonic() + 10
    while session_members(process.pid) and time.monotonic() < ends:
        time.sleep(0.01)
    assert session_members(process.pid) == []


def test_work_the_library_cuts_says_what_cut_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupted)
    ledger = tmp_path / "w.ledger"
    with pytest.raises(KeyboardInterrupt):
        work_for(_spec(ledger))("a")
    start, cut = ledger.read_text().splitlines()
    assert start.startswith("start a ")
    assert start.endswith(f" {os.getpid()}")
    assert cut.startswith("cut a ")
    assert cut.endswith(" KeyboardInterrupt")


def test_the_work_a_library_is_handed_records_each_receipt_it_is_told_of(tmp_path: Path) -> None:
    ledger = tmp_path / "w.ledger"
    work = work_for(_spec(ledger))
    assert isinstance(work, JobWork)
    work.received("a")
    work.received("b")
    (first, second) = [line.split() for line in ledger.read_text().splitlines()]
    assert (first[:2], second[:2]) == (["received", "a"], ["received", "b"])
    assert float(first[2]) <= float(second[2])


def _sleepers(fleet: Fleet, tmp_path: Path, count: int, ledger: str = "") -> None:
    """``count`` processes that sleep, one a slot, as the fleet's generation-0 workers (each
    ledger holding ``ledger``, formatted with its pid, where given); ``fleet.close`` ends
    them."""
    for slot in range(count):
        process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
        )
        log = (tmp_path / f"w{slot}.log").open("wb")
        path = tmp_path / f"w{slot}.0.ledger"
        if ledger:
            path.write_text(ledger.format(pid=process.pid))
        fleet.workers.append(Worker(f"w{slot}.0", slot, 0, path, process, 0.0, log))


def test_a_stop_waits_for_its_worker_to_reach_its_loop_at_most_its_startup_time(
    tmp_path: Path,
) -> None:
    now = [0.0]
    fleet = Fleet(tmp_path, lambda name, ledger: _spec(ledger), lambda: now[0])
    try:
        _sleepers(fleet, tmp_path, 2)
        steps = [Step(0.0, (0,), "rolling", 0), Step(0.0, (1,), "rolling", 1)]
        plan = DeployPlan(workers=2, replace=Replace.AFTER_EXIT)
        rollout = Rollout(plan, fleet, steps, [], None, lambda: now[0], startup_s=5.0)  # type: ignore[arg-type]
        rollout.stop_due()
        # Still importing: the stop waits.
        assert (rollout.done_steps, fleet.workers[0].signals) == (0, [])
        fleet.workers[0].ledger.write_text(f"serving 0.5 {fleet.workers[0].pid}\n")
        now[0] = 1.0
        rollout.stop_due()
        assert fleet.workers[0].signals == [(1.0, "SIGTERM")]
        assert rollout.done_steps == 1  # the second worker never served: it waits on
        now[0] = 5.0
        rollout.stop_due()
        assert fleet.workers[1].signals == [(5.0, "SIGTERM")]
        assert rollout.done_steps == 2
    finally:
        fleet.close(lambda seconds: None)


def test_a_mid_job_stop_goes_once_its_worker_holds_a_job_outlasting_the_grace(
    tmp_path: Path,
) -> None:
    now, ledger_now = [0.0], [100.0]
    fleet = Fleet(tmp_path, lambda name, ledger: _spec(ledger), lambda: now[0])
    try:
        _sleepers(fleet, tmp_path, 2, ledger="serving 100.1 {pid}\n")
        first, second = fleet.workers
        steps = [Step(1.0, (0,), "rolling", 0), Step(2.0, (1,), "rolling", 1)]
        plan = DeployPlan(workers=2, grace_s=1.0, interval_s=1.0, stop_when=StopWhen.MID_JOB)
        assert plan.to_json()["stop_when"] == "mid-job"
        rollout = Rollout(
            plan, fleet, steps, [], None, lambda: now[0], startup_s=5.0,  # type: ignore[arg-type]
            work={"a": 0.4, "b": 1.3, "c": 3.0}, ledger_clock=lambda: ledger_now[0],
        )  # fmt: skip
        # Its job done: the stop waits.
        first.ledger.write_text(first.ledger.read_text() + "start a 100.5\nend a 100.9\n")
        now[0], ledger_now[0] = 1.1, 101.1
        rollout.stop_due()
        assert (rollout.done_steps, first.signals) == (0, [])
        # A job whose work outlasts the grace by less than MID_JOB_MARGIN_S (1.1 s left, the
        # grace 1.0 s), which a SIGKILL sent late could miss: the stop waits on.
        first.ledger.write_text(first.ledger.read_text() + "start b 101.0 7\n")
        now[0], ledger_now[0] = 1.2, 101.2
        rollout.stop_due()
        assert (rollout.done_steps, first.signals) == (0, [])
        # One that outlasts it: the stop goes, and says what it found.
        first.ledger.write_text(first.ledger.read_text() + "end b 101.3\nstart c 101.3 7\n")
        now[0], ledger_now[0] = 1.4, 101.4
        rollout.stop_due()
        assert (rollout.done_steps, first.signals) == (1, [(1.4, "SIGTERM")])
        assert (first.stop_due_s, first.held_when_stopped) == (1.0, ["c"])
        # The second worker never takes a job: its stop goes one interval after it fell due.
        now[0] = 2.9
        rollout.stop_due()
        assert (rollout.done_steps, second.signals) == (1, [])
        now[0] = 3.0
        rollout.stop_due()
        assert (rollout.done_steps, second.signals, second.held_when_stopped) == (
            2,
            [(3.0, "SIGTERM")],
            [],
        )
        record = first.to_json()
        assert (record["stop_due_s"], record["held_when_stopped"]) == (1.0, ["c"])
    finally:
        fleet.close(lambda seconds: None)


def test_a_worker_whose_library_tells_when_it_takes_jobs_is_stopped_only_from_then(
    tmp_path: Path,
) -> None:
    """Serving is not enough where the library tells (Celery boots for seconds after the
    process reached it); the stop's jobs come that long after its signals."""
    now = [0.0]
    fleet = Fleet(tmp_path, lambda name, ledger: _spec(ledger), lambda: now[0], tells_ready=True)
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        log = (tmp_path / "w0.log").open("wb")
        ledger = tmp_path / "w0.0.ledger"
        worker = Worker("w0.0", 0, 0, ledger, process, 0.0, log, tells_ready=True)
        fleet.workers.append(worker)
        assert worker.ready_at() is None  # no ledger yet
        plan = DeployPlan(workers=1, replace=Replace.AFTER_EXIT)
        after = {0: [(0.1, "job-02"), (0.2, "job-03")]}
        rollout = Rollout(
            plan, fleet, [Step(0.0, (0,), "rolling", 0)], [(0.5, "job-01")], None,  # type: ignore[arg-type]
            lambda: now[0], startup_s=5.0, after_stops=after,
        )  # fmt: skip
        ledger.write_text(f"serving 0.5 {process.pid}\nready torn\n")
        now[0] = 1.0
        rollout.stop_due()
        assert (rollout.done_steps, worker.signals, worker.ready_at()) == (0, [], None)
        ledger.write_text(f"serving 0.5 {process.pid}\nready 1.25\nready 9.0\n")
        now[0] = 1.5
        rollout.stop_due()
        assert (rollout.done_steps, worker.signals, worker.ready_at()) == (
            1,
            [(1.5, "SIGTERM")],
            1.25,
        )
        assert rollout.planned == [(0.5, "job-01"), (1.6, "job-02"), (1.7, "job-03")]
    finally:
        fleet.close(lambda seconds: None)


def test_the_work_a_library_is_handed_records_when_it_takes_jobs(tmp_path: Path) -> None:
    ledger = tmp_path / "w.ledger"
    work_for(_spec(ledger)).ready()
    (line,) = ledger.read_text().splitlines()
    assert line.split()[0] == "ready"
    assert float(line.split()[1]) <= time.monotonic()
