"""taskiq with taskiq-redis's stream broker under the lab, on a Redis server the tests start:
crash points, the independent reader of the stream, and the verdict against taskiq's own
promises.

taskiq and taskiq-redis come with the ``taskiq`` extra, and Debian's ``redis-server`` with
``.ci/run``: these tests run in CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.findings import Kind
from crashqueuelab.judges.readers.taskiq import (
    QUEUE_FILE,
    queue_name,
    read_taskiq_store,
    task_id,
)
from crashqueuelab.judges.resp import RespConnection
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.servers.redis import SOCKET_VARIABLE
from crashqueuelab.systems import (
    JobSpec,
    JobStatus,
    OpenRequest,
    QueueClient,
    Verdict,
    resolve_system,
)
from crashqueuelab.systems.libraries.taskiq.points import CRASH_POINTS
from crashqueuelab.systems.libraries.taskiq.system import read_store
from crashqueuelab.systems.libraries.taskiq.worker import lab_job
from tests.systems.libraries.power_cuts import (
    keeps_every_answered_job,
)


def open_taskiq(directory: Path) -> QueueClient:
    request = OpenRequest(
        directory, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    return resolve_system("taskiq").open(request)


def test_every_crash_point_passes_but_those_a_pending_entry_explains(
    tmp_path: Path, redis_socket: str
) -> None:
    # The crash cases alone: the probes and the model workload add 30 s of claims that
    # wait for nothing (CLAIM_WAIT_S each) and find what the probes below find.
    points = [point.name for point in CRASH_POINTS]
    report = run_campaign(tmp_path / "c", seed=3, system="taskiq", crash_points=points, probes=[])
    failed = {case["fault_point"] for case in report["cases"] if not case["passed"]}
    # A consumer that dies holding entries leaves them pending until idle_timeout passed on
    # Redis's clock: the recovery, on the lab's clock, does not wait for it.
    assert failed == {
        "listen:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "finish:before",
        # The flaky job's entry was delivered with the effect job's and is still pending.
        "finish:after",
        "retry:before",
    }
    assert report["summary"]["crash_states_all_match"] is True
    assert report["system"]["version"].startswith("taskiq-redis ")
    promises = report["promises"]
    assert promises["broken_promises"] == []
    assert promises["keeps_its_promises"] is True


def test_a_power_cut_keeps_every_entry_an_always_synced_aof_answered(
    tmp_path: Path, redis_socket: str
) -> None:
    """The power-loss campaign on ``taskiq-aof-always`` (the append-only file synced on every
    write): no crash state loses a job Redis answered for, and nothing is explained by RDB
    snapshots, which it does not run on."""
    always = resolve_system("taskiq-aof-always")
    assert always.persistence == "aof-always"
    assert not [d for d in always.documented if d.what.startswith("RDB snapshots")]
    assert [d for d in resolve_system("taskiq").documented if d.what.startswith("RDB snapshots")]
    # A chaos run's stall outlasts three of idle_timeout's reclaims: never explained by it.
    stall_kinds = {Kind.WORK_STALLED, Kind.WORK_NEVER_ENDED}
    assert not [d for d in always.documented if stall_kinds & set(d.kinds)], always.documented
    keeps_every_answered_job(tmp_path / "always", "taskiq-aof-always", ["kiq:after", "retry:after"])


def test_the_adapter_drives_taskiq_and_the_reader_finds_each_job_where_taskiq_left_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_taskiq(store)
    try:
        client.submit(JobSpec("k/effect", "t", {"a": 1}))
        client.submit(JobSpec("k/flaky", "t", {}, max_attempts=2))
        # A key the stream holds is not kicked again: the first job stands.
        client.submit(JobSpec("k/effect", "t", {"a": 2}))
        assert client.active_count() == 2
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert (claim.key, claim.payload, claim.attempt) == ("k/effect", {"a": 1}, 1)
        # One XREADGROUP delivered both entries to this consumer.
        assert read_taskiq_store(store).jobs == {
            "k/effect": ("pending", 1),
            "k/flaky": ("pending", 1),
        }
        view = client.job("k/effect")
        assert view is not None
        assert (view.native_state, view.status) == ("pending", JobStatus.LEASED)
        assert client.succeed(claim) is Verdict.SUCCEEDED
        assert client.succeed(claim) is Verdict.STALE
        flaky = client.claim("w1", 5_000_000)
        assert flaky is not None
        assert client.fail(flaky, "boom") is Verdict.RETRY
        assert read_taskiq_store(store).jobs["k/flaky"] == ("queued", 1)
        again = client.claim("w1", 5_000_000)
        assert again is not None
        assert again.attempt == 2
        assert client.fail(again, "boom") is Verdict.DEAD
        assert client.fail(again, "boom") is Verdict.STALE
        assert client.claim("w1", 5_000_000) is None
        assert client.job("missing") is None
        dead = client.job("k/flaky")
        assert dead is not None
        assert (dead.status, dead.attempts) == (JobStatus.DEAD, 2)
        with pytest.raises(OperationUnsupported, match="heartbeat"):
            client.heartbeat(again, 5_000_000)
    finally:
        client.close()
    reading = read_taskiq_store(store)
    assert reading.problems == ()
    assert reading.jobs == {"k/effect": ("succeeded", 1), "k/flaky": ("failed", 2)}
    assert [entry.state for entry in reading.entries] == ["acknowledged"] * 3


def test_the_reader_reports_what_the_lab_did_not_write(tmp_path: Path, redis_socket: str) -> None:
    store = tmp_path / "store"
    open_taskiq(store).close()
    queue = queue_name(store)
    assert queue is not None
    with RespConnection(redis_socket) as connection:
        connection.command("XADD", queue, "*", "data", b"not json")
        message = {"task_id": task_id(queue, "odd"), "args": ["odd"], "labels": {}}
        connection.command("XADD", queue, "*", "data", json.dumps(message))
        # An entry delivered, then acknowledged without the result taskiq saves first.
        connection.command("XREADGROUP", "GROUP", "taskiq", "c", "STREAMS", queue, ">")
        for entry in read_taskiq_store(store).entries:
            connection.command("XACK", queue, "taskiq", entry.id)
    reading = read_taskiq_store(store)
    assert reading.jobs == {"odd": ("acknowledged", 1)}
    assert reading.problems[0].endswith("not a message of the lab's")
    assert reading.problems[1] == "job odd: acknowledged, with no result"


def test_the_reader_says_whether_the_reclaim_lock_is_held_and_when_it_expires(
    tmp_path: Path, redis_socket: str
) -> None:
    """The lock is redis-py's: a token set only when absent, with or without a timeout."""
    store = tmp_path / "store"
    open_taskiq(store).close()
    queue = queue_name(store)
    key = f"autoclaim:taskiq:{queue}"
    facts = read_store(store).facts
    assert facts == {"reclaim_lock": {"held": False}}
    with RespConnection(redis_socket) as connection:
        connection.command("SET", key, "a-dead-holders-token", "NX")
        assert read_taskiq_store(store).facts["reclaim_lock"] == {
            "held": True,
            "expires_in_ms": None,
        }
        connection.command("PEXPIRE", key, 60_000)
        lock = read_store(store).facts["reclaim_lock"]
    assert lock["held"] is True
    assert 0 < lock["expires_in_ms"] <= 60_000


