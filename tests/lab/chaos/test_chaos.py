"""Chaos runs with real signals, and the accounting that judges them."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import DurableQueue
from crashqueuelab.judges.findings import Kind, texts
from crashqueuelab.lab.chaos.accounting import judge_run
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.lab.chaos.schedule import plan
from crashqueuelab.lab.chaos.worklog import SHARED_COMMIT_COUNTS, WorkerLog
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.reproducers.chaos import chaos_kind
from crashqueuelab.systems import OpenRequest, QueueClient, System, resolve_system
from crashqueuelab.systems.contract import Claim, Verdict
from crashqueuelab.systems.sqlite import SqliteClient, sqlite_system
from tests.conftest import SHRINK_BUDGET_S, RunCli


def test_the_seed_fixes_the_schedule() -> None:
    one = plan(seed=3, jobs=1000, workers=4, kills=40, pauses=5)
    assert one == plan(seed=3, jobs=1000, workers=4, kills=40, pauses=5)
    assert one != plan(seed=4, jobs=1000, workers=4, kills=40, pauses=5)
    assert sum(f.kind is FaultKind.KILL for f in one) == 40
    assert sum(f.kind is FaultKind.PAUSE for f in one) == 5
    marks = [f.after_finished for f in one]
    assert marks == sorted(marks)
    assert max(marks) < 1000
    assert {f.worker_slot for f in one} <= {0, 1, 2, 3}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("chaos") / "run"
    report = run_chaos(directory, seed=7, jobs=600, workers=3, kills=30, pauses=5, lease_ms=300)
    return directory, report


def test_a_small_chaos_run_loses_and_duplicates_nothing(
    small_run: tuple[Path, dict[str, Any]],
) -> None:
    directory, report = small_run
    accounting = report["accounting"]
    assert report["ok"] is True
    assert (report["kills_delivered"], report["pauses_delivered"]) == (30, 5)
    assert report["respawns"] >= 30
    assert accounting["submitted"] == accounting["succeeded"] == 600
    assert (accounting["lost"], accounting["dead"], accounting["unexpected"]) == (0, 0, 0)
    assert accounting["duplicated_effects"] == 0
    assert accounting["effects_missing"] == 0
    assert accounting["durable_effects"] == 600
    assert accounting["executions"] >= 600
    assert accounting["judge_ok"] is True
    assert accounting["judge_problems"] == []
    assert accounting["acknowledged_twice"] == 0
    assert accounting["anomalies"] == []
    assert all(accounting["integrity_check_ok"].values())
    # Batches are not carried: the system shares commits, but none was shared.
    assert accounting["shared_commits"] == dict.fromkeys(SHARED_COMMIT_COUNTS, 0)
    assert report["system"]["name"] == "sqlite"
    assert json.loads((directory / "chaos.json").read_text())["accounting"] == accounting
    kills = [f for f in report["faults"] if f["kind"] == "SIGKILL"]
    assert all("at_s" in f and f["pid"] > 0 for f in kills)


def test_a_paused_worker_is_fenced_and_its_effect_not_duplicated(
    small_run: tuple[Path, dict[str, Any]],
) -> None:
    directory, report = small_run
    accounting = report["accounting"]
    # Every paused worker held leases and was continued only once they had run out or
    # been taken over, so each of its late acknowledgements was refused by the fencing,
    # (a pause that found its worker between batches, 50 times over, holds nothing).
    holding = [f for f in report["faults"] if f["kind"] == "SIGSTOP" and f["leases_held"]]
    assert len(holding) >= 3
    assert report["pauses_fenced"] == len(holding)
    assert all(f["late_acknowledgements"]["accepted"] == 0 for f in holding)
    assert sum(f["late_acknowledgements"]["refused"] for f in holding) >= 1
    assert accounting["stale_operations_rejected"] >= 1
    # its re-executions are visible in the non-idempotent ledger,
    assert accounting["executions"] > accounting["succeeded"]
    # and absorbed by the idempotent one.
    assert accounting["absorbed_duplicates"] >= 1
    assert accounting["duplicated_effects"] == 0
    logs = list((directory / "worker-logs").glob("*.log"))
    assert any("stale " in log.read_text() for log in logs)


@pytest.mark.slow
def test_killed_workers_on_the_single_calls_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    # A batch of one goes through claim and succeed, which group commit carries: the kills
    # land on carriers holding other workers' requests and on the workers they carry.
    report = run_chaos(
        tmp_path / "run", seed=11, jobs=400, workers=6, kills=40, pauses=3, lease_ms=300, batch=1
    )
    accounting = report["accounting"]
    assert report["ok"] is True, accounting["anomalies"]
    assert report["kills_delivered"] == 40
    assert accounting["submitted"] == accounting["succeeded"] == 400
    assert (accounting["lost"], accounting["dead"], accounting["duplicated_effects"]) == (0, 0, 0)
    assert accounting["acknowledged_twice"] == 0
    assert accounting["judge_ok"] is True
    shared = accounting["shared_commits"]
    assert shared["carried_by_others"] > 0
    assert shared["carried_for_others"] > 0


def test_the_accounting_notices_lost_duplicated_and_unexpected_work(
    small_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    directory, _ = small_run
    copies = {}
    (tmp_path / "store").mkdir()
    (tmp_path / "logs").mkdir()
    names = ("store/queue.sqlite", "effects-idempotent.sqlite", "executions-non-idempotent.sqlite")
    for name in names:
        source = sqlite3.connect(directory / name)
        copies[name] = tmp_path / name
        target = sqlite3.connect(copies[name])
        source.backup(target)
        source.close()
        target.close()
    conn = sqlite3.connect(copies["effects-idempotent.sqlite"])
    conn.execute("DROP INDEX effects_unique_key")
    conn.execute(
        "INSERT INTO effects (effect_key, value, job_id, attempt, worker_id, applied_at_us)"
        " SELECT effect_key, value, job_id, 99, worker_id, applied_at_us FROM effects LIMIT 2"
    )
    conn.execute(
        "INSERT INTO effects (effect_key, value, job_id, attempt, worker_id, applied_at_us)"
        " VALUES ('never-submitted', 1, 'job-x', 1, 'w', 0)"
    )
    conn.commit()
    conn.close()
    # A job the store still holds, never finished: the run's stall, not a loss.
    with DurableQueue(copies["store/queue.sqlite"]) as queue:
        queue.submit(idempotency_key="chaos-999998", job_type="synthetic.effect", payload={})
    # Two workers were both told that their acknowledgement of one job was accepted.
    (tmp_path / "logs" / "worker-0.1.log").write_text(
        "claim chaos-000007 t1 1.0\nacking chaos-000007 t1 1.1\nack chaos-000007 t1 1.2\n"
    )
    (tmp_path / "logs" / "worker-1.1.log").write_text(
        "claim chaos-000007 t2 2.0\nacking chaos-000007 t2 2.1\nack chaos-000007 t2 2.2\n"
    )
    keys = [f"chaos-{n:06d}" for n in range(600)] + ["chaos-999998", "chaos-999999"]
    verdict = judge_run(
        system=resolve_system("sqlite"),
        store=tmp_path / "store",
        effects=copies["effects-idempotent.sqlite"],
        executions=copies["executions-non-idempotent.sqlite"],
        keys=keys,
        log_dir=tmp_path / "logs",
    )
    assert verdict["ok"] is False
    assert verdict["duplicated_effects"] == 2
    assert verdict["unexpected"] == 1
    assert verdict["lost"] == 1
    assert verdict["lost_keys"] == ["chaos-999999"]
    assert (verdict["unfinished"], verdict["unfinished_keys"]) == (1, ["chaos-999998"])
    assert verdict["acknowledged_twice"] == 1
    anomalies = "\n".join(verdict["anomalies"])
    assert "job chaos-999999: missing from the store (lost)" in anomalies
    assert (
        "job chaos-999998: still QUEUED after the run (unfinished, not lost: the store holds it)"
        in anomalies
    )
    assert "effect never-submitted: for a job never submitted" in anomalies
    assert (
        "job chaos-000007: acknowledged 2 times, by worker-0.1 (lease t1), worker-1.1 (lease t2)"
        in anomalies
    )


def test_a_single_owner_system_is_killed_paused_and_restarted_as_the_owner(
    tmp_path: Path,
) -> None:
    report = run_chaos(
        tmp_path / "run", seed=3, jobs=300, workers=4, kills=15, pauses=2, lease_ms=200,
        system="walqueue",
    )  # fmt: skip
    accounting = report["accounting"]
    assert report["ok"] is True, accounting["anomalies"]
    assert report["parameters"]["workers"] == 1
    assert "single owner" in report["notes"][0]
    assert (report["kills_delivered"], report["pauses_delivered"]) == (15, 2)
    assert accounting["submitted"] == accounting["succeeded"] == 300
    assert (accounting["lost"], accounting["duplicated_effects"]) == (0, 0)
    assert accounting["judge"].startswith("crashqueuelab.judges.readers.walqueue")
    # The owner was stopped past its leases; its late acknowledgements were refused.
    assert accounting["stale_operations_rejected"] >= 1
    assert accounting["shared_commits"] is None


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--jobs", "10", "--kills", "20"], "20 kills and 5 pauses need at least 30 jobs"),
        (["--jobs", "10", "--workers", "100000"], "workers: must be at most 64"),
    ],
)
def test_a_run_that_could_not_deliver_its_plan_is_refused_up_front(
    tmp_path: Path, argv: list[str], words: str, run_cli: RunCli
) -> None:
    from crashqueuelab import cli

    outcome = run_cli("chaos", "--output-directory", str(tmp_path / "c"), *argv)
    assert outcome.code == cli.EXIT_USAGE
    assert words in outcome.result["error"]["message"]
    assert f"crashqueuelab: not ok: {outcome.result['error']['message']}" in outcome.stderr
    assert not (tmp_path / "c").exists()


def test_a_short_run_says_which_faults_it_could_not_deliver(tmp_path: Path) -> None:
    report = run_chaos(tmp_path / "c", seed=1, jobs=8, workers=2, kills=0, pauses=6)
    if report["pauses_delivered"] < 6:
        assert report["ok"] is False
        missing = 6 - report["pauses_delivered"]
        assert f"{missing} of 6 planned SIGSTOPs not delivered" in report["reasons"][0]
    else:
        assert report["reasons"] == []


def test_the_group_commit_counts_of_a_log_add_up_and_a_torn_line_is_ignored() -> None:
    log = WorkerLog()
    log.add("commits 0 0 0 0 1.0\ncommits 2 1 0 1 2.0\ncommits x 1 0 0 3.0\ncommits 1 0 1 0 4.0\n")
    assert log.shared_commits == {
        "carried_for_others": 3,
        "carried_by_others": 1,
        "carrier_vanished_applied": 1,
        "carrier_vanished_rerun": 1,
    }
    assert WorkerLog().shared_commits is None


def test_progress_counts_an_acknowledgement_sent_by_a_worker_killed_before_its_answer(
    tmp_path: Path,
) -> None:
    """The store is ahead of the logs by every job a killed worker acknowledged without
    logging the answer; the faults' progress marks must count those jobs too."""
    from crashqueuelab.lab.chaos.watcher import Watcher as _Watcher

    (tmp_path / "worker-0.1.log").write_text(
        "claim k1 t1 1.0\nclaim k2 t2 1.0\nacking k1 t1 1.1\nacking k2 t2 1.1\nack k1 t1 1.2\n"
    )
    (tmp_path / "worker-1.1.log").write_text("claim k3 t3 1.0\nacking k3 t3 1.1\nstale k3 t3 1.2\n")
    watcher = _Watcher(tmp_path)
    watcher.refresh(["worker-0.1", "worker-1.1"])
    assert watcher.finished() == 1  # only k1's answer was heard
    assert watcher.progressed() == 3  # k2 may be done in the store; k3 will be, by its taker
    (tmp_path / "worker-1.1.log").write_text(
        "claim k3 t3 1.0\nacking k3 t3 1.1\nstale k3 t3 1.2\nclaim k3 t4 1.3\nacking k3 t4 1.4\n"
        "ack k3 t4 1.5\n"
    )
    watcher.refresh(["worker-1.1"])
    assert (watcher.finished(), watcher.progressed()) == (2, 3)  # a key counts once


