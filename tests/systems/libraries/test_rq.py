"""RQ under the lab on a Redis server the tests start: crash points, the independent reader,
each persistence setting under a power cut, and the verdict against RQ's own promises.

rq and its Redis client come with the ``rq`` extra, and Debian's ``redis-server`` with
``.ci/run``: these tests run in CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import ServerUnavailable, SystemUnavailable
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.readers.rq import QUEUE_FILE, attempts_made, read_rq_store
from crashqueuelab.judges.resp import RespConnection, RespError, text
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.servers.redis import SOCKET_VARIABLE, ThrowawayRedis, find_redis_server
from crashqueuelab.systems import (
    JobSpec,
    JobStatus,
    OpenRequest,
    QueueClient,
    Verdict,
    resolve_system,
)
from tests.conftest import RunCli


def open_rq(directory: Path, name: str = "rq", start_us: int = 10**9) -> QueueClient:
    request = OpenRequest(
        directory, clock=ManualClock(start_us), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    return resolve_system(name).open(request)


def test_every_crash_point_but_the_documented_ones_passes(
    tmp_path: Path, redis_socket: str
) -> None:
    report = run_campaign(tmp_path / "c", seed=5, system="rq")
    failed = {case["fault_point"] for case in report["cases"] if not case["passed"]}
    # A worker that dies between taking a job and starting it leaves the job in RQ's
    # intermediate queue, which only a minute of the wall clock brings back.
    assert failed == {"dequeue:after", "start:before"}
    assert report["summary"]["passed"] == 10
    assert report["system"]["version"].startswith("rq ")
    assert "Redis persistence rdb" in report["system"]["durability"]
    promises = report["promises"]
    assert promises["broken_promises"] == []
    assert promises["keeps_its_promises"] is True
    explained = {entry["what"].split(":")[0] for entry in promises["weaker_as_documented"]}
    assert explained == {
        "no token",
        "a job whose worker died is handed back only once its heartbeat TTL (the job timeout"
        " plus 60 s; 360 s here) has passed on the wall clock, and one taken by a worker that"
        " died before starting it waits in the intermediate queue until the maintenance has"
        " seen it twice, a minute apart",
    }
    # A job whose worker died after starting it comes back once the lab's hour has passed.
    started = next(case for case in report["cases"] if case["fault_point"] == "start:after")
    assert started["passed"] is True
    assert started["recovery"]["final_states"] == {"effect": "finished", "flaky": "finished"}


def test_a_power_cut_keeps_what_aof_always_answered_and_takes_it_without_persistence(
    tmp_path: Path, redis_socket: str
) -> None:
    # Each case starts a server of its own on the power-loss disk; the probe runs on the
    # session's server, which must be named whatever ran before this test.
    from crashqueuelab.lab.faults.powerloss.disk import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    kept = run_campaign(
        tmp_path / "always",
        seed=3,
        system="rq-aof-always",
        crash_mode="power-loss",
        crash_points=["enqueue:after", "finish:after"],
        probes=["idempotent_submit"],
    )
    assert kept["ok"] is True
    assert kept["summary"]["states_losing_acknowledged_work"] == 0
    assert kept["promises"]["verdict"].endswith("keeps its promises and the lab's contract")
    lost = run_campaign(
        tmp_path / "none",
        seed=3,
        system="rq-no-persistence",
        crash_mode="power-loss",
        crash_points=["enqueue:after"],
        probes=["idempotent_submit"],
    )
    assert lost["ok"] is False
    case = lost["cases"][0]
    assert case["states_passed"] == 0
    assert (
        "acknowledged work lost: effect_job: promised ['queued', 0], found None"
        in (case["anomalies"][0])
    )
    # Redis documents it: not a broken promise of RQ's.
    promises = lost["promises"]
    assert promises["keeps_its_promises"] is True
    assert promises["weaker_as_documented"][0]["what"].startswith(
        "Redis without persistence keeps nothing"
    )


def test_the_command_line_starts_a_redis_server_with_the_systems_persistence(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    previous = os.environ.get(SOCKET_VARIABLE)
    outcome = run_cli(
        "campaign",
        "--system", "rq-aof-everysec",
        "--crash-point", "finish:after",
        "--probe", "idempotent_submit",
        "--output-directory", str(tmp_path / "c"),
        "--shrink-seconds", "0",
    )  # fmt: skip
    assert outcome.code == 0, outcome.result
    assert outcome.result["system"]["name"] == "rq-aof-everysec"
    assert "appendfsync everysec" in outcome.result["system"]["durability"]
    # The server was stopped and is no longer named.
    assert os.environ.get(SOCKET_VARIABLE) == previous


def test_the_adapter_drives_rq_and_the_reader_finds_each_job_where_rq_left_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_rq(store)
    try:
        client.submit(JobSpec("k/effect", "t", {"a": 1}))
        client.submit(JobSpec("k/flaky", "t", {}, max_attempts=2))
        # Submitting again finds the job: RQ would overwrite it otherwise.
        client.submit(JobSpec("k/effect", "t", {"a": 2}))
        assert client.active_count() == 2
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert claim.key == "k/effect"
        assert claim.payload == {"a": 1}
        assert read_rq_store(store).jobs["k/effect"] == ("started", 1)
        view = client.job("k/effect")
        assert view is not None
        assert view.native_state == "started"
        assert client.succeed(claim) is Verdict.SUCCEEDED
        flaky = client.claim("w1", 5_000_000)
        assert flaky is not None
        assert client.fail(flaky, "boom") is Verdict.RETRY
        again = client.claim("w1", 5_000_000)
        assert again is not None
        assert again.attempt == 2
        assert client.fail(again, "boom") is Verdict.DEAD
        assert client.claim("w1", 5_000_000) is None
        assert client.job("missing") is None
        assert client.recover() == 0
    finally:
        client.close()
    reading = read_rq_store(store)
    assert reading.problems == ()
    assert reading.jobs == {"k/effect": ("finished", 1), "k/flaky": ("failed", 2)}


def test_a_second_report_of_one_claim_is_stale_once_rq_recorded_the_first(
    tmp_path: Path, redis_socket: str
) -> None:
    client = open_rq(tmp_path / "store")
    try:
        client.submit(JobSpec("a", "t", {}, max_attempts=2))
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert client.fail(claim, "boom") is Verdict.RETRY
        # RQ's worker code has recorded the failure and enqueued the retry: nothing of a
        # second report of the same claim reaches RQ, so it is no acknowledgement.
        assert client.succeed(claim) is Verdict.STALE
        assert client.fail(claim, "again") is Verdict.STALE
        view = client.job("a")
        assert view is not None
        assert (view.status, view.attempts) == (JobStatus.PENDING, 1)
        retry = client.claim("w2", 5_000_000)
        assert retry is not None
        assert retry.attempt == 2
        assert client.succeed(retry) is Verdict.SUCCEEDED
        assert client.succeed(retry) is Verdict.STALE
    finally:
        client.close()
    assert read_rq_store(tmp_path / "store").jobs == {"a": ("finished", 2)}


def test_the_reader_reports_what_the_lab_did_not_write_and_leaves_it_alone(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_rq(store)
    client.close()
    queue = json.loads((store / QUEUE_FILE).read_text())["queue"]
    with RespConnection(redis_socket) as connection:
        connection.command(
            "HSET", "rq:job:foreign", "status", "queued", "origin", queue, "description", "x"
        )
        connection.command(
            "HSET", "rq:job:odd", "status", "queued", "origin", queue,
            "description", 'crashqueuelab {"key": "odd", "max_attempts": 1}',
        )  # fmt: skip
        before = connection.command("HGETALL", "rq:job:foreign")
        reading = read_rq_store(store)
        assert connection.command("HGETALL", "rq:job:foreign") == before
    assert reading.jobs == {"odd": ("dequeued", 0)}
    assert reading.problems == (
        "job foreign: a description the lab did not write: 'x'",
        "job odd: queued, yet in no queue",
    )


def test_without_a_server_the_reader_and_the_adapter_say_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert read_rq_store(store).exists is False
    store.mkdir()
    (store / QUEUE_FILE).write_text('{"queue": "q"}')
    environ = os.environ.pop(SOCKET_VARIABLE, None)
    try:
        assert read_rq_store(store).problems[0].startswith("no Redis server named")
        assert (
            read_rq_store(store, str(tmp_path / "nothing.sock"))
            .problems[0]
            .startswith("Redis did not answer")
        )
        with pytest.raises(SystemUnavailable, match="no Redis server"):
            open_rq(tmp_path / "other")
    finally:
        if environ is not None:
            os.environ[SOCKET_VARIABLE] = environ


def test_attempts_count_the_retries_used_and_the_one_running() -> None:
    assert attempts_made("queued", 3, 2) == 0
    assert attempts_made("started", 3, 2) == 1
    assert attempts_made("queued", 3, 1) == 1
    assert attempts_made("failed", 3, 0) == 3
    assert attempts_made("finished", 1, None) == 1


def test_each_persistence_keeps_across_a_crash_what_it_promises(tmp_path: Path) -> None:
    kept = {}
    for persistence in ("none", "aof-always"):
        with ThrowawayRedis(persistence) as server:
            server.start()
            with RespConnection(server.socket) as connection:
                connection.command("SET", "answer", "42")
            server.restart_after_crash()
            with RespConnection(server.socket) as connection:
                kept[persistence] = text(connection.command("GET", "answer"))
                with pytest.raises(RespError, match="unknown command"):
                    connection.command("NO-SUCH-COMMAND")
    assert kept == {"none": "", "aof-always": "42"}


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown Redis persistence"):
        ThrowawayRedis("sometimes")
    assert find_redis_server({"PATH": str(tmp_path)}) in (None, Path("/usr/bin/redis-server"))
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'no such server' >&2\nexit 1\n")
    fake.chmod(0o755)
    server = ThrowawayRedis(binary=fake)
    with server, pytest.raises(ServerUnavailable, match="redis server: redis-server did not"):
        server.start()
    assert not server.running


@pytest.mark.slow
def test_chaos_with_kills_pauses_and_a_server_restart_loses_nothing_aof_always_kept(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    outcome = run_cli(
        "chaos",
        "--system", "rq-aof-always",
        "--jobs", "80", "--workers", "2", "--kills", "3", "--pauses", "1",
        "--server-restarts", "1", "--poison-jobs", "0", "--seed", "3",
        "--output-directory", str(tmp_path / "chaos"),
        "--shrink-seconds", "0",
    )  # fmt: skip
    report = json.loads((tmp_path / "chaos" / "chaos.json").read_text())
    assert report["server_restarts_delivered"] == 1
    # Killed workers' jobs are still held when the run ends (RQ's TTL is minutes), and a
    # paused worker's late acknowledgement is accepted: what RQ documents; nothing is lost.
    assert not [line for line in report["anomalies"] if "missing from the store" in line]
    assert report["promises"]["keeps_its_promises"] is True, report["promises"]
    # The lab's contract is broken all the same: the run is rejected.
    assert (outcome.code, outcome.result["ok"]) == (1, False)


def test_chaos_with_network_faults_between_rqs_workers_and_redis_loses_nothing(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    """Every worker (and the maintenance process) reaches Redis through a fault proxy path
    of its own, a Unix socket the run names to it in place of the server's: a stall, a
    partition, a lost answer and a reset strike those connections, as they do PostgreSQL's."""
    outcome = run_cli(
        "chaos",
        "--system", "rq",
        "--jobs", "80", "--workers", "2", "--kills", "0", "--poison-jobs", "0",
        "--stalls", "1", "--partitions", "1", "--lost-replies", "1", "--connection-resets", "1",
        "--seed", "3", "--output-directory", str(tmp_path / "chaos"), "--shrink-seconds", "0",
    )  # fmt: skip
    report = json.loads((tmp_path / "chaos" / "chaos.json").read_text())
    network = report["network"]
    assert sorted(window["kind"] for window in network["windows"]) == [
        "lost-replies", "partition", "reset", "stall",
    ]  # fmt: skip
    paths = network["paths"]
    assert {"maintenance", "worker-0", "worker-1"} <= set(paths)
    # The workers' connections went through the proxy, and the faults reached them.
    assert all(paths[name]["connections"] >= 1 for name in ("worker-0", "worker-1"))
    assert sum(counts.get("lost_replies", 0) for counts in paths.values()) == 1
    assert sum(counts.get("reset", 0) for counts in paths.values()) >= 1
    # Nothing lost: what RQ does with an answer it never got is what it documents.
    assert not [line for line in report["anomalies"] if "missing from the store" in line]
    assert report["promises"]["keeps_its_promises"] is True, report["promises"]
    assert outcome.result["ok"] is report["ok"]


