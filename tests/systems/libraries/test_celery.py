"""Celery under the lab on its Redis broker, on a Redis server the tests start: crash
points, the independent reader, and the verdict against Celery's own promises.

Celery and its Redis client come with the ``celery`` extra, in the ``redis5`` environment
(pyproject.toml), and Debian's ``redis-server`` with ``.ci/run``: these tests run in CI.
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
from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.judges.readers.celery import (
    QUEUE_FILE,
    key_prefix,
    queue_name,
    read_celery_store,
    task_id,
)
from crashqueuelab.judges.resp import RespConnection
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.servers.redis import SOCKET_VARIABLE
from crashqueuelab.systems import (
    JobSpec,
    JobStatus,
    OpenRequest,
    QueueClient,
    Verdict,
    resolve_system,
)
from crashqueuelab.systems.libraries.celery.client import JobFailed, lab_task
from crashqueuelab.systems.libraries.celery.promises import GLOSSARY, VISIBILITY


def open_celery(directory: Path, system: str = "celery") -> QueueClient:
    request = OpenRequest(
        directory, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    return resolve_system(system).open(request)


#: Where a task stands when its worker died after Celery acknowledged it (the default).
_ACKNOWLEDGED_RUNNING = {
    "execute:after",
    "BEFORE_EFFECT_COMMIT",
    "AFTER_EFFECT_COMMIT",
    "finish:before",
    "retry:before",
}


@pytest.mark.parametrize(
    ("system", "weaknesses"),
    [
        (
            "celery",
            {
                "no lease and no token",
                '"early acknowledgment"',
                "\"If a task isn't acknowledged within the Visibility Timeout the task will be"
                ' redelivered to another worker and executed" ("The default visibility'
                " timeout for Redis is 1 hour\"; one hour, kombu's default, on the wall clock,"
                " which the lab's clock does not move)",
            },
        ),
        (
            "celery-acks-late",
            {
                "no lease and no token",
                '"late acknowledgment"',
                "\"If a task isn't acknowledged within the Visibility Timeout the task will be"
                ' redelivered to another worker and executed" ("The default visibility'
                ' timeout for Redis is 1 hour"; 30 s here, on the wall clock, which the'
                " lab's clock does not move)",
            },
        ),
    ],
)
def test_every_crash_point_passes_but_those_celerys_acknowledgement_explains_and_one_loss(
    tmp_path: Path, redis_socket: str, system: str, weaknesses: set[str]
) -> None:
    report = run_campaign(tmp_path / "c", seed=3, system=system)
    failed = {case["fault_point"] for case in report["cases"] if not case["passed"]}
    # A worker that dies holding a task: acknowledged at its start (the default), it never
    # runs again; received and not acknowledged, it waits in the unacked hash for the
    # visibility timeout on the wall clock, which the recovery, on the lab's clock, cannot.
    # And one that dies inside kombu's receive, after its RPOP took the message off the
    # queue and before its next call wrote it to the unacked hash: the message is nowhere,
    # whatever the acknowledgement settings.
    assert failed == {"unacked:before", "receive:after", "execute:before", *_ACKNOWLEDGED_RUNNING}
    assert report["system"]["version"].startswith("celery ")
    promises = report["promises"]
    (broken,) = promises["broken_promises"]
    case, said = broken.split(": ", 1)
    assert case.endswith("-unacked-before")
    assert said == (
        "the crash state differs from the point's: effect_job: expected ['reserved', 1], found None"
    )
    assert promises["keeps_its_promises"] is False
    explained = {entry["what"].split(":")[0] for entry in promises["weaker_as_documented"]}
    assert explained == {weakness.split(":")[0] for weakness in weaknesses}
    finished = next(case for case in report["cases"] if case["fault_point"] == "finish:after")
    assert finished["recovery"]["final_states"] == {"effect": "succeeded", "flaky": "succeeded"}


def test_the_adapter_drives_celery_and_the_reader_finds_each_task_where_celery_left_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    client = open_celery(store, "celery-acks-late")
    try:
        client.submit(JobSpec("k/effect", "t", {"a": 1}))
        client.submit(JobSpec("k/flaky", "t", {}, max_attempts=2))
        # Celery has no idempotency key: the adapter sends nothing the store holds.
        client.submit(JobSpec("k/effect", "t", {"a": 2}))
        assert client.active_count() == 2
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        assert (claim.key, claim.payload, claim.attempt) == ("k/effect", {"a": 1}, 1)
        # Late acknowledgement: started, and its message still unacknowledged.
        reading = read_celery_store(store)
        assert reading.jobs["k/effect"] == ("started", 1)
        assert reading.unacked == (task_id(queue_name(store) or "", "k/effect"),)
        view = client.job("k/effect")
        assert view is not None
        assert (view.native_state, view.status) == ("started", JobStatus.LEASED)
        assert client.succeed(claim) is Verdict.SUCCEEDED
        # A second report reaches nothing: Celery recorded the first.
        assert client.succeed(claim) is Verdict.STALE
        flaky = client.claim("w1", 5_000_000)
        assert flaky is not None
        assert client.fail(flaky, "boom") is Verdict.RETRY
        assert client.fail(flaky, "boom") is Verdict.STALE
        assert read_celery_store(store).jobs["k/flaky"] == ("queued", 1)
        view = client.job("k/flaky")
        assert view is not None
        assert (view.native_state, view.attempts) == ("queued", 1)
        again = client.claim("w1", 5_000_000)
        assert again is not None
        assert again.attempt == 2
        assert client.fail(again, "boom") is Verdict.DEAD
        assert client.claim("w1", 5_000_000) is None
        assert client.job("missing") is None
        dead = client.job("k/flaky")
        assert dead is not None
        assert (dead.status, dead.attempts) == (JobStatus.DEAD, 2)
        assert client.active_count() == 0
        with pytest.raises(OperationUnsupported, match="heartbeat"):
            client.heartbeat(again, 5_000_000)
    finally:
        client.close()
    reading = read_celery_store(store)
    assert reading.problems == ()
    assert reading.jobs == {"k/effect": ("succeeded", 1), "k/flaky": ("failed", 2)}


def test_a_closed_client_s_task_goes_back_with_late_acks_and_stays_started_with_early_ones(
    tmp_path: Path, redis_socket: str
) -> None:
    found = {}
    for system in ("celery", "celery-acks-late"):
        store = tmp_path / system
        client = open_celery(store, system)
        client.submit(JobSpec("a", "t", {}))
        claim = client.claim("w1", 5_000_000)
        assert claim is not None
        # Received, not yet acknowledged: the reader sees the message held.
        client.close()
        # Its process gone: kombu's close puts back what the channel did not acknowledge.
        found[system] = read_celery_store(store).jobs["a"]
        client = open_celery(store, system)
        try:
            assert client.succeed(claim) is Verdict.STALE
            view = client.job("a")
            assert view is not None
            found[f"{system} view"] = (view.native_state, view.attempts)
            assert client.recover() == 0
        finally:
            client.close()
    # "won't be redelivered [...] if the worker instance is abruptly killed": acknowledged
    # at its start, the task stays started; acknowledged late, it is back in its queue.
    assert found["celery"] == ("started", 1)
    assert found["celery view"] == ("started", 1)
    assert found["celery-acks-late"] == ("queued", 0)
    assert found["celery-acks-late view"] == ("queued", 0)


def test_the_reader_reports_what_the_lab_did_not_send_and_a_retry_that_never_arrived(
    tmp_path: Path, redis_socket: str
) -> None:
    store = tmp_path / "store"
    open_celery(store).close()
    queue = queue_name(store)
    assert queue is not None
    foreign = {"headers": {"id": "someone-else", "retries": 0}}
    held = [{"headers": {"id": task_id(queue, "held"), "retries": 2}}, "", queue]
    with RespConnection(redis_socket) as connection:
        connection.command("LPUSH", f"{key_prefix(queue)}{queue}", json.dumps(foreign))
        connection.command("HSET", f"{key_prefix(queue)}unacked", "tag", json.dumps(held))
        failure = {"exc_type": "RuntimeError", "exc_message": ["x"], "exc_module": "builtins"}
        meta = {
            "status": "RETRY",
            "result": failure,
            "retries": 0,
            "task_id": task_id(queue, "gone"),
        }
        connection.command("SET", f"celery-task-meta-{task_id(queue, 'gone')}", json.dumps(meta))
    reading = read_celery_store(store)
    assert reading.problems == ("a message of task someone-else, which the lab did not send",)
    # Retried, and its new message in no queue: the retry's publish never reached Redis.
    assert reading.jobs == {"gone": ("retried", 1), "held": ("reserved", 3)}
    client = open_celery(store)
    try:
        view = client.job("gone")
        assert view is not None
        assert (view.native_state, view.status) == ("retried", JobStatus.PENDING)
        held_view = client.job("held")
        assert held_view is not None
        assert (held_view.native_state, held_view.attempts) == ("reserved", 3)
    finally:
        client.close()


def test_without_a_server_the_reader_and_the_adapter_say_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert read_celery_store(store).exists is False
    store.mkdir()
    (store / QUEUE_FILE).write_text('{"queue": "q"}')
    environ = os.environ.pop(SOCKET_VARIABLE, None)
    try:
        assert read_celery_store(store).problems[0].startswith("no Redis server named")
        answer = read_celery_store(store, str(tmp_path / "nothing.sock"))
        assert answer.problems[0].startswith("Redis did not answer")
        with pytest.raises(SystemUnavailable, match="no Redis server"):
            open_celery(tmp_path / "other")
    finally:
        if environ is not None:
            os.environ[SOCKET_VARIABLE] = environ


def test_a_task_runs_only_under_the_lab_and_the_own_worker_needs_a_store(
    tmp_path: Path, redis_socket: str
) -> None:
    own = resolve_system("celery").own_worker
    assert own is not None
    assert own.schedule is not None
    solo = resolve_system("celery-solo").own_worker
    assert solo is not None
    assert "`celery worker --pool solo`" in solo.describe
    with pytest.raises(SystemUnavailable, match="no Celery store"):
        own.serve(tmp_path / "none", "w1", lambda key: None)
    with pytest.raises(SystemUnavailable, match="no Celery store"):
        own.schedule(tmp_path / "none", "k", 0.0)
    # apply_async(eta=...): a message in the queue, which the worker holds until it is due.
    store = tmp_path / "store"
    open_celery(store).close()
    own.schedule(store, "s", 2e9)
    assert read_celery_store(store).jobs == {"s": ("queued", 0)}

    class Request:
        id, retries = "x", 0

    class Task:
        app, request = object(), Request()

    with pytest.raises(JobFailed, match="runs only under crashqueuelab"):
        lab_task(Task(), "k", "t", {}, 1)


def _lost(stored: str, last_end: str) -> Anomaly:
    return Anomaly(
        Kind.LOST_IN_DEPLOY,
        f"job job-01: lost: 1 execution(s), none ran to completion (the last: {last_end}),"
        f" and the store holds it {stored}",
        job="job-01",
        facts={"executions": 1, "stored": stored, "last_end": last_end, "signal": "SIGTERM"},
    )


@pytest.mark.parametrize(
    ("system", "documented", "broken"),
    [
        # Acknowledged as it started and cut by the SIGKILL; prefetched and never acknowledged.
        (
            "celery",
            [("started", "killed"), ("reserved", "never ran")],
            [("nowhere", "never ran"), ("queued", "never ran"), ("started", "abandoned")],
        ),
        # Late acknowledgement: whatever was held waits for the visibility timeout.
        (
            "celery-acks-late",
            [("started", "killed"), ("reserved", "never ran")],
            [("nowhere", "never ran"), ("queued", "never ran")],
        ),
    ],
)
def test_a_deploys_loss_is_documented_only_as_celery_states_it(
    system: str, documented: list[tuple[str, str]], broken: list[tuple[str, str]]
) -> None:
    findings = [_lost(*case) for case in documented + broken]
    verdict = classify(resolve_system(system), "deploys", findings)
    # A task Redis holds nowhere (kombu #1733's loss) is never a documented one.
    assert verdict["broken_promises"] == [_lost(*case).text for case in broken]
    explained = sum(entry["lines"] for entry in verdict["weaker_as_documented"])
    assert explained == len(documented)


def _ran_twice(worker_then: str) -> Anomaly:
    return Anomaly(
        Kind.RAN_TWICE,
        f"job job-01: ran again after an execution that ran to completion: by w0.0 from 1.00 s"
        f" to 2.00 s (ended) (its worker then {worker_then}, acknowledged: unknown), then by"
        " w0.1 from 5.00 s to 6.00 s (ended)",
        job="job-01",
        facts={"times": 2, "worker_then": worker_then, "acknowledged": "unknown"},
    )


def test_a_finished_task_run_again_is_documented_only_while_its_worker_did_not_exit() -> None:
    """With late acknowledgement a task "will be redelivered [...] in the event of [...] the
    worker instance being killed mid-execution", and one not acknowledged within the
    visibility timeout while its worker runs on is redelivered; a worker that exited by
    itself after a warm shutdown finished its task and acknowledges it, so a second run is a
    broken promise (Celery #5663, the gevent pool's lost acknowledgement)."""
    findings = [_ran_twice("sigkilled"), _ran_twice("exited"), _ran_twice("alive")]
    verdict = classify(resolve_system("celery-acks-late"), "deploys", findings)
    assert verdict["broken_promises"] == [_ran_twice("exited").text]
    explained = {entry["first"]: entry["source"] for entry in verdict["weaker_as_documented"]}
    # The killed worker's: late acknowledgement; the live worker's: the visibility timeout.
    assert explained == {
        _ran_twice("sigkilled").text: GLOSSARY,
        _ran_twice("alive").text: VISIBILITY,
    }


def test_a_task_run_again_across_a_crash_of_the_rabbitmq_node_is_documented_with_late_ack() -> None:
    """With late acknowledgement on RabbitMQ, a task under way when its broker went away
    "is being executed twice per connection loss" (Celery's configuration reference); the
    same finding at the defaults, or one not across a restart, is no such thing."""
    from crashqueuelab.systems.libraries.celery.promises import CONNECTION_LOSS

    def again(across: bool) -> Anomaly:
        base = _ran_twice("exited")
        facts = {**base.facts, "across_server_restart": across}
        return Anomaly(base.kind, f"{base.text} ({across})", base.job, facts=facts)

    late = classify(resolve_system("celery-rabbitmq-acks-late"), "deploys", [again(True)])
    assert late["broken_promises"] == []
    assert [entry["source"] for entry in late["weaker_as_documented"]] == [CONNECTION_LOSS]
    not_across = classify(resolve_system("celery-rabbitmq-acks-late"), "deploys", [again(False)])
    assert not_across["broken_promises"] == [again(False).text]
    early = classify(resolve_system("celery-rabbitmq"), "deploys", [again(True)])
    assert early["broken_promises"] == [again(True).text]


def test_the_gevent_system_needs_gevent_which_its_pinned_releases_install_beside_them() -> None:
    from importlib.util import find_spec

    from crashqueuelab.systems.registry import companions_of

    # What Celery's own gevent extra requires, beside that system's releases alone.
    assert companions_of("celery-gevent-acks-late", "5.4.0") == ("gevent>=1.5.0",)
    assert companions_of("celery-acks-late", "5.4.0") == ()
    if find_spec("gevent") is None:
        with pytest.raises(SystemUnavailable, match="gevent is not installed"):
            resolve_system("celery-gevent-acks-late")
    else:
        own = resolve_system("celery-gevent-acks-late").own_worker
        assert own is not None
        assert "`celery worker --pool gevent`" in own.describe