def test_a_job_whose_every_acknowledgement_was_refused_is_named_unfinished(
    tmp_path: Path,
) -> None:
    """Progress counts a refused acknowledgement; the jobs given up on are named apart: every
    send refused and none accepted, an unanswered send (a killed worker) not among them."""
    from crashqueuelab.lab.chaos.watcher import Watcher as _Watcher

    (tmp_path / "worker-0.1.log").write_text(
        "claim k1 t1 1.0\nacking k1 t1 1.1\nstale k1 t1 1.2\n"
        "claim k2 t2 1.0\nacking k2 t2 1.1\nstale k2 t2 1.2\n"
        "claim k3 t3 1.0\nacking k3 t3 1.1\nstale k3 t3 1.2\n"
    )
    (tmp_path / "worker-1.1.log").write_text(
        "claim k2 t4 1.3\nacking k2 t4 1.4\nack k2 t4 1.5\nclaim k3 t5 1.3\nacking k3 t5 1.4\n"
    )
    watcher = _Watcher(tmp_path)
    watcher.refresh(["worker-0.1", "worker-1.1"])
    assert watcher.progressed() == 3
    assert watcher.refused_unfinished() == {"k1"}


def _log(lines: list[str]) -> WorkerLog:
    log = WorkerLog()
    log.add("".join(f"{line}\n" for line in lines))
    return log


