"""arq under the lab on a Redis server the tests start: crash points, the independent reader,
and the verdict against arq's own promises.

arq and its Redis client come with the ``arq`` extra, and Debian's ``redis-server`` with
``.ci/run``: these tests run in CI.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.readers.arq import (
    QUEUE_FILE,
    job_id,
    queue_name,
    read_arq_store,
    unpickle,
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
from crashqueuelab.systems.libraries.arq.client import MAX_TRIES, WORK, JobFailed, lab_job
from tests.systems.libraries.power_cuts import (
    keeps_every_answered_job,
    loses_the_job_as_rdb_documents,
)


def open_arq(directory: Path) -> QueueClient:
    request = OpenRequest(
        directory, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    return resolve_system("arq").open(request)


def test_every_crash_point_passes_but_those_arqs_pessimistic_execution_explains(
    tmp_path: Path, redis_socket: str
) -> None:
    report = run_campaign(tmp_path / "c", seed=3, system="arq")
    failed = {case["fault_point"] for case in report["cases"] if not case["passed"]}
    # A worker that dies holding a job leaves its in-progress key until Redis expires it,
    # job_timeout + 10 s on the wall clock: the recovery, on the lab's clock, cannot wait.
    assert failed == {
        "start_job:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "finish:before",
        "retry:before",
    }
    assert report["summary"]["passed"] == 5
    assert report["summary"]["crash_states_all_match"] is True
    assert report["system"]["version"].startswith("arq ")
    promises = report["promises"]
    assert promises["broken_promises"] == []
    assert promises["keeps_its_promises"] is True
    explained = {entry["what"].split(":")[0] for entry in promises["weaker_as_documented"]}
    assert explained == {
        "no token",
        '"pessimistic execution"',
        "a worker that shuts down cancels the jobs it runs and puts them back",
    }
    finished = next(case for case in report["cases"] if case["fault_point"] == "finish:after")
    assert finished["recovery"]["final_states"] == {"effect": "complete", "flaky": "complete"}


def test_a_power_cut_keeps_what_an_always_synced_aof_answered_and_rdb_takes_it_back(
    tmp_path: Path, redis_socket: str
) -> None:
    """The power-loss campaign: with the append-only file synced on every write
    (``arq-aof-always``) no crash state loses a job Redis answered for; at Redis's default
    RDB snapshots the cut takes back every job since the server started, which Redis
    documents: not a broken promise of arq's."""
    keeps_every_answered_job(
        tmp_path / "always", "arq-aof-always", ["enqueue_job:after", "finish:after"]
    )
    first = loses_the_job_as_rdb_documents(tmp_path / "rdb", "arq", "enqueue_job:after")
    assert "acknowledged work lost: effect_job: promised ['queued', 0], found None" in first


def test_the_adapter_drives_arq_and_the_reader_finds_each_job_where_arq_left_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_arq(store)
    try:
        client.submit(JobSpec("k/effect", "t", {"a": 1}))
        client.submit(JobSpec("k/flaky", "t", {}, max_attempts=2))
        # enqueue_job with the same _job_id enqueues nothing: the first job stands.
        client.submit(JobSpec("k/effect", "t", {"a": 2}))
        assert client.active_count() == 2
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert (claim.key, claim.payload, claim.attempt) == ("k/effect", {"a": 1}, 1)
        assert read_arq_store(store).jobs["k/effect"] == ("in_progress", 1)
        view = client.job("k/effect")
        assert view is not None
        assert (view.native_state, view.status) == ("in_progress", JobStatus.LEASED)
        assert client.succeed(claim) is Verdict.SUCCEEDED
        # A second report of the claim reaches nothing: arq recorded the first.
        assert client.succeed(claim) is Verdict.STALE
        flaky = client.claim("w1", 5_000_000)
        assert flaky is not None
        assert client.fail(flaky, "boom") is Verdict.RETRY
        assert read_arq_store(store).jobs["k/flaky"] == ("queued", 1)
        again = client.claim("w1", 5_000_000)
        assert again is not None
        assert again.attempt == 2
        assert client.fail(again, "boom") is Verdict.DEAD
        assert client.claim("w1", 5_000_000) is None
        assert client.job("missing") is None
        dead = client.job("k/flaky")
        assert dead is not None
        assert (dead.status, dead.attempts) == (JobStatus.DEAD, 2)
        # The finished job's id is still refused: its result is kept.
        client.submit(JobSpec("k/effect", "t", {"a": 3}))
        assert client.claim("w1", 5_000_000) is None
    finally:
        client.close()
    reading = read_arq_store(store)
    assert reading.problems == ()
    assert reading.jobs == {"k/effect": ("complete", 1), "k/flaky": ("failed", 2)}


