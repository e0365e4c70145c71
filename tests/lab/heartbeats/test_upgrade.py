"""An upgrade in the heartbeat experiment (``versions --upgrade-from``, ``heartbeats
--after-run``): a run on the store a run before it left. What each run's jobs are, what the
first run left and whose it is at the end, a run the first did not exercise, bad input
refused in one line; dramatiq #442 reproduced on its releases: a store left by 1.10.0 under a
pause then a stop holds an id whose message is gone, which 1.12.0 puts back on its queue and
hands out as an empty message, and 1.12.1 drops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import Kind
from crashqueuelab.lab.heartbeats import run as heartbeat_run
from crashqueuelab.lab.heartbeats.upgrade import (
    NOT_EXERCISED,
    THIS_RUN,
    Before,
    accounted,
    leftovers,
    library_logs,
    load_before,
    next_keys,
    not_exercised,
    subject_of,
    take_over,
)
from crashqueuelab.lab.pages.render import write_report
from crashqueuelab.lab.runs.servers import KEPT_REDIS_VARIABLE
from crashqueuelab.lab.versions.matrix import cell, upgrade_directory
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import RunCli

GONE = "message m1: in a worker's acks set, its message gone"


def before_run(tmp_path: Path, system: str = "dramatiq", jobs: int = 3) -> Path:
    """A heartbeat run's directory as the first run leaves it: its record and its store."""
    directory = tmp_path / "1.10.0-before-1.12.0"
    (directory / "store").mkdir(parents=True)
    record = {
        "ok": False,
        "spec": "dramatiq==1.10.0",
        "system": {"name": system, "version": "dramatiq 1.10.0 (its Redis broker)"},
        "jobs": {f"job-{index:02d}": {"runs": 1} for index in range(jobs)},
        "anomalies": ["job job-00: run again"],
    }
    (directory / "heartbeats.json").write_text(json.dumps(record))
    (directory / "store" / "dramatiq-queue.json").write_text('{"queue": "lab-q"}')
    (directory / "store" / "worker-0.dramatiq.log").write_text("ERROR its own\n")
    return directory


def test_what_a_readers_problem_is_about() -> None:
    assert subject_of(GONE) == ("message m1", None)
    assert subject_of("job job-01: a message in no queue") == ("job job-01", "job-01")
    assert subject_of("no Redis server named") == ("no Redis server named", None)


def test_the_second_run_takes_the_stores_names_not_its_logs_and_numbers_its_jobs_after(
    tmp_path: Path,
) -> None:
    before = load_before(before_run(tmp_path), resolve_system("dramatiq"))
    assert before.keys == ("job-00", "job-01", "job-02")
    store = tmp_path / "after" / "store"
    store.mkdir(parents=True)
    assert take_over(before, store) == ["dramatiq-queue.json"]
    assert next_keys(before, 2) == ["job-03", "job-04"]
    # A run after a run that came after another: numbered after the last of the chain.
    chained = Before(tmp_path, {}, ("job-09", "job-10"))
    assert next_keys(chained, 1) == ["job-11"]


def test_what_the_first_run_left_stays_its_own_and_what_the_second_made_is_its(
    tmp_path: Path,
) -> None:
    before = Before(tmp_path, {"spec": "dramatiq==1.10.0", "system": {}}, ("job-00",))
    at_end = [
        # The id the first run left, moved from an acks set to the queue.
        "message m1: in the queue, its message gone",
        "job job-00: a message in no queue and fetched by no worker",
        "message m9: in the queue 2 times",
    ]
    accounting = accounted(before, [GONE], at_end)
    assert accounting["exercised"] is True
    assert accounting["at_end"] == {
        "the first run's": at_end[:2],
        "this run's": at_end[2:],
    }
    found = leftovers(before, accounting)
    assert [anomaly.kind for anomaly in found] == [Kind.STORE_INCONSISTENT] * 3
    assert found[0].text == (
        "message m1: in the queue, its message gone: left by the run before"
        " (dramatiq==1.10.0), still there after this release's workers and its own recovery"
    )
    assert dict(found[0].facts) == {"problem": at_end[0], "left_by": "dramatiq==1.10.0"}
    assert found[2].facts["left_by"] == THIS_RUN
    assert "made in this run" in found[2].text
    # A first run that left nothing did not make the fault: nothing is judged of it.
    assert accounted(before, [], [])["exercised"] is False
    error = not_exercised(before)
    assert error["type"] == NOT_EXERCISED
    row = cell("1.12.1", {"ok": False, "error": error, "anomalies": []}, "promises")
    assert row["not_judged"] is not None
    assert row["passes"] is False