def test_two_leases_live_at_one_instant_are_proven_from_the_logs() -> None:
    from crashqueuelab.lab.chaos.overlaps import MARGIN_S, overlapping_leases

    lease = 0.5
    # b's claim returned (10.2) while a's lease was surely live (returned 10.1, not being
    # acknowledged before 10.3): both live from 10.2 to 10.3.
    overlapping = {
        "w-a": _log(["claim k1 ta 10.1 10.0", "acking k1 ta 10.3", "stale k1 ta 10.31"]),
        "w-b": _log(["claim k1 tb 10.2 10.15", "acking k1 tb 10.4", "ack k1 tb 10.41"]),
    }
    [found] = overlapping_leases(overlapping, lease_s=lease, started_s=10.0)
    proof = found.text
    assert proof.startswith("job k1: two live leases from 0.200 s to 0.300 s at least:")
    assert "w-a's lease ta" in proof
    assert "w-b's lease tb" in proof
    assert (found.kind, found.job, dict(found.facts)) == (
        Kind.OVERLAPPING_LEASES,
        "k1",
        {"holder": "w-a", "worker": "w-b"},
    )
    # Claims in flight at once, the later call returning first: both live from 10.3 to 10.4.
    crossed = {
        "w-a": _log(["claim k1 ta 10.3 10.1", "acking k1 ta 10.6"]),
        "w-b": _log(["claim k1 tb 10.2 10.15", "acking k1 tb 10.4"]),
    }
    assert len(overlapping_leases(crossed, lease_s=lease)) == 1
    # What a correct system does: the next lease after the first was acknowledged, or
    # after its deadline (its claim began at 10.0: expired by 10.5 at the latest).
    sequential = {
        "w-a": _log(["claim k1 ta 10.1 10.0", "acking k1 ta 10.2", "ack k1 ta 10.21"]),
        "w-b": _log(["claim k1 tb 10.25 10.15"]),
        "w-c": _log(["claim k2 tc 10.1 10.0"]),  # killed holding it: live until 10.5
        "w-d": _log(["claim k2 td 10.5 10.45"]),  # granted by then, maybe only now
    }
    assert overlapping_leases(sequential, lease_s=lease) == []
    # The deadline's bound is taken a margin early: a lease returned just inside it is no
    # proof, one returned clearly inside it is.
    edge = {
        "w-c": _log(["claim k2 tc 10.1 10.0"]),
        "w-d": _log([f"claim k2 td {10.5 - MARGIN_S / 2} 10.45"]),
    }
    assert overlapping_leases(edge, lease_s=lease) == []
    edge["w-d"] = _log([f"claim k2 td {10.5 - 2 * MARGIN_S} 10.45"])
    assert len(overlapping_leases(edge, lease_s=lease)) == 1
    # A log from before claim lines said when the call began proves nothing.
    old = {"w-a": _log(["claim k1 ta 10.1"]), "w-b": _log(["claim k1 tb 10.2 10.15"])}
    assert overlapping_leases(old, lease_s=lease) == []