def test_a_claim_reported_through_another_client_is_acknowledged_and_closes_its_connection(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    first = open_taskiq(store)
    try:
        first.submit(JobSpec("a", "t", {}))
        claim = first.claim("w1", 5_000_000)
        assert claim is not None
    finally:
        first.close()
    second = open_taskiq(store)
    try:
        # The entry is acknowledged through the consumer that read it, its client closed.
        assert second.succeed(claim) is Verdict.SUCCEEDED
    finally:
        second.close()
    assert read_taskiq_store(store).jobs == {"a": ("succeeded", 1)}


def test_a_stream_no_group_has_read_is_all_queued(tmp_path: Path, redis_socket: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / QUEUE_FILE).write_text('{"queue": "taskiq-lab-nogroup"}')
    assert read_taskiq_store(store).jobs == {}
    message = {"task_id": task_id("taskiq-lab-nogroup", "k"), "args": ["k"], "labels": {}}
    with RespConnection(redis_socket) as connection:
        connection.command("XADD", "taskiq-lab-nogroup", "*", "data", json.dumps(message))
    assert read_taskiq_store(store).jobs == {"k": ("queued", 0)}


def test_without_a_server_the_reader_and_the_adapter_say_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert read_taskiq_store(store).exists is False
    store.mkdir()
    (store / QUEUE_FILE).write_text('{"queue": "q"}')
    environ = os.environ.pop(SOCKET_VARIABLE, None)
    try:
        assert read_taskiq_store(store).problems[0].startswith("no Redis server named")
        answer = read_taskiq_store(store, str(tmp_path / "nothing.sock"))
        assert answer.problems[0].startswith("Redis did not answer")
        with pytest.raises(SystemUnavailable, match="no Redis server"):
            open_taskiq(tmp_path / "other")
    finally:
        if environ is not None:
            os.environ[SOCKET_VARIABLE] = environ


def test_a_job_runs_only_under_the_labs_worker(tmp_path: Path, redis_socket: str) -> None:
    own = resolve_system("taskiq").own_worker
    assert own is not None
    assert own.schedule is None
    with pytest.raises(SystemUnavailable, match="no taskiq store"):
        own.serve(tmp_path / "none", "w1", lambda key: None)
    with pytest.raises(SystemUnavailable, match="runs only under crashqueuelab"):
        lab_job("k", "t", {})


def test_a_pinned_release_before_1_2_4_gets_the_taskiq_it_can_import() -> None:
    from crashqueuelab.systems.libraries.taskiq import LIBRARY
    from crashqueuelab.systems.registry import companions_of

    assert companions_of("taskiq", "1.0.5") == ("taskiq<0.13",)
    assert companions_of("taskiq", "1.1.2") == ("taskiq<0.13",)
    assert companions_of("taskiq", "1.2.3") == ("taskiq<0.13",)
    assert LIBRARY.companions_for("1.2.4") == ()
    assert LIBRARY.companions_for("1.10.0") == ()
    # Only a library's declaration names companions.
    assert companions_of("sqlite", "1.0") == ()
