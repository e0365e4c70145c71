"""pgqueuer under the lab on a throwaway PostgreSQL server: its crash points at the installed
release, and the stuck picked job its users reported, reproduced on 0.25.0 and passing on
0.25.1, each release in an environment of its own.

pgqueuer comes with the ``pgqueuer`` extra, which the gates install; the server comes from
Debian's packages, which ``.ci/run`` installs: these tests run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.judges.readers.pgqueuer import read_pgqueuer_store
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.systems import JobSpec, JobStatus, OpenRequest, Verdict, resolve_system
from crashqueuelab.systems.libraries.pgqueuer.client import PgQueuerClient
from tests.conftest import RunCli


def test_every_crash_point_passes_and_what_fails_is_what_pgqueuer_documents(
    tmp_path: Path, postgres_dsn: str
) -> None:
    report = run_campaign(
        tmp_path / "c",
        seed=5,
        system="pgqueuer",
        probes=["stale_holder_after_expiry", "idempotent_submit", "expired_attempts_run_out"],
        # Naming probes runs no model workload: every crash point is named as well.
        crash_points=[point.name for point in resolve_system("pgqueuer").crash_points],
    )
    summary = report["summary"]
    assert (summary["passed"], summary["failed"]) == (10, 0)
    verdicts = {probe["name"]: probe for probe in report["probes"]}
    assert verdicts["idempotent_submit"]["ok"] is True
    # No token: the stale holder's acknowledgement is taken; the heartbeat timeout's
    # hand-outs are not counted as attempts.
    assert "was accepted" in verdicts["stale_holder_after_expiry"]["detail"]
    assert verdicts["expired_attempts_run_out"]["ok"] is False
    promises = report["promises"]
    assert promises["broken_promises"] == []
    assert {entry["what"].split(":")[0] for entry in promises["weaker_as_documented"]} == {
        "no token",
        "attempts counts the retries a handler asks for (retry_job)",
    }


def test_the_reader_finds_each_job_where_pgqueuer_left_it(
    tmp_path: Path, postgres_dsn: str
) -> None:
    report = run_campaign(
        tmp_path / "c",
        seed=5,
        system="pgqueuer",
        crash_points=["dequeue:after", "log_jobs-successful:after"],
        probes=["idempotent_submit"],
    )
    states = {case["fault_point"]: case["crash_state"]["signature"] for case in report["cases"]}
    assert states["dequeue:after"]["effect_job"] == ["picked", 1]
    assert states["log_jobs-successful:after"]["effect_job"] == ["successful", 1]
    assert states["log_jobs-successful:after"]["flaky_job"] == ["queued", 0]
    store = tmp_path / "c" / "cases"
    (recovered,) = [
        read_pgqueuer_store(path / "store") for path in store.iterdir() if "dequeue" in path.name
    ]
    assert recovered.problems == []
    # The effect job was picked twice (by the dead worker, then by the retry timer's
    # hand-out); the flaky job twice too (its failed first attempt queued again by
    # retry_job).
    assert sorted(recovered.jobs.items()) == [
        ("01-dequeue-after/effect", ("successful", 2)),
        ("01-dequeue-after/flaky", ("successful", 2)),
    ]


def test_a_failed_attempt_is_queued_again_in_the_store_by_pgqueuer_s_own_retry(
    tmp_path: Path, postgres_dsn: str
) -> None:
    # pgqueuer 1.x retries in the database (Queries.retry_job, what its
    # DatabaseRetryEntrypointExecutor calls): the job is queued again for any worker, and
    # its attempts counted in the store.
    store = tmp_path / "store"
    request = OpenRequest(store, ManualClock(10**9), SeededIds(1, "t"), RetryPolicy())
    client = resolve_system("pgqueuer").open(request)
    try:
        client.submit(JobSpec("a", "t", {}, max_attempts=3))
        first = client.claim("w1", 5_000_000)
        assert first is not None
        assert client.fail(first, "boom") is Verdict.RETRY
        view = client.job("a")
        assert view is not None
        assert (view.status, view.attempts, view.native_state) == (JobStatus.PENDING, 1, "queued")
        assert read_pgqueuer_store(store).jobs == {"a": ("queued", 1)}
        second = client.claim("w2", 5_000_000)
        assert second is not None
        assert (second.key, second.attempt, second.worker_id) == ("a", 2, "w2")
        assert client.fail(second, "boom") is Verdict.RETRY
        last = client.claim("w1", 5_000_000)
        assert last is not None
        assert last.attempt == 3
        assert client.fail(last, "boom") is Verdict.DEAD
        view = client.job("a")
        assert view is not None
        assert (view.status, view.attempts) == (JobStatus.DEAD, 3)
        assert client.claim("w2", 5_000_000) is None
    finally:
        client.close()
    reading = read_pgqueuer_store(store)
    assert (reading.jobs, reading.problems) == ({"a": ("exception", 3)}, [])


def test_before_1_0_a_failed_attempt_stays_picked_and_its_worker_runs_it_again(
    tmp_path: Path, postgres_dsn: str
) -> None:
    request = OpenRequest(tmp_path / "store", ManualClock(10**9), SeededIds(1, "t"), RetryPolicy())
    client = resolve_system("pgqueuer").open(request)
    assert isinstance(client, PgQueuerClient)
    client.retries_in_store = False  # a release without retry_job retries in the process
    try:
        client.submit(JobSpec("a", "t", {}, max_attempts=2))
        first = client.claim("w1", 5_000_000)
        assert first is not None
        assert client.fail(first, "boom") is Verdict.RETRY
        view = client.job("a")
        assert view is not None
        assert (view.status, view.attempts) == (JobStatus.LEASED, 1)
        again = client.claim("w1", 5_000_000)
        assert again is not None
        assert (again.key, again.attempt) == ("a", 2)
        assert client.fail(again, "boom") is Verdict.DEAD
    finally:
        client.close()


def test_what_pgqueuer_documents_follows_where_the_release_retries() -> None:
    from crashqueuelab.lab.runs.promises import explained_by
    from crashqueuelab.systems.libraries.pgqueuer.promises import documented_for

    rule = "a_failure_waits_its_delay_then_the_dead_letter_takes_it"

    def failed(assertion: str) -> Anomaly:
        """The plugin's finding of the rule's ``assertion``."""
        text = f"contract {rule}: {assertion}"
        facts = {"assertion": assertion}
        return Anomaly(Kind.CONTRACT_RULE_FAILED, text, point=rule, facts=facts)

    still_picked = failed(
        "job a after its first attempt failed: the system reports leased after 1 attempts, not"
        " pending after 1 attempts"
    )
    at_once = failed(
        "w1 claimed job a as attempt 2; nothing may be claimable: the retry's delay has not passed"
    )
    in_process, in_store = documented_for(retries_in_store=False), documented_for(True)
    # Before 1.0 the failed job stays picked, as pgqueuer retried it in the worker; from 1.0
    # that would be a broken promise, and the retry claimable at once is what it documents.
    assert explained_by(in_process, still_picked, "process") is not None
    assert explained_by(in_store, still_picked, "process") is None
    (delay,) = [w for w in in_store if w.what.startswith("a retry's delay runs")]
    assert explained_by(in_store, at_once, "process") == in_store.index(delay)


@pytest.mark.releases
def test_a_worker_killed_mid_job_leaves_it_stuck_on_0_25_0_and_not_on_0_25_1(
    tmp_path: Path, postgres_dsn: str, release_cache: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "versions",
        "--system",
        "pgqueuer",
        "--releases",
        "0.25.0,0.25.1",
        "--bisect",
        "--bisect-on",
        "cases",
        "--output-directory",
        str(tmp_path / "m"),
        "campaign",
        "--dsn",
        postgres_dsn,
        "--crash-point",
        "dequeue:after",
        "--probe",
        "stale_holder_after_expiry",
        "--shrink-seconds",
        "0",
    )
    # 0.25.0 fails: the run is not ok, whatever the bisection found.
    assert outcome.code == 1, outcome.stderr
    assert outcome.result["bisection"]["found"] == "0.25.1"
    assert outcome.result["headline"].startswith("pgqueuer 0.25.0 fails 1 of 1 crash points")
    old, fixed = (
        json.loads((tmp_path / "m" / release / "campaign.json").read_text())
        for release in ("0.25.0", "0.25.1")
    )
    (case,) = old["cases"]
    assert case["recovery"]["final_states"]["effect"] == "picked"  # never taken again
    # Against pgqueuer's own promise (its retry timer hands a stale pick out again): a bug.
    assert old["promises"]["keeps_its_promises"] is False
    assert any(
        "final states {'effect': 'picked'" in line for line in old["promises"]["broken_promises"]
    )
    assert fixed["summary"]["failed"] == 0
    assert fixed["promises"]["keeps_its_promises"] is True


def test_without_pgqueuer_installed_the_system_is_unavailable_and_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import PackageNotFoundError

    from crashqueuelab.core.errors import SystemUnavailable
    from crashqueuelab.systems.libraries import skeleton

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(skeleton, "version", missing)
    with pytest.raises(SystemUnavailable, match=r"pip install -e '\.\[pgqueuer\]'"):
        resolve_system("pgqueuer")


def test_what_pgqueuer_documents_names_the_causes_not_the_words() -> None:
    from crashqueuelab.lab.chaos.verdict import worker_exited
    from crashqueuelab.lab.runs.promises import explained_by
    from crashqueuelab.systems.libraries.pgqueuer.promises import documented_for

    documented = documented_for(retries_in_store=True)

    def what(finding: Anomaly) -> str | None:
        """The start of the weakness that explains ``finding`` (its words to the first
        parenthesis), None for a broken promise."""
        index = explained_by(documented, finding, "process")
        return None if index is None else documented[index].what.split(" (")[0]

    def exited(status: int, error: str) -> Anomaly:
        return worker_exited({"worker_id": "worker-0.1", "exit_code": status, "error": error})

    manager = "a queue manager whose connection to the server breaks"
    assert what(exited(3, "OperationalError: the connection is lost")) == manager
    assert what(exited(3, "ValueError: bad payload")) is None
    assert what(exited(1, "the connection is lost")) is None

    def beyond(**facts: str | int | bool) -> Anomaly:
        text = "job k: handed out as attempt 2 of 1 (at 1 s)"
        return Anomaly(Kind.ATTEMPT_BEYOND_LIMIT, text, job="k", attempt=2, limit=1, facts=facts)

    uncounted = "attempts counts the retries a handler asks for"
    assert what(beyond(past_the_limit_by_unreported_attempts=True)) == uncounted
    assert what(beyond(past_the_limit_by_unreported_attempts=False)) is None

    def poison(behaviour: str, attempts_left: bool) -> Anomaly:
        facts: dict[str, str | bool] = {
            "poison": True,
            "behaviour": behaviour,
            "attempts_left": attempts_left,
        }
        return Anomaly(Kind.UNFINISHED, "job poison-0001 (poison): still queued", facts=facts)

    # A dying job is handed out for ever; a failing one is counted, and only its turn may
    # not have come before the run ended.
    assert what(poison("die", attempts_left=False)) == uncounted
    assert what(poison("fail", attempts_left=True)) == uncounted
    assert what(poison("fail", attempts_left=False)) is None


def test_pgqueuers_own_worker_is_pgq_run_and_a_job_run_twice_after_a_sigkill_is_documented() -> (
    None
):
    """pgqueuer's reliability guide says a worker killed mid-job leaves its job picked and a
    recovered job runs again from the start: a job run again after its worker was SIGKILLed
    is documented; one run again after its worker exited by itself is not, nor is a job
    lost."""
    from crashqueuelab.lab.runs.promises import explained_by
    from crashqueuelab.systems.libraries.pgqueuer.promises import documented_for

    system = resolve_system("pgqueuer")
    assert system.own_worker is not None
    assert "pgq run" in system.own_worker.describe
    assert "no built-in drain timeout" in system.own_worker.shutdown["SIGTERM"]
    documented = documented_for(retries_in_store=True)

    def twice(then: str) -> Anomaly:
        facts: dict[str, str | int | bool] = {
            "times": 2,
            "worker_then": then,
            "acknowledged": "unknown",
        }
        return Anomaly(Kind.RAN_TWICE, f"job a: ran again ({then})", job="a", facts=facts)

    assert explained_by(documented, twice("sigkilled"), "deploys") is not None
    assert explained_by(documented, twice("exited"), "deploys") is None
    lost = Anomaly(Kind.LOST_IN_DEPLOY, "job a: lost", job="a", facts={"stored": "picked"})
    assert explained_by(documented, lost, "deploys") is None