def test_a_poison_job_must_be_dead_lettered_after_exactly_its_limit() -> None:
    from crashqueuelab.lab.chaos.poison import judge_poison, poison_jobs
    from crashqueuelab.systems.contract import JobStatus, StoredJob

    jobs = poison_jobs(4)
    assert [(job.behaviour, job.max_attempts) for job in jobs] == [
        ("die", 2), ("fail", 2), ("die", 3), ("fail", 3),
    ]  # fmt: skip
    stored = {
        "poison-0000": StoredJob("DEAD", JobStatus.DEAD, 2),  # as it must be
        "poison-0001": StoredJob("DEAD", JobStatus.DEAD, 1),  # buried early
        "poison-0002": StoredJob("QUEUED", JobStatus.PENDING, 3),  # never buried
    }
    assert texts(judge_poison(jobs, stored)) == [
        "job poison-0001 (poison): dead-lettered after 1 attempts; its limit is 2 attempts",
        "job poison-0002 (poison): still QUEUED after the run, never dead-lettered (3 attempts;"
        " its limit is 3 attempts)",
        "job poison-0003 (poison): missing from the store (lost)",
    ]
    stored["poison-0003"] = StoredJob("SUCCEEDED", JobStatus.SUCCEEDED, 1)
    assert judge_poison(jobs, stored)[-1].text == (
        "job poison-0003 (poison): SUCCEEDED, though every attempt of it failed"
    )


@pytest.mark.parametrize("mutant", ["never_dead", "expiry_without_attempt"])
@pytest.mark.slow
def test_poison_jobs_catch_a_queue_that_never_buries_a_job(tmp_path: Path, mutant: str) -> None:
    """Every other job succeeds; the poison jobs that die or fail on every attempt are never
    dead-lettered, and the run stops waiting for them and says so.

    One job per claim: in batches, a poison job that kills its worker on every attempt
    takes the jobs claimed with it down each time, and near the end the last normal jobs
    can keep being claimed beside it (seen once in CI: 118 of 120), which is that queue's
    fault but not what this test is about."""
    report = run_chaos(
        tmp_path / "run", seed=5, jobs=120, workers=3, kills=4, pauses=0, lease_ms=300,
        batch=1, system=f"crashqueuelab.lab.mutants.catalog:{mutant}",
    )  # fmt: skip
    accounting = report["accounting"]
    assert accounting["succeeded"] == 120
    assert report["ok"] is False
    assert accounting["poison"]["anomalies"]
    assert any("never reach the dead letter" in reason for reason in report["reasons"])


def test_an_accepted_heartbeat_proves_the_lease_live_for_a_lease_after_it_was_asked() -> None:
    from crashqueuelab.lab.chaos.overlaps import overlapping_leases

    lease = 0.5
    # a's claim alone proves its lease live until 10.5; its heartbeat asked at 10.4, until
    # 10.9: b's lease granted at 10.7 overlaps it.
    logs = {
        "w-a": _log(["claim k1 ta 10.1 10.0", "heartbeat k1 ta 10.41 10.4", "stale k1 ta 11.0"]),
        "w-b": _log(["claim k1 tb 10.7 10.65", "acking k1 tb 10.8"]),
    }
    assert logs["w-a"].extended_asked == {("k1", "ta"): 10.4}
    [proof] = overlapping_leases(logs, lease_s=lease, started_s=10.0)
    assert proof.text.startswith("job k1: two live leases from 0.700 s to 0.800 s at least:")
    # Without the heartbeat, the same claims are what a correct system does.
    logs["w-a"] = _log(["claim k1 ta 10.1 10.0", "heartbeat k1 ta bad 10.4"])
    assert logs["w-a"].extended_asked == {("k1", "ta"): 10.4}
    logs["w-a"] = _log(["claim k1 ta 10.1 10.0", "heartbeat k1 ta 10.41 bad"])
    assert logs["w-a"].extended_asked == {}
    assert overlapping_leases(logs, lease_s=lease) == []


