"""Real deploy runs: worker processes stopped by signals, a grace period, then SIGKILL of
every process of their session. The lab's own worker on the shipped SQLite queue (SIGTERM, SIGQUIT,
a second SIGTERM, fleet restarts, replacements after exit), pgqueuer's own ``pgq run`` on
the session's PostgreSQL server, a worker that ignores SIGTERM, one that cannot start,
and what the command refuses."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.deploys.labworker import DUE_FIELD, hold_until_due
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.contract import JobSpec, OpenRequest, OwnWorker, System, Verdict
from tests.conftest import RunCli


def _deploys(run_cli: RunCli, directory: Path, system: str, *options: str) -> dict[str, Any]:
    outcome = run_cli("deploys", "--system", system, "--output-directory", str(directory), *options)
    record: dict[str, Any] = json.loads((directory / "deploys.json").read_text())
    record["exit_code"] = outcome.code
    record["result"] = outcome.result
    return record


def test_the_lab_worker_on_sqlite_loses_nothing_and_acknowledges_nothing_twice_under_sigterm(
    tmp_path: Path, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "d",
        "sqlite",
        "--workers", "2", "--deploys", "1", "--grace-s", "0.5", "--jobs", "6",
        "--long-share", "0.5", "--seed", "3", "--scheduled", "2",
    )  # fmt: skip
    assert record["exit_code"] == 0, record["anomalies"]
    assert record["ok"] is True
    # Held by the queue's retry delay, each scheduled job ran to completion once, not before
    # it was due. A busy machine can make the deploy's SIGKILL cut one mid-run (a long job
    # past the 0.5 s grace): its next start is that cut execution's redelivery, nothing else.
    timed = record["scheduled"]["jobs"]
    assert len(timed) == 2
    assert {job["verdict"] for job in timed.values()} == {"on time"}
    for key, job in timed.items():
        ran = record["jobs"][key]
        assert ran["completed"] == 1
        assert len(job["starts_s"]) == ran["runs"] == 1 + ran["cut"] == 1 + ran["redelivered"]
    # A scheduled job a worker claimed before it was due was held (never started then); one
    # no worker was free to claim before then (workers slow to start on a loaded machine)
    # was first claimed, and started, once due. The hold itself: the test below.
    ledgers = "".join(path.read_text() for path in (tmp_path / "d").glob("*.ledger"))
    held = {line.split()[1] for line in ledgers.splitlines() if line.startswith("hold ")}
    assert held <= set(timed)
    for key in set(timed) - held:
        assert timed[key]["first_start_after_due_s"] >= 0, timed[key]
    assert record["result"]["headline"].startswith("crashqueuelab ")
    assert record["worker"]["lab_worker"] is True
    assert record["checks"]["acknowledged_twice"].startswith("judged")
    assert {job["completed"] >= 1 for job in record["jobs"].values()} == {True}
    assert {job["acknowledged"] for job in record["jobs"].values()} == {1}
    assert {job["stored"] for job in record["jobs"].values()} == {"SUCCEEDED"}
    stopped = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
    assert [w["signals"][0]["signal"] for w in stopped] == ["SIGTERM", "SIGTERM"]
    for worker in stopped:
        # Within the grace, or SIGKILLed at its end: holding the job it was finishing (run
        # again, above), or none, its last job acknowledged within the grace and its process
        # still exiting (a loaded machine: 0.27 s after its acknowledgement, one whole run).
        assert worker["exited_within_grace"] or worker["killed_s"] is not None
    page = (tmp_path / "d" / "report.html").read_text()
    assert "Each worker process across the deploys" in page
    assert "w0.1" in page


def test_mid_job_stops_each_find_a_job_outlasting_the_grace_and_its_sigkill_cuts_it(
    tmp_path: Path, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "m",
        "sqlite",
        "--workers", "2", "--deploys", "1", "--grace-s", "0.5", "--jobs", "8",
        "--long-share", "1", "--seed", "5", "--stop-when", "mid-job",
    )  # fmt: skip
    assert record["exit_code"] == 0, record["anomalies"]
    assert record["plan"]["stop_when"] == "mid-job"
    stopped = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
    assert len(stopped) == 2
    for worker in stopped:
        # The stop waited for the job (never past one interval), which the SIGKILL cut: the
        # lab's worker finishes the job in hand at SIGTERM, and this one outlasted the grace.
        assert worker["stop_due_s"] <= worker["stop_s"] < worker["stop_due_s"] + 1.5, worker
        assert worker["held_when_stopped"], worker
        assert worker["held_when_killed"] == worker["held_when_stopped"], worker
    assert sum(job["redelivered"] for job in record["jobs"].values()) >= 2
    page = (tmp_path / "m" / "report.html").read_text()
    assert "--stop-when mid-job" in page
    assert "each stop once its worker held a job outlasting the grace" in page
    assert f"holding <code>{stopped[0]['held_when_stopped'][0]}</code>" in page


def test_the_lab_worker_holds_a_job_claimed_before_it_is_due_in_the_queue_until_then(
    tmp_path: Path,
) -> None:
    """The claimed attempt is failed with a retry delay of the time left: the queue keeps the
    job, which no worker can claim before it is due; a job already due is not held."""
    system = resolve_system("sqlite")
    request = OpenRequest(tmp_path / "store", SystemClock(), RandomIds(), RetryPolicy(0, 0))
    client = system.open(request)
    ledger = tmp_path / "w.ledger"
    try:
        due = {"later": time.time() + 600, "past": time.time() - 1}
        client.submit_many([JobSpec(key, "t", {DUE_FIELD: at}) for key, at in due.items()])
        claims = {claim.key: claim for claim in client.claim_many("w", 60_000_000, 2)}
        assert hold_until_due(system, tmp_path / "store", claims["past"], ledger) is False
        assert not ledger.exists()
        assert hold_until_due(system, tmp_path / "store", claims["later"], ledger) is True
        assert ledger.read_text().split()[::3] == ["hold", "retry"]
        assert ledger.read_text().split()[1] == "later"
        client.recover()
        assert client.claim("w2", 60_000_000) is None
        assert client.succeed(claims["past"]) is Verdict.SUCCEEDED
    finally:
        client.close()


def test_sigquit_kills_the_lab_worker_at_once_and_its_job_runs_again(
    tmp_path: Path, run_cli: RunCli
) -> None:
    # The lab started as a shell's background job is: with SIGQUIT ignored, which its
    # workers would inherit if the fleet did not give them the default action back.
    before = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        # A stop finds the worker at a long job, unless a loaded machine kept it from taking
        # one yet: a run whose stops cut nothing exercises nothing this test is about, and
        # is made again with another seed, three runs at most, each judged.
        for attempt, seed in enumerate(SIGQUIT_SEEDS):
            record = _sigquit_deploys(tmp_path / f"run-{attempt}", run_cli, seed)
            assert record["exit_code"] == 0, record["anomalies"]
            stopped = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
            assert {w["exit"] for w in stopped} == {"SIGQUIT"}
            assert all(w["killed_s"] is None for w in stopped)
            # Each job a stop cut ran again elsewhere, later. A job runs again otherwise only
            # where the queue refused the acknowledgement of a run that ended, its 0.3 s lease
            # run out (a heartbeat late on a loaded machine, one whole run): at least once, as
            # the queue promises; each such run is one redelivery more, none unexplained.
            abandoned = [run for run in record["executions"] if run["how"] == "abandoned"]
            for cut in abandoned:
                assert any(
                    run["key"] == cut["key"]
                    and run["pid"] != cut["pid"]
                    and run["start_s"] >= cut["end_s"]
                    for run in record["executions"]
                ), cut
            refused = sum(job["completed"] - job["acknowledged"] for job in record["jobs"].values())
            redelivered = sum(job["redelivered"] for job in record["jobs"].values())
            assert redelivered == len(abandoned) + refused
            if abandoned:
                break
        else:
            raise AssertionError(f"no stop of {len(SIGQUIT_SEEDS)} runs cut a job")
    finally:
        signal.signal(signal.SIGQUIT, before)
    assert len(abandoned) <= 2
    assert {run["how"] for run in record["executions"]} == {"ended", "abandoned"}


#: The seeds of the SIGQUIT test's runs, the first the command's default.
SIGQUIT_SEEDS = ("20260827", "3", "4")


def _sigquit_deploys(directory: Path, run_cli: RunCli, seed: str) -> dict[str, Any]:
    return _deploys(
        run_cli,
        directory / "q",
        "sqlite",
        "--workers", "1", "--deploys", "2", "--grace-s", "0.5", "--jobs", "4",
        "--signal", "SIGQUIT", "--replace", "after-exit", "--long-share", "1",
        "--lease-s", "0.3", "--seed", seed,
    )  # fmt: skip


def test_a_second_sigterm_and_a_fleet_restart_change_nothing_for_the_lab_worker(
    tmp_path: Path, run_cli: RunCli
) -> None:
    # A 2 s grace: its short jobs (up to 0.6 of it) leave a stopped worker 0.8 s to finish
    # and exit, which a loaded host needs (0.24 s at a 0.6 s grace).
    record = _deploys(
        run_cli,
        tmp_path / "t",
        "sqlite",
        "--workers", "2", "--deploys", "0", "--fleet-restarts", "1", "--grace-s", "2",
        "--jobs", "4", "--signal", "SIGTERM-twice", "--long-share", "0",
    )  # fmt: skip
    assert record["exit_code"] == 0, record["anomalies"]
    stopped = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
    assert len(stopped) == 2
    assert {w["stop_s"] for w in stopped} == {record["steps"][0]["at_s"]} or all(
        abs(w["stop_s"] - stopped[0]["stop_s"]) < 0.1 for w in stopped
    )
    assert all(w["exited_within_grace"] for w in stopped)


def _ignoring_sigterm(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ends = time.monotonic() + 60
    while time.monotonic() < ends:
        time.sleep(0.05)


def _refusing(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    raise RuntimeError(f"{worker_id} cannot reach its broker")


def ignoring_system() -> System:
    """The shipped SQLite queue with a worker of its own that ignores SIGTERM and runs
    nothing."""
    worker = OwnWorker(_ignoring_sigterm, "a worker that ignores SIGTERM", {"SIGTERM": "none"})
    return dataclasses.replace(resolve_system("sqlite"), own_worker=worker)


def refusing_system() -> System:
    """The shipped SQLite queue with a worker of its own that fails at once."""
    worker = OwnWorker(_refusing, "a worker that fails at once")
    return dataclasses.replace(resolve_system("sqlite"), own_worker=worker)


@pytest.mark.early
def test_a_worker_that_ignores_sigterm_is_sigkilled_at_the_end_of_its_grace_and_its_jobs_lost(
    tmp_path: Path, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "i",
        "tests.lab.deploys.test_deploys:ignoring_system",
        "--workers", "1", "--deploys", "1", "--grace-s", "0.3", "--jobs", "2",
        "--recovery-wait-s", "0.2",
    )  # fmt: skip
    assert record["exit_code"] == 1
    kinds = sorted({finding["kind"] for finding in record["findings"]})
    assert kinds == ["lost_in_deploy"]
    (stopped,) = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
    assert stopped["exit"] == "SIGKILL"
    assert stopped["exited_within_grace"] is False
    assert stopped["group_when_killed"] == [stopped["pid"]]
    assert record["checks"]["acknowledged_twice"].startswith("not run")
    assert record["promises"]["keeps_its_promises"] is False
    assert record["recovery"]["basis"] == "given by the run"
    assert "SIGKILL" in (tmp_path / "i" / "report.html").read_text()


def test_a_worker_that_cannot_start_is_a_failed_run_never_a_verdict_on_promises(
    tmp_path: Path, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "f",
        "tests.lab.deploys.test_deploys:refusing_system",
        "--workers", "1", "--jobs", "1", "--deploys", "1", "--warmup-s", "5",
    )  # fmt: skip
    assert record["exit_code"] == 1
    assert record["promises"] is None
    assert record["error"]["type"] == "WorkerFailed"
    # The first worker's, or on a machine so busy that the stop reached the first worker
    # before its failure did (a stopped worker's exit is its answer to the stop), its
    # replacement's.
    assert re.fullmatch(
        r"(w0\.[01]): RuntimeError: \1 cannot reach its broker", record["error"]["message"]
    ), record["error"]
    assert record["headline"].endswith("not judged: WorkerFailed")
    assert record["result"]["reasons"][0].startswith("WorkerFailed: ")


def test_a_run_that_cannot_be_what_was_asked_is_refused_before_anything_is_written(
    tmp_path: Path, run_cli: RunCli
) -> None:
    target = tmp_path / "never"
    bad = run_cli(
        "deploys", "--system", "sqlite", "--workers", "2", "--surge", "3",
        "--output-directory", str(target),
    )  # fmt: skip
    assert bad.code == 2
    assert bad.result["error"]["type"] == "InvalidInput"
    assert "surge" in bad.result["error"]["message"]
    owned = run_cli("deploys", "--system", "walqueue", "--output-directory", str(target))
    assert owned.result["error"]["type"] == "SystemUnavailable"
    assert "one process owns its store" in owned.result["error"]["message"]
    assert not target.exists()
    lease = run_cli(
        "deploys", "--system", "sqlite", "--lease-s", "0", "--output-directory", str(target)
    )
    assert lease.code == 2
    assert not target.exists()


@pytest.mark.quiet
def test_pgq_run_drains_on_sigterm_and_a_sigkilled_job_is_picked_again(
    tmp_path: Path, postgres_dsn: str, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "p",
        "pgqueuer",
        # pgq run takes about 3 s to exit with nothing in hand: a grace past that.
        "--dsn", postgres_dsn, "--workers", "1", "--deploys", "2", "--grace-s", "4",
        "--interval-s", "2", "--jobs", "4", "--long-share", "0.5", "--seed", "1",
        "--scheduled", "2",
    )  # fmt: skip
    assert record["error"] is None
    assert record["worker"]["lab_worker"] is False
    assert "pgq run" in record["worker"]["describe"]
    assert record["worker"]["source"].startswith("https://janbjorge.github.io/pgqueuer/")
    assert record["promises"]["keeps_its_promises"] is True, record["anomalies"]
    assert not [f for f in record["findings"] if f["kind"] == "lost_in_deploy"]
    assert {job["stored"] for job in record["jobs"].values()} == {"successful"}
    assert record["checks"]["acknowledged_twice"].startswith("not run")
    # execute_after: never picked before it was due, and run to completion once (a start
    # that a deploy's SIGKILL cut short is run again, as for any job). Not how soon after
    # ("the earliest time", pgqueuer documents no latest): the lab's tolerance (a worker's
    # notice, the grace, the longest job) leaves out a replacement's own start, and a job
    # due while its worker was replaced started 1.8 s past it once, in a whole run's quiet
    # part (judged "late", as documented).
    timed = record["scheduled"]["jobs"]
    assert len(timed) == 2
    assert {job["verdict"] for job in timed.values()} <= {"on time", "late"}


# One worker, every job longer than the grace, and each stop waits for the worker to hold a
# job with more than the grace of its work left (``--stop-when mid-job``): 1.0.x leaves
# about 3 s between one job and the next, and stops on schedule drifted into those gaps or
# met a job near its end (1 run of 4 beside the parallel part, and once in a whole run's
# quiet part, cut no job). Quiet still: its other timers (the grace, the heartbeats) were
# not measured against a loaded machine apart from the stops' drift. Most of its time is the
# wait for pgqueuer's fixed 30 s heartbeat timeout, which needs no core: the two releases
# wait side by side, each on a server of its own (one server would give both releases one
# LISTEN/NOTIFY channel).
@pytest.mark.releases
@pytest.mark.quiet
@pytest.mark.early
def test_pgqueuer_630_a_job_sigkilled_at_a_deploy_blocks_its_entrypoint_on_1_0_1_not_on_1_0_2(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    """pgqueuer #630: a job SIGKILLed at the end of a deploy's grace stays picked, and with
    the entrypoint's concurrency_limit (1) reached 1.0.1 re-picks nothing, stale or queued,
    for good; 1.0.2 (#633) hands the stale job out again after the heartbeat timeout."""
    outcome = run_cli(
        "versions", "--system", "pgqueuer", "--releases", "1.0.1,1.0.2", "--bisect",
        "--bisect-on", "promises", "--output-directory", str(tmp_path / "v"),
        "--at-once", "2",
        # A stop that finds a job in hand, longer than the grace, ends in SIGKILL. It waits
        # for one at most an interval, which must hold a whole turn of 1.0.x's loop: a job
        # (2 to 3 s here) and the 3 s before the next (with 3 s, the first stop's wait ran
        # out 0.2 s before the next job started, in a whole run's quiet part).
        "deploys", "--workers", "1", "--deploys", "2",
        "--grace-s", "1", "--jobs", "6", "--long-share", "1", "--warmup-s", "3",
        "--interval-s", "8", "--stop-when", "mid-job",
    )  # fmt: skip
    # 1.0.1 breaks its promise: the run is not ok, whatever the bisection found.
    assert outcome.code == 1, outcome.stderr
    assert outcome.result["bisection"]["found"] == "1.0.2"
    # Side by side, each release's progress says which release it is.
    assert {"[1.0.1] ", "[1.0.2] "} <= {line[:8] for line in outcome.stderr.splitlines()}

    def record(release: str) -> dict[str, Any]:
        kept: dict[str, Any] = json.loads((tmp_path / "v" / release / "deploys.json").read_text())
        return kept

    old, fixed = record("1.0.1"), record("1.0.2")
    assert old["plan"]["stop_when"] == "mid-job"
    # The first stop found the first worker at work, and its SIGKILL cut that job.
    first = next(w for w in old["workers"] if w["step"] == 0)
    assert first["held_when_stopped"], first
    assert first["held_when_killed"] == first["held_when_stopped"], first
    assert old["system"]["version"] == "pgqueuer 1.0.1"
    lost = [f for f in old["findings"] if f["kind"] == "lost_in_deploy"]
    # The job the SIGKILL cut stays picked; every job after it stays queued.
    assert {f["facts"]["stored"] for f in lost} == {"picked", "queued"}
    assert old["promises"]["keeps_its_promises"] is False
    assert fixed["system"]["version"] == "pgqueuer 1.0.2"
    assert not [f for f in fixed["findings"] if f["kind"] == "lost_in_deploy"]
    assert fixed["promises"]["keeps_its_promises"] is True
    assert {job["stored"] for job in fixed["jobs"].values()} == {"successful"}


def _unreadable(directory: Path) -> Any:
    raise OSError(f"{directory}: the reader cannot open it")


def unreadable_system() -> System:
    """The shipped SQLite queue whose independent reader fails."""
    return dataclasses.replace(resolve_system("sqlite"), reader=_unreadable)


def test_a_second_sigterm_goes_half_a_grace_later_and_a_slot_still_draining_is_skipped(
    tmp_path: Path, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "s",
        "tests.lab.deploys.test_deploys:ignoring_system",
        # A grace long beside the interval: the second stop comes while the first worker
        # surely still drains, also when a busy machine delays the lab's loop.
        "--workers", "1", "--deploys", "2", "--grace-s", "3", "--interval-s", "0.2",
        "--signal", "SIGTERM-twice", "--replace", "after-exit", "--jobs", "1",
        "--recovery-wait-s", "0",
    )  # fmt: skip
    (first,) = [w for w in record["workers"] if w["stopped_by"] == "deploy"]
    assert [s["signal"] for s in first["signals"]] == ["SIGTERM", "SIGTERM", "SIGKILL"]
    second = first["signals"][1]["at_s"] - first["signals"][0]["at_s"]
    assert 1.5 <= second < 3
    # The second stop came while the only slot's worker still drained: nothing to stop.
    assert record["skipped"] == [{"step": 1, "slot": 0}]


def test_a_reader_that_fails_is_a_failed_run_never_a_lost_job(
    tmp_path: Path, run_cli: RunCli
) -> None:
    record = _deploys(
        run_cli,
        tmp_path / "r",
        "tests.lab.deploys.test_deploys:unreadable_system",
        "--workers", "1", "--deploys", "1", "--grace-s", "0.3", "--jobs", "1",
        "--long-share", "0",
    )  # fmt: skip
    assert record["exit_code"] == 1
    assert record["error"]["type"] == "ReaderFailed"
    assert record["promises"] is None


def test_a_lease_or_a_bound_that_cannot_be_is_refused(tmp_path: Path) -> None:
    from crashqueuelab.core.errors import InvalidInput
    from crashqueuelab.lab.deploys.plan import DeployPlan
    from crashqueuelab.lab.deploys.run import run_deploys

    with pytest.raises(InvalidInput):
        run_deploys(tmp_path / "x", system="sqlite", plan=DeployPlan(), lease_s=0.0)
    with pytest.raises(InvalidInput):
        run_deploys(tmp_path / "x", system="sqlite", plan=DeployPlan(), recovery_wait_s=-1.0)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("system", ["huey", "rq", "procrastinate"])
def test_scheduled_jobs_through_a_librarys_own_scheduling_call_across_a_deploy(
    system: str, tmp_path: Path, request: pytest.FixtureRequest, run_cli: RunCli
) -> None:
    """One worker, stopped once and replaced after its exit, its jobs short: each scheduled
    job is judged from the ledger against its due time, and a start before it is a broken
    promise (RQ keeps whole seconds: one due at 1.4 s may start at 1.0 s)."""
    servers = {"rq": "redis_socket", "procrastinate": "postgres_dsn"}  # huey's is a file
    if system in servers:
        request.getfixturevalue(servers[system])
    record = _deploys(
        run_cli,
        tmp_path / system,
        system,
        "--workers", "1", "--deploys", "1", "--grace-s", "2", "--jobs", "3",
        "--scheduled", "2", "--long-share", "0", "--replace", "after-exit",
        "--recovery-wait-s", "8",
    )  # fmt: skip
    assert record["error"] is None
    timed = record["scheduled"]["jobs"]
    assert len(timed) == 2
    for job in timed.values():
        assert len(job["starts_s"]) <= 1, job
        if job["starts_s"]:
            assert job["first_start_after_due_s"] > -1.0, job
    early = [f["text"] for f in record["findings"] if f["kind"] == "scheduled_early"]
    assert all(text in record["promises"]["broken_promises"] for text in early)
    assert (
        "Scheduled jobs: due beside when they ran"
        in (tmp_path / system / "report.html").read_text()
    )


# Quiet and releases: three environments (Celery 5.3.1 with kombu 5.3.1, 5.3.2 and 5.3.3),
# two rolling deploys side by side, then the third, each on a Redis server of its own; mostly
# waits.
@pytest.mark.releases
@pytest.mark.quiet
@pytest.mark.early
def test_kombu_1733_and_1800_a_warm_shutdown_loses_a_task_on_5_3_1_and_none_on_5_3_3(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    """kombu #1733 (Celery #7950): a worker's warm shutdown can leave its last BRPOP pending;
    a task Redis pops for it before the connection closes is never read, never restored.
    From kombu 5.3.2 the channel reads the pending reply as it closes and requeues the task
    through ``QoS.reject``, which pushes it back and then deletes its delivery tag from the
    shared ``unacked`` hash: a second worker that popped it in between (the tag travels with
    the message) loses its own record, and if it too stops before running the task, nothing
    restores it (kombu #1800, fixed in 5.3.3). So 5.3.3 must keep every task; what 5.3.1 and
    5.3.2 lose with Redis holding it nowhere was never run. 5.3.2 lost such a task in 2 of
    28 runs of another shape (real-queues.md), so one run does not assert it of 5.3.2. Each
    stop falls due once Celery's worker takes jobs (its ``worker_ready``): a worker stopped
    while it still boots has no BRPOP pending, which made the window rare (5.3.1 lost
    nothing in most runs); four tasks come right after each stop's signals."""
    directory = tmp_path / "v"
    outcome = run_cli(
        "versions", "--system", "celery==5.3.1", "--vary", "kombu",
        "--releases", "5.3.1,5.3.2,5.3.3",
        "--output-directory", str(directory), "--at-once", "2",
        # Both workers stopped at once (their replacements take seconds to poll), each stop
        # as soon as both take jobs, and tasks submitted all along, four right after each
        # stop's signals, none longer than the grace: a task can only be lost to a stopped
        # worker's pending BRPOP or to the requeue of one (or, SIGKILLed, as documented).
        "deploys", "--workers", "2", "--surge", "2", "--deploys", "6", "--interval-s", "3",
        "--submit-at-stops", "4",
        # A busy machine slows the replacements' first polls: the wait ends once all is
        # done, so a longer bound costs nothing when it is not needed.
        "--jobs", "36", "--long-share", "0", "--grace-s", "5", "--recovery-wait-s", "25",
        "--seed", "3",
    )  # fmt: skip

    def record(release: str) -> dict[str, Any]:
        kept: dict[str, Any] = json.loads((directory / release / "deploys.json").read_text())
        assert kept["system"]["version"].startswith(f"celery 5.3.1 (kombu {release},")
        return kept

    old, partly, fixed = record("5.3.1"), record("5.3.2"), record("5.3.3")
    assert fixed["promises"]["keeps_its_promises"] is True, fixed["anomalies"]
    nowhere = {
        release: [
            f
            for f in kept["findings"]
            if f["kind"] == "lost_in_deploy" and f["facts"]["stored"] == "nowhere"
        ]
        for release, kept in (("5.3.1", old), ("5.3.2", partly))
    }
    for findings in nowhere.values():
        assert {f["facts"]["last_end"] for f in findings} <= {"never ran"}, findings
    if not nowhere["5.3.1"]:
        pytest.skip("kombu 5.3.1: no task fell into a stopped worker's pending BRPOP this run")
    assert outcome.code == 1, outcome.stderr
    assert old["promises"]["keeps_its_promises"] is False
    rows = {row["release"]: row for row in outcome.result["rows"]}
    assert rows["5.3.3"]["keeps_its_promises"] is True
    assert rows["5.3.1"]["keeps_its_promises"] is False


# Quiet and releases: two environments (Celery 5.4.0 and 5.5.0, the same kombu, gevent beside
# each), two rolling deploys side by side, each on a Redis server of its own; mostly waits.
@pytest.mark.releases
@pytest.mark.quiet
def test_celery_5663_a_task_finished_in_a_gevent_warm_shutdown_runs_again_on_5_4_0_not_5_5_0(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    """Celery #5663 (fixed by PR #9348, first in 5.5.0): under the gevent pool a late
    acknowledgement waits for the consumer loop's next turn, and before 5.5.0 a warm shutdown
    ends that loop without it, so the connection's close puts the finished task's message
    back and a replacement runs it again. The window (a task ending between the loop's last
    turn and the worker's exit) is a matter of timing: what a run finds on 5.4.0 is asserted
    when it finds it, and said (a skip, never a pass) when it does not."""
    outcome = run_cli(
        "versions", "--system", "celery-gevent-acks-late", "--releases", "5.4.0,5.5.0",
        # The same kombu under both: the releases differ by Celery alone.
        "--with", "kombu==5.5.4",
        "--output-directory", str(tmp_path / "v"), "--at-once", "2",
        # Every task shorter than the grace: a worker exits by itself after each SIGTERM,
        # so nothing it ran may run again (a SIGKILL's redelivery is documented).
        "deploys", "--workers", "2", "--deploys", "2", "--jobs", "20", "--long-share", "0",
        "--grace-s", "3", "--recovery-wait-s", "10", "--seed", "3",
    )  # fmt: skip

    def record(release: str) -> dict[str, Any]:
        kept: dict[str, Any] = json.loads((tmp_path / "v" / release / "deploys.json").read_text())
        return kept

    old, fixed = record("5.4.0"), record("5.5.0")
    assert old["system"]["version"].startswith("celery 5.4.0 (kombu 5.5.4,")
    assert fixed["system"]["version"].startswith("celery 5.5.0 (kombu 5.5.4,")
    # The fixed release acknowledges every task it finished before its worker exits.
    assert fixed["promises"]["keeps_its_promises"] is True, fixed["anomalies"]
    runs_again = [f for f in old["findings"] if f["kind"] == "ran_twice"]
    # A worker that did not exit within the grace on a busy machine was SIGKILLed: its
    # redelivery is documented. Each run again after a worker that exited by itself is #5663,
    # a broken promise.
    again = [f for f in runs_again if f["facts"]["worker_then"] == "exited"]
    killed = [f for f in runs_again if f["facts"]["worker_then"] != "exited"]
    assert {f["facts"]["worker_then"] for f in killed} <= {"sigkilled"}
    assert not any(f["text"] in old["promises"]["broken_promises"] for f in killed)
    assert all(f["text"] in old["promises"]["broken_promises"] for f in again)
    if not again:
        pytest.skip("Celery 5.4.0: no task finished inside a warm shutdown's window this run")
    assert outcome.code == 1, outcome.stderr
    assert old["promises"]["keeps_its_promises"] is False
