"""Deploys in a chaos run: SIGTERM to a batch of workers, a grace period, then SIGKILL of
each one's session; the schedule, the rollout's checks, the grace's end, the verdict, and
one real run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.chaos.plan import check_parameters
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.lab.chaos.schedule import plan, recorded
from crashqueuelab.lab.chaos.stops import Stops
from crashqueuelab.lab.chaos.verdict import judge_deploys, promises
from crashqueuelab.lab.chaos.worklog import WorkerLog, lease_line
from crashqueuelab.lab.faults.deploy import DEPLOY, Rollout
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.signals import session_members
from crashqueuelab.lab.pages.render import write_report
from crashqueuelab.lab.workloads.shutdown import stop_on
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.sqlite import sqlite_system
from tests.conftest import RunCli


def test_the_seed_spreads_the_deploys_among_the_other_faults_and_a_record_replays_them() -> None:
    one = plan(seed=3, jobs=1000, workers=4, kills=20, pauses=2, deploys=6)
    assert one == plan(seed=3, jobs=1000, workers=4, kills=20, pauses=2, deploys=6)
    assert sum(f.kind is FaultKind.DEPLOY for f in one) == 6
    marks = [f.after_finished for f in one if f.kind is FaultKind.DEPLOY]
    assert marks == sorted(marks)
    assert max(marks) < 850
    # Spread over the run, not bunched: the deploys' marks span most of it.
    assert marks[-1] - marks[0] > 400
    assert recorded([f.to_json() for f in one]) == one


@pytest.mark.parametrize(
    ("rollout", "workers", "words"),
    [
        (Rollout(surge=5), 4, "surge: 5 workers at a time, but the run has only 4"),
        (Rollout(surge=0), 4, "surge"),
        (Rollout(grace_s=0.0), 4, "grace_s: 0.0 is not a finite number above zero"),
        (Rollout(grace_s=-1.0), 4, "grace_s"),
        (Rollout(replace="never"), 4, "replace: 'never': at-once or after-exit"),  # type: ignore[arg-type]
    ],
)
def test_a_rollout_the_run_cannot_carry_out_is_refused(
    rollout: Rollout, workers: int, words: str
) -> None:
    with pytest.raises(InvalidInput, match=words):
        rollout.check(workers)


def test_deploys_count_among_the_faults_the_jobs_must_make_room_for() -> None:
    with pytest.raises(InvalidInput, match="deploys"):
        check_parameters(jobs=10, workers=2, kills=0, pauses=0, cuts=0, deploys=-1)
    with pytest.raises(InvalidInput, match="2 kills and 0 pauses beside 8 deploys need at least"):
        check_parameters(jobs=10, workers=2, kills=2, pauses=0, cuts=0, deploys=8)
    check_parameters(jobs=100, workers=2, kills=2, pauses=0, cuts=0, deploys=8)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--deploys", "-1"], "argument --deploys: -1 is negative"),
        (["--deploys", "2", "--surge", "5", "--workers", "4"], "surge: 5 workers at a time"),
        (["--deploys", "2", "--grace-s", "0"], "argument --grace-s: 0 is not a finite number"),
        (["--deploys", "2", "--grace-s", "-1"], "argument --grace-s"),
        (["--surge", "0"], "argument --surge: must be greater than zero"),
        (["--replace", "never"], "argument --replace: invalid choice"),
    ],
)
def test_bad_deploy_options_are_a_one_line_usage_error(
    tmp_path: Path, argv: list[str], words: str, run_cli: RunCli
) -> None:
    from crashqueuelab import cli

    outcome = run_cli("chaos", "--output-directory", str(tmp_path / "c"), *argv)
    assert outcome.code == cli.EXIT_USAGE
    message = outcome.result["error"]["message"]
    assert words in message
    assert "\n" not in message
    assert f"crashqueuelab: not ok: {message}" in outcome.stderr
    assert not (tmp_path / "c").exists()


@dataclass
class _Process:
    """A worker process as the run sees it: a pid, an exit code once it is reaped."""

    pid: int
    exitcode: int | None = None
    joined: list[float | None] = field(default_factory=list)

    def join(self, timeout: float | None = None) -> None:
        self.joined.append(timeout)


def _stopped(worker_id: str, slot: int, term: float, grace_s: float = 1.0) -> dict[str, Any]:
    return {"worker_id": worker_id, "worker_slot": slot, "sigterm_at_s": term,
            "grace_end_s": term + grace_s}  # fmt: skip


def test_a_stopped_worker_has_its_grace_then_its_session_is_killed_holding_what_its_log_shows() -> (
    None
):
    now = [10.0]
    killed: list[int] = []
    quick, slow = _Process(101), _Process(202)

    def kill_session(pid: int) -> list[int]:
        killed.append(pid)
        slow.exitcode = -signal.SIGKILL  # what the SIGKILL leaves once it is reaped
        return [pid, pid + 1]

    stops = Stops(lambda: now[0], kill_session)
    stops.hold(0, "worker-0.1", quick, (fast := _stopped("worker-0.1", 0, 10.0)))
    stops.hold(1, "worker-1.1", slow, (late := _stopped("worker-1.1", 1, 10.0)))
    log = WorkerLog()
    log.add(lease_line("claim", "job-a", "t1", 9.9, 9.8) + lease_line("claim", "job-b", "t2", 9.9))
    log.add(lease_line("acking", "job-b", "t2", 9.95))
    logs = {"worker-1.1": log}
    assert stops.in_slot(1, "worker-1.1")
    assert not stops.in_slot(1, "worker-1.2")
    now[0] = 10.5
    assert stops.settle(logs.get) == []
    quick.exitcode = 0
    now[0] = 10.6
    assert [each.worker_id for each in stops.settle(logs.get)] == ["worker-0.1"]
    assert fast["exited_within_grace"] is True
    assert fast["exit_code"] == 0
    assert fast["exited_at_s"] == 10.6
    assert "killed_at_s" not in fast
    now[0] = 10.99
    assert stops.settle(logs.get) == []
    now[0] = 11.0
    assert [each.worker_id for each in stops.settle(logs.get)] == ["worker-1.1"]
    assert killed == [202]
    assert slow.joined
    assert late["exited_within_grace"] is False
    assert late["killed_at_s"] == 11.0
    assert late["session_when_killed"] == [202, 203]
    assert late["held_when_killed"] == ["job-a"]
    assert late["unanswered_when_killed"] == ["job-b"]
    assert late["exit_code"] == -signal.SIGKILL
    assert stops.worker_ids() == []


def test_the_end_of_the_run_kills_a_worker_before_its_grace_ends_and_says_so() -> None:
    stops = Stops(lambda: 3.0, lambda pid: [pid])
    stopped = _stopped("worker-2.4", 2, 2.5)
    stops.hold(2, "worker-2.4", _Process(7), stopped)
    assert stops.settle(lambda worker_id: None) == []
    (ended,) = stops.settle(lambda worker_id: None, force=True)
    assert ended.stopped["cut_short_by_end_of_run"] is True
    assert stopped["held_when_killed"] == []
    assert stopped["exited_within_grace"] is False


@dataclass
class _Slot:
    index: int
    worker_id: str
    process: Any
    started_at: float = 0.0


@dataclass
class _Target:
    """A run of three workers, as a deploy sees it; slot 1 cannot be hit (paused)."""

    workers: list[_Slot]
    rollout: Rollout
    started: float = 0.0
    held: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def ready_for(self, planned: int) -> _Slot | None:
        for step in range(len(self.workers)):
            slot = self.workers[(planned + step) % len(self.workers)]
            if slot.index != 1:
                return slot
        return None

    def hold_stopping(self, slot: int, stopped: dict[str, Any]) -> None:
        self.held.append((slot, stopped))


class _Child:
    """A real child process, to be SIGTERMed."""

    def __init__(self) -> None:
        code = "import time; time.sleep(30)"
        self.popen = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        self.pid = self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()


def test_a_deploy_sigterms_its_batch_round_the_table_then_hands_each_to_the_run() -> None:
    children = [_Child() for _ in range(3)]
    try:
        workers = [_Slot(index, f"worker-{index}.1", child) for index, child in enumerate(children)]
        target = _Target(workers, Rollout(grace_s=2.0, surge=2))
        planned = replace(plan(seed=1, jobs=100, workers=3, kills=0, pauses=0, deploys=1)[0],
                          worker_slot=2, delay_ms=0.0)  # fmt: skip
        record = DEPLOY.deliver(planned, target)
        assert record is not None
        assert (record["kind"], record["surge"], record["grace_s"]) == ("deploy", 2, 2.0)
        # Slot 2, then round the table past the slot that cannot be hit.
        assert [stopped["worker_id"] for stopped in record["workers"]] == [
            "worker-2.1",
            "worker-0.1",
        ]
        assert [slot for slot, _ in target.held] == [2, 0]
        for stopped in record["workers"]:
            assert stopped["grace_end_s"] == pytest.approx(stopped["sigterm_at_s"] + 2.0)
        for index in (2, 0):
            assert children[index].popen.wait(10) == -signal.SIGTERM
        assert children[1].exitcode is None
        # Two workers at a time when only two can be hit, but one of them twice: not yet.
        assert DEPLOY.deliver(planned, replace(target, rollout=Rollout(surge=3))) is None
        # A worker that is gone is not replaced and stopped at once (its replacement must
        # first begin): the run respawns it, and the deploy waits.
        assert DEPLOY.deliver(planned, target) is None
        assert len(target.held) == 2
    finally:
        for child in children:
            child.popen.kill()
            child.popen.wait(10)


def test_a_stop_signal_asks_and_a_second_changes_nothing() -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        stop = stop_on(signal.SIGUSR1)
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.wait(5)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _log(*lines: str) -> WorkerLog:
    log = WorkerLog()
    log.add("".join(lines))
    return log


def test_the_verdict_classes_each_deployed_worker_and_says_what_became_of_the_jobs_it_held() -> (
    None
):
    delivered: list[dict[str, Any]] = [
        {"kind": "SIGKILL", "at_s": 0.5},
        {"kind": "deploy", "at_s": 1.0, "workers": [
            {"worker_id": "worker-0.1", "exited_within_grace": True, "exit_code": 0},
            {"worker_id": "worker-1.1", "exited_within_grace": False, "exit_code": -9,
             "killed_at_s": 2.0, "held_when_killed": ["a", "b", "c"],
             "unanswered_when_killed": ["d"]},
        ]},
        {"kind": "deploy", "skipped": "no work left"},
    ]  # fmt: skip
    logs = {
        "worker-1.1": _log(lease_line("ack", "d", "t9", 1.9)),
        "worker-2.1": _log(lease_line("ack", "a", "t3", 2.6)),
    }
    accounting = {"lost_keys": ["b"], "unfinished_keys": ["c"]}
    deployed = judge_deploys(delivered, logs, accounting)
    assert deployed == {
        "workers_stopped": 2,
        "exited_within_grace": 1,
        "exit_codes_within_grace": {"0": 1},
        "sigkilled": 1,
        "sigkilled_holding_jobs": 1,
        "ended_by_power_cut": 0,
        "jobs_held_when_killed": {
            "acknowledged by another worker": 1,
            "acknowledged by this worker": 1,
            "lost": 1,
            "unfinished": 1,
        },
    }
    assert delivered[1]["workers"][1]["fates"] == {
        "a": "acknowledged by another worker",
        "b": "lost",
        "c": "unfinished",
        "d": "acknowledged by this worker",
    }
    assert delivered[1]["workers"][0]["fates"] == {}


def test_a_library_that_promises_nothing_against_deploys_is_weaker_as_documented_not_broken() -> (
    None
):
    weakness = Documented("stops at once at SIGTERM", "https://example.org", faults=("deploy",))
    chosen = replace(sqlite_system(), documented=(weakness,))
    lost = Anomaly(Kind.LOST, "job chaos-000001: missing from the store (lost)", job="chaos-000001")
    report: dict[str, Any] = {
        "anomalies": [lost.text],
        "findings": [lost.to_json()],
        "finished_in_time": True,
        "faults": [{"kind": "deploy", "at_s": 1.0}],
    }
    judged = promises(chosen, "process", report, None)
    assert judged["keeps_its_promises"] is True
    assert judged["weaker_as_documented"][0]["what"] == "stops at once at SIGTERM"
    # Without a deploy delivered, the same loss is a broken promise.
    report["faults"] = [{"kind": "deploy", "skipped": "no work left"}]
    assert promises(chosen, "process", report, None)["keeps_its_promises"] is False


def test_a_chaos_run_with_deploys_stops_workers_gracefully_and_loses_nothing(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "run"
    report = run_chaos(
        directory, seed=5, jobs=300, workers=3, kills=5, pauses=1, lease_ms=300,
        deploys=4, rollout=Rollout(grace_s=1.0, surge=2),
    )  # fmt: skip
    accounting = report["accounting"]
    assert report["ok"] is True, report["reasons"]
    assert report["deploys_delivered"] == 4
    rollout = {name: report["parameters"][name] for name in ("deploys", "grace_s", "surge")}
    assert rollout == {"deploys": 4, "grace_s": 1.0, "surge": 2}
    assert report["parameters"]["replace"] == "at-once"
    assert (accounting["lost"], accounting["acknowledged_twice"]) == (0, 0)
    assert accounting["overlapping_leases"] == 0
    stopped = [w for f in report["faults"] if f["kind"] == "deploy" for w in f["workers"]]
    assert len(stopped) == 8
    deployed = report["deploys"]
    assert deployed["workers_stopped"] == 8
    assert deployed["exited_within_grace"] + deployed["sigkilled"] == 8
    # A worker that exits within its grace exits 0: it finished its batch and took no more.
    assert deployed["exited_within_grace"] >= 1
    assert deployed["exit_codes_within_grace"] == {"0": deployed["exited_within_grace"]}
    for worker in stopped:
        assert worker["exited_within_grace"] is ("killed_at_s" not in worker)
        assert session_members(worker["pid"]) == []
    # Every deploy's SIGTERM went before its replacement started (at once), and the
    # replacements are workers of the same slots.
    started = {w["worker_id"]: w for w in report["workers_started"]}
    for worker in stopped:
        slot, generation = worker["worker_id"].removeprefix("worker-").split(".")
        after = started[f"worker-{slot}.{int(generation) + 1}"]
        assert after["started_at_s"] >= worker["sigterm_at_s"]
    assert json.loads((directory / "chaos.json").read_text())["deploys"] == deployed
    page = write_report(directory).read_text()
    assert "4 deploys," in page
    assert "SIGTERM worker-" in page
    assert "grace from" in page
    assert "SIGTERMed / exited within the grace / SIGKILLed at its end" in page