class _Heartbeats:
    """A client that refuses the heartbeats of job ``lost`` after its first."""

    def __init__(self, lost: str) -> None:
        self.lost = lost
        self.asked: list[tuple[str, int]] = []

    def heartbeat(self, claim: Any, lease_us: int) -> bool:
        self.asked.append((claim.key, lease_us))
        return claim.key != self.lost or self.asked.count((claim.key, lease_us)) == 1


def test_a_long_job_heartbeats_every_claim_held_and_drops_a_refused_one() -> None:
    import io

    from crashqueuelab.lab.chaos.longjobs import long_indexes, work_leases, work_long
    from crashqueuelab.systems.contract import Claim

    assert long_indexes(10, 3) == {0, 3, 6}
    assert long_indexes(2, 5) == {0, 1}
    assert long_indexes(10, 0) == set()
    assert work_leases({"work_leases": 2.5}) == 2.5
    assert work_leases({"work_leases": "2"}) is None
    assert work_leases({}) is None

    def claim(key: str, **payload: Any) -> Claim:
        return Claim(f"id-{key}", key, "t", payload, 1, "w", f"tok-{key}")

    ticks = iter(range(1000))
    clock = {"now": 0.0}

    def now() -> float:
        next(ticks)  # bounded: a loop that never ends runs out of ticks
        return clock["now"]

    def sleep(seconds: float) -> None:
        clock["now"] += seconds

    short = [claim("a"), claim("b")]
    log = io.StringIO()
    client: Any = _Heartbeats(lost="")
    assert work_long(client, short, 0.3, log, now=now, sleep=sleep) == short
    assert client.asked == []
    assert log.getvalue() == ""
    # One long job of 1 lease: three heartbeats of each claim held; a's second is refused.
    claims = [claim("a"), claim("b", work_leases=1)]
    client = _Heartbeats(lost="a")
    kept = work_long(client, claims, 0.3, log, now=now, sleep=sleep)
    assert kept == [claims[1]]
    assert client.asked == [("a", 300_000), ("b", 300_000), ("a", 300_000)] + [("b", 300_000)] * 2
    words = [line.split()[:2] for line in log.getvalue().splitlines()]
    assert (
        words == [["heartbeat", "a"], ["heartbeat", "b"], ["stale", "a"]] + [["heartbeat", "b"]] * 2
    )


def test_heartbeating_long_jobs_catch_a_heartbeat_kept_in_one_process(tmp_path: Path) -> None:
    """Recovery in the maintenance process still sees the claim's deadline, so a long job is
    handed to a second worker while its holder heartbeats: proven from the logs."""
    report = run_chaos(
        tmp_path / "run", seed=5, jobs=40, workers=2, kills=0, pauses=0, lease_ms=200,
        poison_count=0, long_count=1,
        system="crashqueuelab.lab.mutants.catalog:heartbeat_in_memory",
    )  # fmt: skip
    assert report["ok"] is False
    assert report["parameters"]["long_jobs"] == 1
    assert report["accounting"]["overlapping_leases"]
    # The run ends on the stall rule: no acknowledgement for its grace, or, where every
    # other job's acknowledgement was sent first (a loaded machine), the refused ones named.
    assert any(
        "the work stalled" in reason or "were refused as stale" in reason
        for reason in report["reasons"]
    ), report["reasons"]


def test_the_chaos_page_runs_the_same_schedule_and_says_the_interleaving_may_differ(
    small_run: tuple[Path, dict[str, Any]],
) -> None:
    from crashqueuelab.lab.pages.render import write_report

    directory, _ = small_run
    html = write_report(directory).read_text()
    assert "Run the same schedule again (same seed and faults; the interleaving" in html
    assert "Reproduce this run" not in html
    assert f"crashqueuelab chaos --replay {directory} --output-directory {directory}-again" in html


@pytest.mark.slow
def test_a_replay_delivers_the_recorded_schedule_again(
    small_run: tuple[Path, dict[str, Any]], tmp_path: Path, run_cli: RunCli
) -> None:
    from crashqueuelab import cli
    from crashqueuelab.lab.pages.render import write_report

    directory, original = small_run
    assert len(original["schedule"]) == 35
    target = tmp_path / "again"
    outcome = run_cli(
        "chaos", "--replay", str(directory), "--quiet", "--output-directory", str(target)
    )
    assert outcome.code == cli.EXIT_OK, outcome.result
    replayed = json.loads((target / "chaos.json").read_text())
    assert replayed["schedule"] == original["schedule"]
    assert (replayed["seed"], replayed["parameters"]) == (original["seed"], original["parameters"])
    assert replayed["replay_of"] == str(directory)
    assert [f["index"] for f in replayed["faults"]] == [f["index"] for f in original["faults"]]
    assert "delivered the recorded fault schedule of" in write_report(target).read_text()


