"""dramatiq under the lab, with its Redis broker on a Redis server the tests start: crash
points, the independent reader, and the verdict against dramatiq's own promises.

dramatiq, its Redis client and pika come with the ``dramatiq`` extra, and Debian's
``redis-server`` with ``.ci/run``: these tests run in CI.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import OperationUnsupported, SystemUnavailable
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.readers.dramatiq import (
    NAMESPACE,
    QUEUE_FILE,
    SUBMITTED_FILE,
    queue_name,
    read_dramatiq_store,
    result_key,
    submitted,
)
from crashqueuelab.judges.resp import RespConnection
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import forkserver_context, start_owned
from crashqueuelab.servers.redis import SOCKET_VARIABLE
from crashqueuelab.systems import (
    JobSpec,
    JobStatus,
    OpenRequest,
    QueueClient,
    Verdict,
    resolve_system,
)
from crashqueuelab.systems.libraries.dramatiq.client import (
    JobFailed,
    lab_job,
    message_id,
)
from tests.systems.libraries.power_cuts import (
    keeps_every_answered_job,
    loses_the_job_as_rdb_documents,
)


def open_dramatiq(directory: Path) -> QueueClient:
    request = OpenRequest(
        directory, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    return resolve_system("dramatiq").open(request)


def test_every_crash_point_passes_but_those_the_heartbeat_timeout_or_a_death_in_a_move_explains(
    tmp_path: Path, redis_socket: str
) -> None:
    report = run_campaign(tmp_path / "c", seed=3, system="dramatiq")
    failed = {case["fault_point"] for case in report["cases"] if not case["passed"]}
    # A worker that dies holding a message leaves it in its acks set until its heartbeat
    # is older than the timeout on the wall clock: the recovery, on the lab's clock, cannot
    # wait for it. So does one that dies moving the flaky job's due retry to its queue: as
    # it fetched it (move:before), the delayed copy; once it moved it (move:after), the
    # delayed copy beside the moved one, which the recovery runs.
    assert failed == {
        "fetch:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "finish:before",
        "fail:before",
        "move:before",
        "move:after",
    }
    assert report["summary"]["crash_states_all_match"] is True
    assert report["system"]["version"].startswith("dramatiq ")
    promises = report["promises"]
    assert promises["broken_promises"] == []
    assert promises["keeps_its_promises"] is True
    cases = {case["fault_point"]: case for case in report["cases"]}
    # Fetched from the delay queue and not moved: the delayed copy in the dead worker's acks
    # set, the flaky job's only effect never made, nothing else wrong.
    fetched = cases["move:before"]
    assert fetched["recovery"]["final_states"] == {"effect": "acked", "flaky": "delayed"}
    assert fetched["recovery"]["ledger"]["effects_by_key"] == {f"{fetched['case_id']}/effect-1": 1}
    assert fetched["crash_judgement"]["problems"] == []
    assert fetched["recovery"]["store"]["problems"] == []
    # Moved, the delayed copy not yet acknowledged: two live copies of the flaky job; the
    # recovery ran the moved one, once, and the delayed one is still live after it.
    moved = cases["move:after"]
    flaky = f"job {moved['case_id']}/flaky"
    assert moved["crash_judgement"]["problems"] == [f"{flaky}: more than one live message"]
    assert moved["recovery"]["store"]["problems"] == [
        f"{flaky}: a result, yet a message still live"
    ]
    assert moved["recovery"]["final_states"] == {"effect": "acked", "flaky": "acked"}
    assert moved["recovery"]["each_effect_durable_once"] is True
    # The two live copies are the weakness of a death inside the move, and only that case's.
    (moved_twice,) = [
        weakness
        for weakness in promises["weaker_as_documented"]
        if weakness["what"].startswith("on Redis, a worker that died while it moved")
    ]
    assert moved_twice["lines"] == 1
    assert moved_twice["first"].startswith("case ")
    assert "-move-after: " in moved_twice["first"]
    finished = next(case for case in report["cases"] if case["fault_point"] == "finish:after")
    assert finished["recovery"]["final_states"] == {"effect": "acked", "flaky": "acked"}


def _killed_as_it_moves(store: str, inherited: Inherited) -> None:
    """A worker whose claim moves a due retry to its queue and dies (SIGKILL) right after
    the enqueue, before it acknowledged the delayed copy."""
    inherited.adopt()

    def die_after_the_move(point: str) -> None:
        if point == "move:after":
            os.kill(os.getpid(), signal.SIGKILL)

    request = OpenRequest(
        Path(store),
        clock=ManualClock(10**9),
        ids=SeededIds(2, "m"),
        retry=RetryPolicy(),
        hook=die_after_the_move,
    )
    resolve_system("dramatiq").open(request).claim("w2", 5_000_000)
    os._exit(1)  # no due retry was moved


def test_a_power_cut_keeps_what_an_always_synced_aof_answered_and_rdb_takes_it_back(
    tmp_path: Path, redis_socket: str
) -> None:
    """The power-loss campaign: with the append-only file synced on every write
    (``dramatiq-aof-always``) no crash state loses a message Redis answered for; at Redis's
    default RDB snapshots the cut takes back every message since the server started, which
    Redis documents: not a broken promise of dramatiq's."""
    always = resolve_system("dramatiq-aof-always")
    assert (always.persistence, always.durability.split(":")[0]) == (
        "aof-always",
        "Redis persistence aof-always",
    )
    assert not [d for d in always.documented if d.what.startswith("RDB snapshots")]
    keeps_every_answered_job(
        tmp_path / "always", "dramatiq-aof-always", ["enqueue:after", "finish:after"]
    )
    first = loses_the_job_as_rdb_documents(tmp_path / "rdb", "dramatiq", "enqueue:after")
    assert "acknowledged work lost" in first, first


