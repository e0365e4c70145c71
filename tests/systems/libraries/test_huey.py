"""huey's SqliteHuey under the lab, at the installed release: crash points, the independent
reader, and the verdict against huey's own promises.

huey comes with the ``peers`` extra, which the gates install: these tests run.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.readers.huey import Recorded, read_huey_file, unpickle
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.systems import (
    Claim,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    QueueClient,
    Verdict,
    resolve_system,
)
from tests.conftest import RunCli


def open_huey(directory: Path, name: str = "huey") -> QueueClient:
    request = OpenRequest(
        directory, clock=ManualClock(0), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    return resolve_system(name).open(request)


def test_every_crash_point_passes_and_what_fails_is_what_huey_documents(tmp_path: Path) -> None:
    report = run_campaign(tmp_path / "c", seed=5, system="huey")
    summary = report["summary"]
    assert (summary["passed"], summary["failed"]) == (10, 0)
    assert report["system"]["version"].startswith("huey ")
    # The lab's contract is broken (no leases, no acknowledgement) ...
    assert report["ok"] is False
    failed = {probe["name"] for probe in report["probes"] if probe["status"] == "failed"}
    assert failed == {
        "stale_holder_after_expiry",
        "acknowledgement_at_the_deadline",
        "expired_attempts_run_out",
        "batched_acknowledgement_fences_each_item",
    }
    # ... and every failure is one that huey's documentation states.
    promises = report["promises"]
    assert promises["keeps_its_promises"] is True
    assert promises["broken_promises"] == []
    weaker = promises["weaker_as_documented"]
    explained = {entry["what"].split(":")[0]: entry["lines"] for entry in weaker}
    assert set(explained) == {"no acknowledgement", "no leases"}
    assert sum(explained.values()) == len(report["anomalies"])
    assert "keeps its promises; weaker than the lab's contract" in promises["verdict"]


def claimed(client: QueueClient) -> Claim:
    claim = client.claim("w", 1)
    assert claim is not None
    return claim


def test_the_reader_sees_in_the_file_what_huey_says_of_each_job(tmp_path: Path) -> None:
    client = open_huey(tmp_path, "huey-fsync")
    try:
        for key in ("a", "b", "c"):
            client.submit(JobSpec(key, "t", {"n": key}, max_attempts=2))
        assert client.submit(JobSpec("a", "t", {"n": "a"}, max_attempts=2)) == "a"
        assert client.active_count() == 3
        first = claimed(client)
        assert (first.key, first.attempt) == ("a", 1)
        assert client.job("a") == JobView("a", JobStatus.LEASED, 1, "dequeued")
        assert client.succeed(first) is Verdict.SUCCEEDED
        assert client.fail(claimed(client), "boom") is Verdict.RETRY
        assert client.job("b") == JobView("b", JobStatus.PENDING, 1, "queued")
        lost = claimed(client)  # c: dequeued, then never executed
        again = claimed(client)
        assert (lost.key, again.key, again.attempt) == ("c", "b", 2)
        assert client.fail(again, "boom") is Verdict.DEAD
        views = {key: client.job(key) for key in ("a", "b", "c")}
        assert client.active_count() == 0
        assert client.job("never") is None
    finally:
        client.close()
    reading = read_huey_file(tmp_path)
    assert reading.problems == []
    # The dequeued task that was never executed: huey's file holds nothing of it.
    assert reading.jobs == {"a": ("done", 1), "b": ("error", 2)}
    assert views == {
        "a": JobView("a", JobStatus.SUCCEEDED, 1, "done"),
        "b": JobView("b", JobStatus.DEAD, 2, "error"),
        "c": JobView("c", JobStatus.LEASED, 1, "dequeued"),
    }


class Explosive:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("unpickled code ran",))


def test_the_reader_builds_no_foreign_object_from_what_it_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = unpickle(pickle.dumps(Explosive()))
    assert isinstance(value, Recorded)
    assert value.qualified_name == "builtins.print"
    assert value.args == ("unpickled code ran",)
    assert capsys.readouterr().out == ""


def test_without_huey_installed_the_system_is_unavailable_and_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import PackageNotFoundError

    from crashqueuelab.core.errors import SystemUnavailable
    from crashqueuelab.systems.libraries import skeleton

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(skeleton, "version", missing)
    with pytest.raises(SystemUnavailable, match=r"pip install -e '\.\[peers\]'"):
        resolve_system("huey-fsync")


def test_a_library_s_run_leads_with_its_own_promises_then_the_lab_s_contract(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "huey", "--probe", "acknowledgement_at_the_deadline",
        "--seed", "3", "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    # Not ok against the lab's contract (the exit code says so), but huey documents it.
    assert outcome.code == 1
    assert outcome.result["promises"]["keeps_its_promises"] is True
    assert outcome.result["promises"]["broken_promises"] == 0
    assert outcome.result["headline"].endswith(
        "keeps its promises; weaker than the lab's contract, as documented: no leases: huey"
        " has no deadline, visibility timeout or token, so a late or repeated completion is"
        " accepted like any other, and a repeated failure runs huey's retry again, which"
        " enqueues the task once more"
    )
    last = outcome.stderr.strip().splitlines()[-1]
    assert last.startswith("crashqueuelab: not ok: huey ")
    assert ": keeps its promises; weaker than the lab's contract" in last
    page = (tmp_path / "c" / "report.html").read_text()
    head = page[page.index('id="verdict"') : page.index('id="promises"')]
    assert 'data-promises-kept="true"' in head
    assert '<span class="word">Keeps its promises</span>' in head
    assert "Against the lab's contract: <b>FAILED</b>: every failure below is one the" in head
    assert 'data-ok="false"' in head  # the lab's contract, as the JSON says