def test_a_replay_of_what_is_not_a_chaos_run_or_does_not_match_is_refused(
    small_run: tuple[Path, dict[str, Any]], tmp_path: Path, run_cli: RunCli
) -> None:
    from crashqueuelab import cli
    from crashqueuelab.core.errors import InvalidInput

    outcome = run_cli("chaos", "--replay", str(tmp_path), "--output-directory", str(tmp_path / "x"))
    assert outcome.code == cli.EXIT_USAGE
    assert "holds no chaos run this version can replay" in outcome.result["error"]["message"]
    assert not (tmp_path / "x").exists()
    _, original = small_run
    with pytest.raises(InvalidInput, match="faults of kind SIGKILL, not 3"):
        run_chaos(tmp_path / "y", seed=7, jobs=600, workers=3, kills=3, pauses=5,
                  schedule=original["schedule"])  # fmt: skip
    with pytest.raises(InvalidInput, match="not a recorded fault schedule"):
        run_chaos(tmp_path / "z", seed=7, jobs=600, workers=3, kills=0, pauses=0,
                  schedule=[{"kind": "nonsense"}])  # fmt: skip
    assert not (tmp_path / "y").exists()


def _replayed(rerun: Path) -> dict[str, Any]:
    """The chaos record of a replay kept in ``rerun`` (one attempt: its ``chaos-1``)."""
    kept: dict[str, Any] = json.loads((rerun / "chaos-1" / "chaos.json").read_text())
    return kept


@pytest.mark.slow
@pytest.mark.quiet
def test_a_failing_chaos_run_is_shrunk_to_a_schedule_rerun_k_of_n_times(
    tmp_path: Path, run_cli: RunCli
) -> None:
    from crashqueuelab import cli
    from crashqueuelab.lab.pages.render import write_report

    directory = tmp_path / "run"
    report = run_chaos(
        directory, seed=7, jobs=120, workers=2, kills=6, pauses=0, lease_ms=200,
        poison_count=0, long_count=0, system="crashqueuelab.lab.mutants.catalog:expiry_drops_job",
    )  # fmt: skip
    assert not report["ok"]
    assert len(report["schedule"]) == 6
    outcome = run_cli("shrink", str(directory), "--shrink-seconds", str(SHRINK_BUDGET_S))
    assert outcome.code == cli.EXIT_REJECTED, outcome.result
    record = json.loads((directory / "chaos.json").read_text())["shrink"]["reproducers"][0]
    assert record["recorded"]["reruns"] >= 1
    assert record["after"]["faults"] <= record["before"]["faults"] == 6
    # Whether a replay fails again is the scheduler's call: a single SIGKILL that lands
    # between a worker's acknowledgement and its next claim drops nothing, so the smallest
    # schedule fails about two replays in three here and none of three now and then on a
    # busy host. The record's count is checked against the replays it keeps.
    assert record["confirmations"] == 3
    kind = chaos_kind(record["anomaly"])
    failed = sum(
        any(chaos_kind(reason) == kind for reason in _replayed(directory / rerun)["reasons"])
        for rerun in record["reruns"]
    )
    assert record["reproduced"] == failed
    # Six kills drop a job in nearly every replay: the recorded schedule failed again, or the
    # smallest one did.
    assert record["recorded"]["failed"] + record["reproduced"] >= 1
    # The exported test replays the schedule up to 3 times, and whether a replay fails again
    # is the scheduler's call, as for the confirmations (it failed as exported in most runs
    # here; once, on 3.12, its 3 replays passed): the record says which, and so does the page.
    test_run = record["test_run"]
    assert test_run["failed"] in (True, False), test_run
    assert ("failed" in test_run["detail"]) is test_run["failed"], test_run
    assert (directory / record["test_file"]).is_file()
    replayed = json.loads((directory / record["schedule"]).read_text())
    assert len(replayed["schedule"]) == record["after"]["faults"]
    html = write_report(directory).read_text()
    assert f"failed {record['reproduced']} of {record['confirmations']}" in html
    assert ("fails as exported" if test_run["failed"] else "PASSES as exported") in html
    assert "Reproduce this run" not in html


def test_an_acknowledgement_with_no_answer_is_unknown_and_the_store_settles_it(
    small_run: tuple[Path, dict[str, Any]],
) -> None:
    from crashqueuelab.lab.chaos.accounting import unknown_outcomes

    log = WorkerLog()
    log.add(
        "claim a t1 1.0 0.9\nacking a t1 2.0\nclaim b t2 1.0 0.9\nacking b t2 2.0\nack b t2 2.1\n"
    )
    other = WorkerLog()
    other.add("claim c t3 1.0 0.9\nacking c t3 2.0\nstale c t3 2.1\n")
    assert unknown_outcomes({"w1": log, "w2": other}) == [("a", "t1")]
    _, report = small_run
    accounting = report["accounting"]
    # Thirty kills: some landed between a worker's acknowledgement and its answer.
    settled = accounting["unknown_outcomes_settled"]
    assert sum(settled.values()) == accounting["unknown_outcomes"]
    assert set(settled) <= {"succeeded"}