def test_a_refusal_quotes_what_the_server_said_last() -> None:
    with ThrowawayRedis() as server:
        assert server.last_words() == "no log"
        server.log.write_text(
            "1:C 03 Dec 2026 09:55:51.916 # Redis is starting\n"
            "1:M 03 Dec 2026 09:55:51.917 * Reading RDB base file on AOF loading...\n"
            "1:M 03 Dec 2026 09:55:51.918 # Bad file format reading the append only file\n"
        )
        assert server.last_words() == (
            "* Reading RDB base file on AOF loading... / # Bad file format reading the append"
            " only file"
        )


def test_redis_exits_on_a_failed_aof_fsync_and_restarted_leaves_an_aof_a_cut_makes_unloadable(
    tmp_path: Path, redis_socket: str
) -> None:
    """A disk-fault case on Redis's data directory (``appendfsync always``): the submission's
    fsync fails once; Redis exits ("Can't persist AOF for fsync error"), so the caller is
    told a connection error, never success. Started again on its disk, as a supervisor
    would, Redis loads its AOF from the page cache, where the write whose fsync failed is
    still readable, and appends after it; at the power cut that write is gone, the AOF has
    a hole, and no Redis starts on it: every job acknowledged after the restart is lost."""
    from crashqueuelab.lab.campaign.diskfaults import FAILED, run_disk_faults
    from crashqueuelab.lab.faults.powerloss.disk import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    record = run_disk_faults(
        resolve_system("rq-aof-always"), "eio-fsync", tmp_path / "run", count=1, steps=(0,),
        spec="rq-aof-always",
    )  # fmt: skip
    (case,) = record["cases"]
    assert case["told"]["error"].startswith("ConnectionError"), case["told"]
    reopen = case["recovered"]["reopen"]
    assert (reopen["opened"], reopen["server"]) == (True, "started again")
    assert "Can't persist AOF for fsync error" in reopen["why"]
    assert case["verdict"] == FAILED
    assert case["found_without_the_fault"] == []
    anomalies = case["anomalies"]
    assert any("the server did not start on the crash state" in line for line in anomalies)
    assert "recovered, cut: job-a: told succeeded (attempts >= 1), the disk holds absent" in (
        anomalies
    )
    # Nothing the caller was told before the cut at once is missing: that window holds.
    assert not [line for line in anomalies if line.startswith("cut at once")]


def test_a_completion_rq_did_not_record_is_an_error_never_success() -> None:
    """RQ's worker code catches an error while it records a job's end and only logs it (a
    Redis that went away mid-record): the job stays started, and the adapter says so
    instead of answering succeeded (it answered succeeded, and a disk-fault case counted
    a completion Redis never wrote as acknowledged)."""
    from types import SimpleNamespace

    from crashqueuelab.systems.libraries.rq.client import OutcomeNotRecorded, RqClient

    def execution(status: str) -> Any:
        return SimpleNamespace(job=SimpleNamespace(get_status=lambda refresh: status))

    RqClient._recorded(execution("JobStatus.FINISHED"), "a")
    RqClient._recorded(execution("failed"), "a")
    with pytest.raises(OutcomeNotRecorded, match="did not record the end of job a"):
        RqClient._recorded(execution("JobStatus.STARTED"), "a")