def test_a_worker_killed_as_it_moves_a_due_retry_leaves_two_live_copies_of_it(
    tmp_path: Path, redis_socket: str
) -> None:
    """dramatiq's worker moves a due delayed message to its queue, then acknowledges the
    delayed one: a worker that dies between the two leaves the moved copy queued and the
    delayed one in its acks set, two live copies of one message; once its heartbeat is
    heartbeat_timeout old, a live worker's maintenance puts the delayed one back, to be
    moved and run again: dramatiq's at least once for a worker failure, on Redis as on
    RabbitMQ (where the connection's close puts the delayed copy back at once)."""
    store = tmp_path / "store"
    client = open_dramatiq(store)
    try:
        client.submit(JobSpec("k/flaky", "t", {}, max_attempts=3))
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert client.fail(claim, "boom") is Verdict.RETRY
        process = forkserver_context(()).Process(
            target=_killed_as_it_moves, args=(str(store), Inherited.capture())
        )
        start_owned(process)
        try:
            process.join(60)
        finally:
            if process.exitcode is None:
                process.kill()
                process.join(10)
        assert process.exitcode == -signal.SIGKILL
        # The moved copy queued, the delayed one in the dead worker's acks set.
        two = read_dramatiq_store(store)
        assert two.problems == ("job k/flaky: more than one live message",)
        moved = client.claim("w1", 5_000_000)
        assert moved is not None
        assert moved.attempt == 2
        assert client.succeed(moved) is Verdict.SUCCEEDED
        # Its result stored, the delayed copy waits in the dead worker's acks set for a
        # maintenance (dramatiq's default chance, 0.1% of commands) past the heartbeat
        # timeout, which puts it back to be moved and run again.
        left = read_dramatiq_store(store)
        assert left.problems == ("job k/flaky: a result, yet a message still live",)
    finally:
        client.close()


def test_two_live_copies_on_redis_are_dramatiqs_promise_only_after_a_death_inside_a_claim() -> None:
    """The chaos run's finding after the death above (``claim_cut``: a worker died inside
    a claim after an attempt of the job failed with a retry) is the documented weakness;
    without such a death, two live copies of one message are a broken promise."""
    from crashqueuelab.judges.findings import inconsistent
    from crashqueuelab.lab.runs.promises import classify

    system = resolve_system("dramatiq")
    for problem in ("more than one live message", "a result, yet a message still live"):
        found = inconsistent(f"job j: {problem}", "judge: ")
        cut = classify(system, "process", [found.within("", claim_cut=True)], ["SIGKILL"])
        assert cut["keeps_its_promises"] is True, cut
        live = classify(system, "process", [found.within("", claim_cut=False)], ["SIGKILL"])
        assert live["broken_promises"] == [f"judge: job j: {problem}"]