def test_a_missing_job_names_the_worker_whose_log_ends_holding_it() -> None:
    from crashqueuelab.lab.chaos.accounting import _last_holders
    from crashqueuelab.lab.chaos.worklog import WorkerLog

    held, sent, polling = WorkerLog(), WorkerLog(), WorkerLog()
    held.add("claiming 0.9\nclaim job-a t1 1.0 0.9\n")
    sent.add("claiming 1.9\nclaim job-b t2 2.0 1.9\nacking job-b t2 2.1\n")
    polling.add("claim job-c t3 3.0\nacking job-c t3 3.1\nack job-c t3 3.2\nclaiming 3.3\n")
    assert (held.claim_open, sent.claim_open, polling.claim_open) == (False, False, True)
    logs = {"worker-0.1": held, "worker-1.1": sent, "worker-2.1": polling}
    words = _last_holders(logs, ["job-a", "job-b", "job-x"])
    assert words["job-a"] == ("; claimed by worker-0.1, which never answered for it", "held")
    assert words["job-b"] == ("; claimed by worker-1.1, which never answered for it", "held")
    # One log ends inside a claim call: one job no log names may have gone with it.
    assert words["job-x"] == (
        "; in no worker's log, and 1 workers' logs end inside a claim call, for 1 such job",
        "claiming",
    )
    # Two such jobs and one open claim call: the logs explain neither.
    assert "job-y" not in _last_holders(logs, ["job-x", "job-y"])


#: An opaque token as an adapter may make one: spaces, a line break, percent signs.
SPACED = "lease of %s: it\nhas spaces "


def test_a_log_line_keeps_any_opaque_token_and_key() -> None:
    from crashqueuelab.lab.chaos.worklog import lease_line

    log = WorkerLog()
    log.add(lease_line("claim", "job 1", SPACED % "x", 2.0, 1.5))
    log.add(lease_line("acking", "job 1", SPACED % "x", 3.0))
    log.add(lease_line("ack", "job 1", SPACED % "x", 3.5))
    assert log.claims == log.acks == [("job 1", SPACED % "x")]
    assert log.claim_asked == {("job 1", SPACED % "x"): 1.5}
    assert log.ack_times == [3.5]


class _SpacedTokenClient(SqliteClient):
    """The SQLite queue one claim and one acknowledgement at a time, its tokens wrapped in
    spaces and a line break."""

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claim = super().claim(worker_id, lease_us)
        return None if claim is None else replace(claim, token=SPACED % claim.token)

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        claim = self.claim(worker_id, lease_us)
        return [] if claim is None else [claim]

    def _plain(self, claim: Claim) -> Claim:
        plain = claim.token.removeprefix("lease of ").removesuffix(": it\nhas spaces ")
        return replace(claim, token=plain)

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        return super().heartbeat(self._plain(claim), lease_us)

    def succeed(self, claim: Claim) -> Verdict:
        return super().succeed(self._plain(claim))

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        return [self.succeed(claim) for claim in claims]

    def fail(self, claim: Claim, error: str) -> Verdict:
        return super().fail(self._plain(claim), error)


def spaced_token_system() -> System:
    def open_spaced(request: OpenRequest) -> QueueClient:
        client = sqlite_system().open(request)
        assert isinstance(client, SqliteClient)
        return _SpacedTokenClient(client.queue)

    plain = sqlite_system()
    capabilities = replace(plain.capabilities, batching=False, chained=False, carried=False)
    return replace(plain, name="sqlite-spaced-tokens", open=open_spaced, capabilities=capabilities)


