"""litequeue from the package index under the lab through ``examples/litequeue_adapter.py``,
at the release the ``dev`` extra pins (0.9): every crash point passes, what the probes and
chaos find beyond the contract is the weakness litequeue documents (no lease, no fencing),
and the one broken promise is its own: ``retry`` ("Mark a locked message as free again")
makes a finished message ready, so a stale failure report runs a succeeded job again.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import litequeue
import pytest

from crashqueuelab import cli
from crashqueuelab.core.clock import ManualClock
from crashqueuelab.suite.harness import open_client
from crashqueuelab.systems import JobSpec, JobStatus, QueueClient, System, Verdict
from tests.conftest import EXAMPLES, SHRINK_BUDGET_S, RunCli

# Imported from examples/ without leaving it on the path of the whole session: a test that
# runs the adapter in the lab's children puts it there itself.
sys.path.insert(0, str(EXAMPLES))
try:
    from litequeue_adapter import FILE, QUEUE_NAME, litequeue_system, read_store
finally:
    sys.path.remove(str(EXAMPLES))

SPEC = "litequeue_adapter:litequeue_system"
RETRY_BUG = "model workload: job model-*: claimed by worker-* after an accepted acknowledgement"


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The crash children and chaos workers import the adapter by its spec.
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.fixture
def system() -> System:
    assert litequeue.__version__ == "0.9", "the verdicts below are litequeue 0.9's"
    return litequeue_system()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000_000)


@pytest.fixture
def client(system: System, tmp_path: Path, clock: ManualClock) -> Iterator[QueueClient]:
    opened = open_client(system, tmp_path / "store", clock)
    try:
        yield opened
    finally:
        opened.close()


def job(key: str, max_attempts: int = 2) -> JobSpec:
    return JobSpec(key, "example", {"n": 1}, max_attempts)


def test_the_campaign_passes_every_point_and_names_the_retry_bug(
    tmp_path: Path, run_cli: RunCli, system: System
) -> None:
    outcome = run_cli(
        "campaign", "--system", SPEC, "--seed", "7", "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    summary = outcome.result["summary"]
    assert (summary["passed"], summary["failed"], summary["named_fault_points"]) == (14, 0, 14)
    assert outcome.result["system"]["independent_reader"] is True
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    failed = {probe["name"] for probe in report["probes"] if probe["ok"] is False}
    assert failed == {
        "stale_holder_after_expiry",
        "acknowledgement_at_the_deadline",
        "batched_acknowledgement_fences_each_item",
    }
    promises = report["promises"]
    assert promises["keeps_its_promises"] is False
    assert promises["verdict"].startswith("litequeue 0.9 (SQLite ")
    assert "breaks its own promise: model workload: job model-" in promises["verdict"]
    broken = promises["broken_promises"]
    assert broken, "the model workload runs a succeeded job again"
    assert all(" after an accepted acknowledgement (at " in line for line in broken), broken
    (weakness,) = promises["weaker_as_documented"]
    assert weakness["what"].startswith("No lease and no fencing")
    assert weakness["first"].startswith("probe stale_holder_after_expiry: ")
    assert weakness["lines"] + len(broken) == len(report["anomalies"])


def test_the_documented_command_s_relative_output_directory_gives_the_same_verdict(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/systems.md runs the example with --output-directory runs/litequeue: its reader
    # made a URI of a relative path, raised, and every crash point failed.
    monkeypatch.chdir(tmp_path)
    outcome = run_cli(
        "campaign", "--system", SPEC, "--seed", "7", "--crash-point", "prune:after",
        "--crash-point", "done:after", "--probe", "idempotent_submit", "--shrink-seconds", "0",
        "--output-directory", "runs/litequeue",
    )  # fmt: skip
    report = json.loads((tmp_path / "runs" / "litequeue" / "campaign.json").read_text())
    assert not any("the reader raised" in line for line in report["anomalies"]), report["anomalies"]
    assert [case["passed"] for case in report["cases"]] == [True, True], outcome.stderr
    assert outcome.result["promises"]["keeps_its_promises"] is True


def test_the_reader_reads_a_directory_named_relative_to_the_working_directory(
    client: QueueClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.submit(job("a"))
    monkeypatch.chdir(tmp_path)
    reading = read_store(Path("store"))
    assert (reading.ok, sorted(reading.jobs)) == (True, ["a"])


def test_the_model_workload_s_bug_is_shrunk_though_its_first_line_is_a_documented_weakness(
    tmp_path: Path, run_cli: RunCli
) -> None:
    # The workload's first anomaly is a late acknowledgement litequeue documents; the run
    # shrank that one, pinned it as an expected failure, and left the bug without one.
    run_cli(
        "campaign", "--system", SPEC, "--seed", "7", "--shrink-seconds", str(SHRINK_BUDGET_S),
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    assert "after an accepted acknowledgement" not in report["model"]["anomalies"][0]
    # The bug first, and every documented weakness after it, pinned as such.
    model, *documented = report["shrink"]["reproducers"]
    assert model["name"] == "model workload"
    assert len(documented) == 3
    assert all(record["documented"] is not None for record in documented)
    assert model["documented"] is None
    assert " after an accepted acknowledgement (at " in model["anomaly"]
    assert model["test_run"]["outcome"] == "failed", model["test_run"]


def test_chaos_keeps_litequeues_promises_and_loses_nothing(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "chaos", "--system", SPEC, "--seed", "7", "--jobs", "300", "--kills", "10",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    accounting = outcome.result["accounting"]
    assert (accounting["submitted"], accounting["succeeded"], accounting["lost"]) == (300, 300, 0)
    assert accounting["judge_ok"] is True
    assert accounting["poison"]["dead_lettered_at_their_limit"] == 4
    promises = json.loads((tmp_path / "c" / "chaos.json").read_text())["promises"]
    assert promises["broken_promises"] == []
    assert promises["keeps_its_promises"] is True
    # Late acknowledgements of paused workers are accepted, as litequeue documents; when no
    # pause landed on a held lease there is nothing to explain and the run is ok.
    explained = sum(entry["lines"] for entry in promises["weaker_as_documented"])
    assert explained == len(outcome.result["anomalies"])
    assert outcome.code == (cli.EXIT_OK if explained == 0 else cli.EXIT_REJECTED)


def test_a_stale_failure_report_runs_a_succeeded_job_again(
    client: QueueClient, clock: ManualClock
) -> None:
    client.submit(job("a", max_attempts=3))
    first = client.claim("worker-a", 5_000_000)
    assert first is not None
    clock.advance(6_000_000)
    assert client.recover() == 1  # litequeue's sweep: locked for more than 5 s
    second = client.claim("worker-b", 5_000_000)
    assert second is not None
    assert second.attempt == 2
    assert client.succeed(second) is Verdict.SUCCEEDED
    # worker-a's late failure report: litequeue's retry() frees the DONE message.
    assert client.fail(first, "late") is Verdict.RETRY
    view = client.job("a")
    assert view is not None
    assert (view.status, view.native_state) == (JobStatus.PENDING, "READY")
    assert client.claim("worker-c", 5_000_000) is not None


def test_one_key_is_one_message_and_attempts_run_out(client: QueueClient) -> None:
    first_id = client.submit(job("a"))
    assert client.submit(job("a")) == first_id
    for attempt in (1, 2):
        claim = client.claim("worker-a", 5_000_000)
        assert claim is not None
        assert (claim.job_id, claim.attempt) == (first_id, attempt)
        verdict = client.fail(claim, "boom")
    assert verdict is Verdict.DEAD
    view = client.job("a")
    assert view is not None
    assert (view.status, view.attempts, view.native_state) == (JobStatus.DEAD, 2, "FAILED")
    assert client.active_count() == 0
    assert client.job("nobody") is None


def test_a_pruned_job_stays_succeeded_and_the_reader_agrees(
    client: QueueClient, tmp_path: Path
) -> None:
    client.submit(job("a"))
    claim = client.claim("worker-a", 5_000_000)
    assert claim is not None
    client.succeed(claim)
    client.checkpoint()
    view = client.job("a")
    assert view is not None
    assert (view.status, view.native_state) == (JobStatus.SUCCEEDED, "pruned")
    reading = read_store(tmp_path / "store")
    assert (reading.ok, reading.checks) == (True, {"integrity_check": True, "invariants": True})
    assert (reading.jobs["a"].native_state, reading.jobs["a"].attempts) == ("pruned", 1)


def test_the_reader_finds_a_message_deleted_behind_litequeues_back(
    client: QueueClient, tmp_path: Path
) -> None:
    client.submit(job("a"))
    client.submit(job("b"))
    client.close()
    with sqlite3.connect(tmp_path / "store" / FILE) as connection:
        # A deletion the trigger cannot tell from a prune: a READY message taken away.
        connection.execute("DROP TRIGGER lab_note_deletion")
        connection.execute(f"DELETE FROM [{QUEUE_NAME}] WHERE data LIKE '%\"a\"%'")
        connection.execute(
            "INSERT INTO lab_keys (key, message_id, max_attempts) VALUES ('c', 'x', 3)"
        )
    connection.close()
    reading = read_store(tmp_path / "store")
    assert reading.ok is False
    assert reading.checks == {"integrity_check": True, "invariants": False}
    assert set(reading.jobs) == {"b"}
    lost_a, lost_c = reading.problems
    assert lost_a.startswith("job a: its message ")
    assert lost_a.endswith(" is gone (lost)")
    assert lost_c == "job c: its message x is gone (lost)"


def test_an_empty_directory_reads_as_no_store(tmp_path: Path) -> None:
    reading = read_store(tmp_path)
    assert (reading.exists, reading.ok, dict(reading.jobs)) == (False, True, {})
    assert reading.checks == {"integrity_check": True, "invariants": True}


def test_a_store_killed_while_it_was_created_reads_as_empty(tmp_path: Path) -> None:
    litequeue.LiteQueue(str(tmp_path / FILE), queue_name=QUEUE_NAME).close()
    reading = read_store(tmp_path)
    assert (reading.exists, reading.ok, dict(reading.jobs)) == (True, True, {})


@pytest.mark.releases
def test_0_8_breaks_its_promise_at_prune_and_0_9_keeps_it_pinned_as_a_shipped_library_is(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "versions", "--system", "litequeue_adapter:litequeue_system", "--releases", "0.8,0.9",
        "--bisect", "--bisect-on", "promises", "--output-directory", str(tmp_path / "v"),
        "campaign", "--seed", "7", "--crash-point", "prune:after", "--probe", "idempotent_submit",
        "--shrink-seconds", "0",
    )  # fmt: skip
    assert outcome.code == 1, outcome.stderr
    assert outcome.result["headline"] == (
        "litequeue 0.8 breaks its own promises; 0.9 is the first release that keeps its own"
        " promises"
    )
    assert outcome.result["bisection"]["found"] == "0.9"
    old = json.loads((tmp_path / "v" / "0.8" / "campaign.json").read_text())
    assert "no such table: Queue" in old["anomalies"][0]
    assert old["system"]["version"].startswith("litequeue 0.8")
    # The page names the library, and its command runs the adapter again, where it was.
    page = (tmp_path / "v" / "report.html").read_text()
    assert "<b>litequeue</b> (litequeue_adapter:litequeue_system)" in page
    assert f"PYTHONPATH={EXAMPLES} crashqueuelab versions --system litequeue_adapter:" in page
    assert "seed 7" in page