def test_a_workers_library_log_is_counted_and_its_first_lines_kept(tmp_path: Path) -> None:
    (tmp_path / "worker-1.dramatiq.log").write_text(
        "WARNING a\nWARNING a\n\nERROR b\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in run\nAttributeError: c\n'
    )
    assert library_logs(tmp_path) == {
        "worker-1.dramatiq.log": {
            "lines": 7,
            "first": ["WARNING a", "ERROR b", "AttributeError: c"],
        }
    }
    assert library_logs(tmp_path / "nothing") == {}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("no record", "no heartbeat run's record"),
        ("not a record", "not a heartbeat run's record"),
        ("another system", "is a run of 'rq'"),
        ("no store", "the run kept no store directory"),
    ],
)
def test_a_run_before_that_is_not_one_is_refused_in_one_line(
    tmp_path: Path, change: str, said: str
) -> None:
    directory = before_run(tmp_path, system="rq" if change == "another system" else "dramatiq")
    if change == "no record":
        (directory / "heartbeats.json").unlink()
    elif change == "not a record":
        (directory / "heartbeats.json").write_text("[]")
    elif change == "no store":
        for path in (directory / "store").iterdir():
            path.unlink()
        (directory / "store").rmdir()
    with pytest.raises(InvalidInput, match=said) as raised:
        load_before(directory, resolve_system("dramatiq"))
    assert raised.value.field == "after"


def test_a_system_without_a_server_has_no_store_to_go_on_from(tmp_path: Path) -> None:
    directory = before_run(tmp_path, system="walqueue")
    with pytest.raises(InvalidInput, match="keeps no store on a server"):
        load_before(directory, resolve_system("walqueue"))
    directory = before_run(tmp_path / "rq", system="rq")
    with pytest.raises(InvalidInput, match="built for dramatiq alone"):
        load_before(directory, resolve_system("rq"))


def test_the_phases_of_an_upgrade_are_kept_side_by_side() -> None:
    assert upgrade_directory(Path("m") / "1.12.0", "1.10.0") == Path("m") / "1.10.0-before-1.12.0"


@pytest.mark.parametrize(
    ("options", "evidence", "said"),
    [
        (["--upgrade-from", "1.10.0"], ["campaign"], "campaign starts each run on a store"),
        (["--upgrade-from", "latest"], ["heartbeats"], "'latest' is not a release number"),
        (
            ["--upgrade-from", "1.10.0"],
            ["heartbeats", "--after-run", "x"],
            "the upgrade names the run before itself",
        ),
        (
            ["--upgrade-from", "5.3.1", "--vary", "kombu"],
            ["heartbeats"],
            "not with --vary",
        ),
    ],
)
def test_an_upgrade_that_makes_no_sense_is_refused_before_anything_runs(
    tmp_path: Path, run_cli: RunCli, options: list[str], evidence: list[str], said: str
) -> None:
    system = "celery==5.3.1" if "--vary" in options else "dramatiq"
    outcome = run_cli(
        "versions", "--system", system, "--releases", "1.12.0,1.12.1", *options,
        "--output-directory", str(tmp_path / "m"), *evidence,
    )  # fmt: skip
    assert outcome.code == 2, outcome.stderr
    assert outcome.result["error"]["type"] == "InvalidInput"
    assert said in outcome.result["error"]["message"]
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("system", "releases", "said"),
    [
        ("huey", "3.1.0,3.2.0", "only a system on a Redis server has"),
        ("rq", "1.16.2,2.0.0", "an upgrade is built for dramatiq alone"),
    ],
)
def test_an_upgrade_of_a_library_it_is_not_built_for_is_refused(
    tmp_path: Path, run_cli: RunCli, system: str, releases: str, said: str
) -> None:
    outcome = run_cli(
        "versions", "--system", system, "--releases", releases, "--upgrade-from", "1.0.0",
        "--output-directory", str(tmp_path / "m"), "heartbeats",
    )  # fmt: skip
    assert outcome.code == 2, outcome.stderr
    assert outcome.result["error"]["field"] == "upgrade-from"
    assert said in outcome.result["error"]["message"]