def test_chaos_counts_the_acknowledgements_of_a_system_whose_tokens_have_spaces(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", "--system", "tests.lab.chaos.test_chaos:spaced_token_system", "--seed", "2",
        "--jobs", "60", "--kills", "2", "--pauses", "0", "--quiet",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == 0, outcome.result["reasons"]
    accounting = outcome.result["accounting"]
    assert (accounting["lost"], accounting["acknowledged_twice"]) == (0, 0)


def test_the_stall_grace_is_ten_leases_and_a_recovery_per_poison_attempt() -> None:
    from crashqueuelab.lab.chaos.drive import STALL_GRACE_MIN_S, stall_grace_s

    assert stall_grace_s(100, 0.0) == STALL_GRACE_MIN_S
    assert stall_grace_s(2_000, 0.0) == 20.0
    assert stall_grace_s(300, 4.0) == STALL_GRACE_MIN_S + 12.0


class _SlowSweeper(SqliteClient):
    """Recovery on the wall clock: a sweep hands expired leases back at most every 2 s."""

    last_sweep = 0.0

    def recover(self) -> int:
        if time.monotonic() - self.last_sweep < SWEEP_S:
            return 0
        self.last_sweep = time.monotonic()
        return super().recover()


SWEEP_S = 2.0


def slow_sweeper_system() -> System:
    def open_slow(request: OpenRequest) -> QueueClient:
        client = sqlite_system().open(request)
        assert isinstance(client, SqliteClient)
        return _SlowSweeper(client.queue)

    return replace(sqlite_system(), name="sqlite-slow-sweeper", open=open_slow, recovery_s=SWEEP_S)


def test_a_recovery_that_runs_on_the_wall_clock_is_waited_for_as_the_system_declares(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", "--system", "tests.lab.chaos.test_chaos:slow_sweeper_system", "--seed", "5",
        "--jobs", "80", "--kills", "3", "--pauses", "0", "--lease-ms", "200", "--quiet",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == 0, outcome.result["reasons"]
    assert outcome.result["system"]["recovery_s"] == SWEEP_S


class _FewClaims(SqliteClient):
    """A queue whose every client hands out ``FEW_CLAIMS`` jobs and then nothing: the work
    stalls with jobs ready."""

    handed = 0

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        if self.handed >= FEW_CLAIMS:
            return None
        self.handed += 1
        return super().claim(worker_id, lease_us)

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        claimed = self.claim(worker_id, lease_us)
        return [] if claimed is None else [claimed]


FEW_CLAIMS = 4


def few_claims_system() -> System:
    def open_few(request: OpenRequest) -> QueueClient:
        client = sqlite_system().open(request)
        assert isinstance(client, SqliteClient)
        return _FewClaims(client.queue)

    return replace(sqlite_system(), name="sqlite-few-claims", open=open_few)


def test_a_stall_before_the_marks_of_faults_still_planned_ends_the_run_at_its_grace(
    tmp_path: Path,
) -> None:
    """The kills are planned after more acknowledgements than the stalled work reaches: the
    run ends one stall grace after its last acknowledgement, naming the faults never
    reached, instead of waiting out its deadline."""
    report = run_chaos(
        tmp_path / "run", seed=3, jobs=120, workers=2, kills=2, pauses=0, lease_ms=200,
        poison_count=0, system="tests.lab.chaos.test_chaos:few_claims_system",
        deadline_s=120.0,
    )  # fmt: skip
    assert report["ok"] is False
    unreached = [fault for fault in report["faults"] if fault.get("at_s") is None]
    assert len(unreached) == 2, report["faults"]
    stalled = [r for r in report["reasons"] if r.startswith("the work stalled")]
    assert stalled, report["reasons"]
    assert "2 planned fault(s) never reached" in stalled[0], report["reasons"]
    assert not any("deadline" in reason for reason in report["reasons"]), report["reasons"]


def test_a_run_that_did_not_finish_says_why_as_a_finding() -> None:
    from crashqueuelab.judges.findings import Anomaly
    from crashqueuelab.lab.chaos.verdict import unfinished_work

    deadline = unfinished_work(None)
    assert (deadline.kind, deadline.text) == (
        Kind.DEADLINE_PASSED,
        "the work did not finish before the deadline",
    )
    stalled = Anomaly(Kind.WORK_STALLED, "the work stalled: no job was acknowledged for 5 s")
    assert unfinished_work(stalled) is stalled


def test_a_worker_that_died_inside_a_claim_call_is_named_a_claim_cut(tmp_path: Path) -> None:
    """Only a death (a delivered SIGKILL, or an exit by itself) of a worker whose log ends
    inside a claim call: one that ended between calls, or one alive, is no such cut. A
    job's two live copies are a claim's cut only after an attempt of it failed with a retry,
    and a report's cut only where a dead worker's log ends inside its report."""
    from types import SimpleNamespace

    from crashqueuelab.judges.findings import inconsistent
    from crashqueuelab.lab.chaos.record import chaos_findings_cut, claims_cut

    logs = tmp_path / "worker-logs"
    logs.mkdir()
    lines = {
        # killed inside a claim, after j's attempt failed with a retry at 10.5
        "worker-0.1": "acking j t.1 10.4\nfailed-retry j t.1 10.5\nclaiming 10.6\n",
        "worker-0.2": "claiming 11.0\nidle 12.0\n",  # killed between calls
        "worker-1.1": "claiming 13.0\n",  # exited by itself inside a claim
        "worker-1.2": "claiming 14.0\n",  # alive
        "worker-1.3": "claim k u.1 15.0 14.9\nacking k u.1 15.1\n",  # killed reporting k
    }
    for worker, text in lines.items():
        (logs / f"{worker}.log").write_text(text)
    failures = [{"worker_id": "worker-1.1"}]
    run = SimpleNamespace(logs=logs, state=SimpleNamespace(failures=failures, started=10.0))
    delivered = [
        {"kind": "SIGKILL", "worker_id": "worker-0.1", "at_s": 0.7},
        {"kind": "SIGKILL", "worker_id": "worker-0.2", "at_s": 2.5},
        {"kind": "SIGKILL", "worker_id": "worker-1.2", "skipped": "no work left"},
        {"kind": "SIGKILL", "worker_id": "worker-1.3", "at_s": 5.2},
    ]
    cut = claims_cut(run, delivered)  # type: ignore[arg-type]
    assert cut == {"worker-0.1": 10.7, "worker-1.1": float("inf")}
    two = [inconsistent(f"job {key}: more than one live message", "judge: ") for key in "jkx"]
    other = inconsistent("the store's file is torn", "judge: ")
    found = chaos_findings_cut(run, delivered, [*two, other])  # type: ignore[arg-type]
    facts = [(finding.value("claim_cut"), finding.value("report_cut")) for finding in found]
    # j retried before worker-0.1 died in a claim; k's report was cut; x neither.
    assert facts == [(True, False), (False, True), (False, False), (False, False)]
    assert [finding.text for finding in found] == [finding.text for finding in [*two, other]]