def test_the_adapter_drives_dramatiq_and_the_reader_finds_each_job_where_dramatiq_left_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_dramatiq(store)
    try:
        client.submit(JobSpec("k/effect", "t", {"a": 1}))
        client.submit(JobSpec("k/flaky", "t", {}, max_attempts=2))
        # A job Redis holds is not enqueued again (dramatiq has no idempotency key).
        client.submit(JobSpec("k/effect", "t", {"a": 2}))
        assert client.active_count() == 2
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert (claim.key, claim.payload, claim.attempt) == ("k/effect", {"a": 1}, 1)
        assert read_dramatiq_store(store).jobs["k/effect"] == ("fetched", 1)
        view = client.job("k/effect")
        assert view is not None
        assert (view.native_state, view.status) == ("fetched", JobStatus.LEASED)
        assert client.succeed(claim) is Verdict.SUCCEEDED
        # A second report of the delivery reaches nothing: the acks set no longer holds it.
        assert client.succeed(claim) is Verdict.STALE
        assert client.fail(claim, "late") is Verdict.STALE
        flaky = client.claim("w1", 5_000_000)
        assert flaky is not None
        assert client.fail(flaky, "boom") is Verdict.RETRY
        assert read_dramatiq_store(store).jobs["k/flaky"] == ("delayed", 1)
        again = client.claim("w2", 5_000_000)
        assert again is not None
        assert again.attempt == 2
        assert client.fail(again, "boom") is Verdict.DEAD
        assert client.claim("w1", 5_000_000) is None
        assert client.job("missing") is None
        dead = client.job("k/flaky")
        assert dead is not None
        assert (dead.status, dead.attempts) == (JobStatus.DEAD, 2)
        # A finished job's result is kept: it is not enqueued again.
        client.submit(JobSpec("k/effect", "t", {"a": 3}))
        assert client.claim("w1", 5_000_000) is None
        assert client.recover() == 0
        with pytest.raises(OperationUnsupported, match="heartbeat"):
            client.heartbeat(again, 5_000_000)
    finally:
        client.close()
    reading = read_dramatiq_store(store)
    assert reading.problems == ()
    assert reading.jobs == {"k/effect": ("acked", 1), "k/flaky": ("dead", 2)}


def test_the_reader_reads_without_dramatiq_and_names_what_the_lab_did_not_write(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    open_dramatiq(store).close()
    queue = queue_name(store)
    assert queue is not None
    base = f"{NAMESPACE}:{queue}"
    message = {"args": ["odd", "t", {}], "options": {"retries": 0}}
    with RespConnection(redis_socket) as connection:
        connection.command("HSET", f"{base}.msgs", "r1", json.dumps(message))
        connection.command("RPUSH", base, "r2", "r2")
        connection.command("HSET", f"{base}.DQ.msgs", "r3", json.dumps(message))
        reading = read_dramatiq_store(store)
        connection.command("SADD", f"{NAMESPACE}:__acks__.b1.{queue}", "r4")
        reading = read_dramatiq_store(store)
        assert reading.problems == (
            "message r2: in the queue 2 times",
            "message r2: in the queue, its message gone",
            "message r4: in a worker's acks set, its message gone",
            "job odd: a delayed message in no delay queue",
            "job odd: a message in no queue and fetched by no worker",
        )
        connection.command("LPUSH", result_key(queue, "m1"), json.dumps({"type": "JobFailed"}))
        connection.command("LPUSH", result_key(queue, "m2"), "1")
        connection.command("RPUSH", base, "r1")
    (store / SUBMITTED_FILE).write_text(
        '{"key": "gone", "message_id": "m1"}\n{"key": "odd", "message_id": "m2"}\n{"cut'
    )
    assert submitted(store) == {"gone": "m1", "odd": "m2"}
    reading = read_dramatiq_store(store)
    assert reading.jobs == {"gone": ("dead", 0), "odd": ("acked", 1)}
    assert "job odd: a result, yet a message still live" in reading.problems


def test_without_a_server_the_reader_and_the_adapter_say_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert read_dramatiq_store(store).exists is False
    assert submitted(store) == {}
    store.mkdir()
    (store / QUEUE_FILE).write_text('{"queue": "q"}')
    environ = os.environ.pop(SOCKET_VARIABLE, None)
    try:
        assert read_dramatiq_store(store).problems[0].startswith("no Redis server named")
        answer = read_dramatiq_store(store, str(tmp_path / "nothing.sock"))
        assert answer.problems[0].startswith("Redis did not answer")
        with pytest.raises(SystemUnavailable, match="no Redis server"):
            open_dramatiq(tmp_path / "other")
    finally:
        if environ is not None:
            os.environ[SOCKET_VARIABLE] = environ


def test_a_message_runs_only_under_the_lab_and_its_id_is_the_stores_and_the_keys() -> None:
    with pytest.raises(JobFailed, match="runs only under crashqueuelab"):
        lab_job("k", "t", {})
    assert message_id("q", "k") == message_id("q", "k") != message_id("q", "k2")