def test_a_run_after_one_that_left_nothing_is_not_exercised_and_its_page_says_so(
    tmp_path: Path, redis_socket: str, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed release under a pause then a stop leaves no id whose message is gone:
    a run after it on the same server and queue is not exercised, judged neither way; its
    jobs are numbered after the first run's, and the first run's are not judged again."""
    pytest.importorskip("dramatiq")
    monkeypatch.setenv(KEPT_REDIS_VARIABLE, redis_socket)
    monkeypatch.setattr(heartbeat_run, "RECOVERY_MARGIN_S", -4.5)  # recovery_s is 5 s
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--jobs", "2", "--workers", "2", "--retry-timer-s", "0.5", "--pauses-then-stops", "1"]
    run_cli("heartbeats", "--system", "dramatiq", *common, "--output-directory", str(first))
    outcome = run_cli(
        "heartbeats", "--system", "dramatiq", *common, "--after-run", str(first),
        "--output-directory", str(second),
    )  # fmt: skip
    assert outcome.code == 1, outcome.stderr
    record: dict[str, Any] = json.loads((second / "heartbeats.json").read_text())
    assert record["error"]["type"] == NOT_EXERCISED
    assert record["promises"] is None
    assert sorted(record["jobs"]) == ["job-02", "job-03"]
    assert record["upgrade"]["from"]["directory"] == "first"
    assert record["upgrade"]["left"] == []
    assert outcome.result["upgrade"]["exercised"] is False
    # Same queue: the second run's store is named by the first's.
    queue = json.loads((first / "store" / "dramatiq-queue.json").read_text())
    assert json.loads((second / "store" / "dramatiq-queue.json").read_text()) == queue
    page = (second / "report.html").read_text()
    assert "An upgrade: after the run of dramatiq" in page
    assert "nothing, so the upgrade&#39;s fault was not made" in page or (
        "nothing, so the upgrade's fault was not made" in page
    )
    assert f"--after-run {first}" in page
    # Had the first run left an id whose message is gone, the page names it.
    record["upgrade"] |= {
        "left": [GONE],
        "at_end": {"the first run's": [GONE], "this run's": []},
    }
    record["library_logs"] = {"worker-0.dramatiq.log": {"lines": 1, "first": ["WARNING x"]}}
    (second / "heartbeats.json").write_text(json.dumps(record))
    write_report(second)
    page = (second / "report.html").read_text()
    assert GONE.replace("'", "&#39;") in page or GONE in page
    assert "What the library logged" in page


def test_a_second_run_names_a_run_before_that_is_not_there(tmp_path: Path, run_cli: RunCli) -> None:
    pytest.importorskip("dramatiq")
    outcome = run_cli(
        "heartbeats", "--system", "dramatiq", "--after-run", str(tmp_path / "none"),
        "--output-directory", str(tmp_path / "h"),
    )  # fmt: skip
    assert outcome.code == 2, outcome.stderr
    assert "no heartbeat run's record" in outcome.result["error"]["message"]


#: The warning dramatiq's consumer logs for an id whose message is gone (dramatiq #442).
NONE_MESSAGE = "Found 'None' message in message cache"
#: A first run that left nothing is run again, this often at most (it made the fault in every
#: run measured; real-queues.md gives the count).
#: How many times the pair may run for one clean reproduction: in a whole test-command run
#: (its quiet tests three at once) the third of three was the first clean one (testing-journal.md).
ATTEMPTS = 5


def upgrade_pair(directory: Path, run_cli: RunCli) -> Any:
    return run_cli(
        "versions", "--system", "dramatiq", "--releases", "1.12.0,1.12.1",
        "--upgrade-from", "1.10.0", "--bisect-on", "promises",
        "--output-directory", str(directory),
        "heartbeats", "--workers", "3", "--jobs", "9", "--work-timers", "2",
        "--pauses-then-stops", "1", "--retry-timer-s", "1",
    )  # fmt: skip


@pytest.mark.releases
@pytest.mark.quiet
@pytest.mark.early
def test_dramatiq_1_12_0_puts_back_an_id_whose_message_1_10_0_deleted_and_1_12_1_drops_it(
    tmp_path: Path, release_cache: Path, run_cli: RunCli
) -> None:
    """dramatiq #442: on 1.10.0, a worker frozen past its heartbeat timeout, then stopped,
    acknowledges the message it ran after the others' maintenance put its id back (#266's
    path): the message is deleted, its id stays, and a consumer that fetches it is handed
    nothing and keeps it in its acks set. Upgraded on that store, 1.12.0's maintenance puts
    the dead worker's id back on the queue, a worker is handed the empty message and logs the
    warning of #442, and the id is still there after the release's own recovery; 1.12.1's
    puts back only ids whose message exists, and the id is gone."""
    fixed_broke: list[Any] = []

    def record(name: str) -> dict[str, Any]:
        kept: dict[str, Any] = json.loads((directory / name / "heartbeats.json").read_text())
        return kept

    # A run whose first half made no fault, or whose own error stopped it before it judged
    # a release's promises, is not judged. A run where either release broke a promise other
    # than #442's leftover (1.12.1 once, 1.12.0 once, in whole test-command runs under their
    # load; likely the race testing-journal.md names, not established) is no clean reproduction:
    # what it broke is kept for the failure message, and the pair runs again.
    for attempt in range(ATTEMPTS):
        directory = tmp_path / f"m{attempt}"
        outcome = upgrade_pair(directory, run_cli)
        unjudged = [row["not_judged"] for row in outcome.result["rows"] if row["not_judged"]]
        if unjudged:
            fixed_broke.append(unjudged)
            continue
        other = [
            line
            for name in ("1.12.0", "1.12.1")
            for line in record(name)["promises"]["broken_promises"]
            if name == "1.12.1" or "left by the run before (dramatiq==1.10.0)" not in line
        ]
        if not other:
            break
        fixed_broke.append(other)
    assert len(fixed_broke) < ATTEMPTS, f"no clean run of {ATTEMPTS}: {fixed_broke}"

    assert outcome.code == 1, outcome.stderr
    assert outcome.result["headline"] == (
        "dramatiq 1.12.0 breaks its own promises; 1.12.1 keeps its own promises"
    )
    old, fixed = record("1.12.0"), record("1.12.1")
    for release, each in (("1.12.0", old), ("1.12.1", fixed)):
        first = record(f"1.10.0-before-{release}")
        assert first["spec"] == "dramatiq==1.10.0"
        # The first run made the fault: an id whose message is gone, in a stopped worker's
        # acks set (its consumer was handed nothing: #266's AttributeError).
        upgrade = each["upgrade"]
        assert upgrade["from"]["directory"] == f"1.10.0-before-{release}"
        assert upgrade["left"], upgrade
        assert all("its message gone" in problem for problem in upgrade["left"])
        # The second run's jobs are its own, numbered after the first's, and each ended
        # done: neither release's worker was stuck on the empty message.
        assert sorted(each["jobs"]) == [f"job-{index:02d}" for index in range(9, 18)]
        assert all(job["stored"] == "succeeded" for job in each["jobs"].values())
    # 1.12.0 keeps the id for ever, and a worker was handed its empty message.
    assert old["promises"]["keeps_its_promises"] is False
    assert old["upgrade"]["at_end"]["the first run's"]
    assert all(
        "left by the run before (dramatiq==1.10.0), still there after" in line
        for line in old["promises"]["broken_promises"]
    )
    logged = [line for log in old["library_logs"].values() for line in log["first"]]
    assert any(NONE_MESSAGE in line for line in logged), old["library_logs"]
    # 1.12.1 drops it: nothing is left, nothing was handed out empty.
    assert fixed["promises"]["keeps_its_promises"] is True
    assert fixed["upgrade"]["at_end"] == {"the first run's": [], "this run's": []}
    assert not any(
        NONE_MESSAGE in line for log in fixed["library_logs"].values() for line in log["first"]
    )


def test_each_release_runs_after_the_release_upgraded_from_on_one_server_kept_for_both(
    tmp_path: Path, redis_socket: str, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The matrix starts one Redis server per release under test and names it to both of
    its runs; the second is told the first's directory. A first run that kept no record
    leaves the release with an error of its own, and nothing run after it."""
    from crashqueuelab.cli import versions

    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def run_pinned(
        pin: Any, argv: list[str], err: Any, prefix: str = "", extra: Any = None
    ) -> tuple[int, dict[str, Any]]:
        calls.append((pin.version, list(argv), dict(extra or {})))
        directory = Path(argv[argv.index("--output-directory") + 1])
        if pin.version == "1.10.0" and "1.12.1" in directory.name:
            return 2, {"ok": False, "error": {"type": "Refused", "message": "no store"}}
        directory.mkdir(parents=True)
        record = {"ok": True, "anomalies": [], "promises": {"keeps_its_promises": True}}
        if pin.version != "1.10.0":
            record["upgrade"] = {"from": {"directory": f"1.10.0-before-{directory.name}"}}
        (directory / "heartbeats.json").write_text(json.dumps(record))
        return 0, record

    monkeypatch.setattr(versions, "run_pinned", run_pinned)
    directory = tmp_path / "m"
    outcome = run_cli(
        "versions", "--system", "dramatiq", "--releases", "1.12.0,1.12.1",
        "--upgrade-from", "1.10.0", "--output-directory", str(directory), "heartbeats",
    )  # fmt: skip
    assert [(version, argv.count("--after-run")) for version, argv, _ in calls] == [
        ("1.10.0", 0),
        ("1.12.0", 1),
        ("1.10.0", 0),
    ]
    first, second = calls[0][1], calls[1][1]
    assert first[first.index("--output-directory") + 1] == str(directory / "1.10.0-before-1.12.0")
    assert second[second.index("--after-run") + 1] == str(directory / "1.10.0-before-1.12.0")
    # One server per release under test, the same for both of its runs.
    sockets = [environment[KEPT_REDIS_VARIABLE] for _, _, environment in calls]
    assert sockets[0] == sockets[1] != sockets[2]
    rows = {row["release"]: row for row in outcome.result["rows"]}
    assert rows["1.12.0"]["passes"] is True
    assert rows["1.12.1"]["first_reason"] == (
        "UpgradeFromFailed: the run of 1.10.0 kept no record: no store"
    )
    assert outcome.code == 1
    report = json.loads((directory / "versions.json").read_text())
    assert report["upgrade_from"] == "1.10.0"
    assert [row["after"] for row in report["rows"]] == ["1.10.0-before-1.12.0", None]
    page = (directory / "report.html").read_text()
    assert "--upgrade-from 1.10.0" in page
    assert 'href="1.10.0-before-1.12.0/report.html"' in page