def test_a_job_its_worker_shut_down_on_goes_back_and_past_max_tries_arq_fails_it_unrun(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_arq(store)
    client.submit(JobSpec("a", "t", {}, max_attempts=1))
    assert client.claim("w1", 5_000_000) is not None
    # Worker.close cancels the job: arq puts it back, its one try counted.
    client.close()
    assert read_arq_store(store).jobs == {"a": ("queued", 1)}
    client = open_arq(store)
    try:
        # Picked past max_tries: arq fails it without running it.
        assert client.claim("w1", 5_000_000) is None
        view = client.job("a")
        assert view is not None
        assert (view.status, view.attempts) == (JobStatus.DEAD, 1)
    finally:
        client.close()
    assert read_arq_store(store).jobs == {"a": ("failed", 1)}


def test_the_reader_unpickles_no_class_and_reports_what_the_lab_did_not_write(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    open_arq(store).close()
    queue = queue_name(store)
    assert queue is not None
    with RespConnection(redis_socket) as connection:
        connection.command("ZADD", queue, 1, job_id(queue, "gone"))
        connection.command(
            "SET",
            f"arq:job:{job_id(queue, 'odd')}",
            pickle.dumps({"t": None, "f": "lab_job_1", "a": ("odd", "t", {}), "k": {}}),
        )
        reading = read_arq_store(store)
    assert reading.jobs == {}
    assert reading.problems == (
        f"job {job_id(queue, 'gone')}: in the queue, with neither a definition nor a result",
        "job odd: a definition and no result, yet in no queue",
    )
    # A class a pickle names is a stand-in: nothing is imported to read it.
    stand = unpickle(pickle.dumps(SystemUnavailable("arq", "why")))
    assert type(stand).__name__ == "SystemUnavailable"
    assert "why" in str(stand)


def test_without_a_server_the_reader_and_the_adapter_say_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert read_arq_store(store).exists is False
    store.mkdir()
    (store / QUEUE_FILE).write_text('{"queue": "q"}')
    environ = os.environ.pop(SOCKET_VARIABLE, None)
    try:
        assert read_arq_store(store).problems[0].startswith("no Redis server named")
        answer = read_arq_store(store, str(tmp_path / "nothing.sock"))
        assert answer.problems[0].startswith("Redis did not answer")
        with pytest.raises(SystemUnavailable, match="no Redis server"):
            open_arq(tmp_path / "other")
    finally:
        if environ is not None:
            os.environ[SOCKET_VARIABLE] = environ


def test_what_arq_cannot_do_is_said_and_a_job_runs_only_under_the_lab(
    tmp_path: Path, redis_socket: str
) -> None:
    client = open_arq(tmp_path / "store")
    try:
        # One arq function per attempt limit, up to MAX_TRIES.
        with pytest.raises(OperationUnsupported, match="1001 attempts"):
            client.submit(JobSpec("k", "t", {}, max_attempts=MAX_TRIES + 1))
        client.submit(JobSpec("k", "t", {}))
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        with pytest.raises(OperationUnsupported, match="heartbeat"):
            client.heartbeat(claim, 5_000_000)
    finally:
        client.close()
    own = resolve_system("arq").own_worker
    assert own is not None
    assert own.schedule is not None
    with pytest.raises(SystemUnavailable, match="no arq store"):
        own.serve(tmp_path / "none", "w1", lambda key: None)
    with pytest.raises(SystemUnavailable, match="no arq store"):
        own.schedule(tmp_path / "none", "k", 0.0)
    with pytest.raises(JobFailed, match="runs only under crashqueuelab"):
        asyncio.run(lab_job({}, "k", "t", {}))

    def broken(key: str) -> None:
        raise RuntimeError(f"work of {key} failed")

    # The work's own failure reaches arq as the job's.
    with pytest.raises(RuntimeError, match="work of k failed"):
        asyncio.run(lab_job({WORK: broken}, "k", "t", {}))
