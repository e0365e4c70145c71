"""The release matrix and its bisection, over a stand-in for the evidence (the real runs are
in test_releases.py and the documented commands)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.versions.matrix import choose_releases, run_versions

RELEASES = ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "2.0"]


def evidence(first_passing: str, ran: list[str]) -> Any:
    def run(release: str, directory: Path) -> dict[str, Any]:
        ran.append(release)
        passed = RELEASES.index(release) >= RELEASES.index(first_passing)
        return {
            "ok": passed,
            "anomalies": [] if passed else [f"lost a job on {release}"],
            "summary": {"failed": 0 if passed else 1, "named_fault_points": 4},
            "system": {"version": f"lib {release}"},
        }

    return run


@pytest.mark.parametrize("first_passing", ["1.1", "1.3", "1.5", "2.0"])
def test_bisection_finds_the_first_passing_release_in_few_runs(
    tmp_path: Path, first_passing: str
) -> None:
    ran: list[str] = []
    report = run_versions(RELEASES, evidence(first_passing, ran), tmp_path, bisect=True)
    assert report["bisection"]["found"] == first_passing
    assert report["bisection"]["change"] == "starts passing"
    assert len(ran) <= 2 + 3  # both ends, then log2 of what lies between
    assert len(set(ran)) == len(ran)
    assert [row["release"] for row in report["rows"]] == sorted(ran, key=RELEASES.index)
    assert set(report["not_run"]) == set(RELEASES) - set(ran)


def test_a_range_that_passes_at_both_ends_has_nothing_to_bisect(tmp_path: Path) -> None:
    report = run_versions(RELEASES, evidence("1.0", []), tmp_path, bisect=True)
    assert report["bisection"]["found"] is None
    assert "passes at both ends" in report["bisection"]["detail"]


def test_the_matrix_runs_every_release_and_keeps_the_first_reason(tmp_path: Path) -> None:
    report = run_versions(RELEASES[:3], evidence("1.2", []), tmp_path, criterion="cases")
    rows = {row["release"]: row for row in report["rows"]}
    assert [rows[r]["passes"] for r in RELEASES[:3]] == [False, False, True]
    assert rows["1.0"]["first_reason"] == "lost a job on 1.0"
    assert rows["1.2"]["report"] == "1.2/report.html"


def test_on_its_own_promises_a_releases_first_reason_is_its_first_broken_promise(
    tmp_path: Path,
) -> None:
    record = {
        "ok": False,
        "anomalies": ["run again while paused (documented)", "an id put back (a bug)"],
        "promises": {"keeps_its_promises": False, "broken_promises": ["an id put back (a bug)"]},
    }
    report = run_versions(["1.0"], lambda release, _: record, tmp_path, criterion="promises")
    (row,) = report["rows"]
    assert row["first_reason"] == "an id put back (a bug)"
    assert row["anomalies"] == 2


def test_a_release_that_never_opened_here_or_whose_server_is_missing_is_not_judged(
    tmp_path: Path,
) -> None:
    records = {
        "3.0.0": {
            "ok": False,
            "anomalies": [
                "case 01-defer-after: ...; recovery raised SystemRaised: the system under test"
                ' (procrastinate) raised from open: SyntaxError: syntax error at or near ":"',
                "probe idempotent_submit: open raised SyntaxError('syntax error')",
            ],
            "promises": {"keeps_its_promises": False},
        },
        "3.1.0": {"ok": False, "error": {"type": "ServerUnavailable", "message": "no initdb"}},
        "3.2.0": {
            "ok": False,
            "anomalies": ["probe idempotent_submit: open raised X", "lost a job"],
            "promises": {"keeps_its_promises": False},
        },
    }
    report = run_versions(list(records), lambda release, _: records[release], tmp_path)
    rows = {row["release"]: row for row in report["rows"]}
    assert rows["3.0.0"]["not_judged"].startswith("it never opened here: every failure")
    assert rows["3.0.0"]["keeps_its_promises"] is None
    assert rows["3.1.0"]["not_judged"] == "ServerUnavailable: no initdb"
    assert rows["3.2.0"]["not_judged"] is None  # it opened somewhere, and lost a job
    assert rows["3.2.0"]["keeps_its_promises"] is False
    assert not any(row["passes"] for row in rows.values())


def test_on_its_own_promises_a_release_whose_run_stopped_on_an_error_is_not_judged(
    tmp_path: Path,
) -> None:
    """A run whose error stopped it before it judged the release's promises records them as
    None: that release neither keeps nor breaks them (never "breaks its own promises")."""
    records = {
        "1.0": {"ok": False, "anomalies": ["run again beside a live worker"], "promises": None,
                "error": {"type": "WorkerFailed", "message": "worker-1 exited 1"}},
        "2.0": {"ok": True, "anomalies": [], "promises": {"keeps_its_promises": True}},
    }  # fmt: skip
    report = run_versions(
        list(records), lambda release, _: records[release], tmp_path, criterion="promises"
    )
    first, second = report["rows"]
    assert first["not_judged"] == ("its promises were not judged: WorkerFailed: worker-1 exited 1")
    assert (first["passes"], first["keeps_its_promises"]) == (False, None)
    assert second["passes"] is True
    assert "breaks" not in report["headline"]
    assert report["headline"].startswith("1.0 could not be judged here")
    # On the criterion ok, the same run is simply not ok.
    ok = run_versions(list(records), lambda release, _: records[release], tmp_path / "ok")
    assert ok["rows"][0]["not_judged"] is None


@pytest.mark.parametrize(
    ("text", "field_reason"),
    [("1.0,latest", "not release numbers"), ("1.0,1.0", "named twice"), ("x..2.0", "'x'")],
)
def test_a_release_list_that_names_no_releases_is_refused(text: str, field_reason: str) -> None:
    with pytest.raises(InvalidInput, match=field_reason):
        choose_releases(text, "huey")


def test_a_list_of_releases_is_taken_oldest_first() -> None:
    assert choose_releases("3.3.0,3.2.1,3.10.0", "huey") == ["3.2.1", "3.3.0", "3.10.0"]


HUEY = ["3.2.0", "3.2.1", "3.3.0"]


def _power_loss_campaign(release: str) -> dict[str, Any]:
    """A stand-in for huey's power-loss campaign at enqueue:after: releases before 3.3.0
    lose every acknowledged enqueue, as huey documents its default; none is ok (probes)."""
    losing = release != "3.3.0"
    states = 35 if losing else 4
    return {
        "ok": False,
        "anomalies": (["case 01-enqueue-after: lose-all: acknowledged work lost"] if losing else [])
        + ["probe stale_holder_after_expiry: the queue offered nothing"],
        "summary": {
            "failed": 1 if losing else 0,
            "named_fault_points": 1,
            "crash_states": states,
            "states_losing_acknowledged_work": states if losing else 0,
        },
        "promises": {"keeps_its_promises": True},
        "system": {"version": f"huey {release} (SqliteHuey)"},
    }


def test_a_bisection_that_finds_the_change_says_what_the_releases_did_and_is_not_ok(
    tmp_path: Path,
) -> None:
    report = run_versions(
        HUEY,
        lambda release, _: _power_loss_campaign(release),
        tmp_path,
        criterion="cases",
        bisect=True,
        system="huey",
    )
    assert report["bisection"]["found"] == "3.3.0"  # the finding, in its own field
    assert (report["ok"], report["passed_what_ran"], report["complete"]) == (False, False, True)
    assert report["headline"] == (
        "huey 3.2.0 and 3.2.1 lose acknowledged work at a power cut (35 of 35 crash states"
        " each); 3.3.0 is the first release that passes every crash case"
    )


def test_a_bisection_that_passes_at_both_ends_passed_only_what_ran(tmp_path: Path) -> None:
    report = run_versions(RELEASES, evidence("1.0", []), tmp_path, bisect=True, system="lib")
    assert (report["ok"], report["passed_what_ran"], report["complete"]) == (False, True, False)
    assert report["headline"] == (
        "lib 1.0 and 2.0 pass; no change between them to find;"
        " 5 releases not run (the bisection did not need them)"
    )


def test_a_matrix_says_each_release_once_whatever_the_criterion(tmp_path: Path) -> None:
    def run(release: str, _: Path) -> dict[str, Any]:
        record: dict[str, Any] = evidence("1.2", [])(release, _)
        return record | {"promises": {"keeps_its_promises": release != "1.1"}}

    ok = run_versions(RELEASES[2:4], evidence("1.0", []), tmp_path, system="lib")
    assert (ok["ok"], ok["headline"]) == (True, "lib 1.2 and 1.3 pass")
    matrix = run_versions(RELEASES[:3], run, tmp_path, criterion="promises")
    assert matrix["headline"] == "1.0 and 1.2 keep their own promises; 1.1 breaks its own promises"
    by_cases = run_versions(RELEASES[:2], run, tmp_path, criterion="cases")
    assert by_cases["headline"] == "1.0 and 1.1 fail 1 of 4 crash points each"
    assert run_versions(RELEASES[:1], run, tmp_path)["headline"] == "1.0 is not ok (1 anomaly)"


def test_a_bisection_says_what_ran_before_and_after_the_change(tmp_path: Path) -> None:
    report = run_versions(RELEASES, evidence("1.3", []), tmp_path, bisect=True, system="lib")
    assert report["headline"] == (
        "lib 1.0, 1.1 and 1.2 are not ok (1 anomaly each); 1.3 is the first release that"
        " passes; after it, 2.0 passes; 2 releases not run (the bisection did not need them)"
    )
    failing = run_versions(RELEASES[:2], evidence("1.0", []), tmp_path, bisect=True)
    assert failing["headline"] == "1.0 and 1.1 pass; no change between them to find"

    def starts_failing(release: str, directory: Path) -> dict[str, Any]:
        return {"ok": True} if release == "1.0" else evidence("2.0", [])(release, directory)

    report = run_versions(RELEASES[:3], starts_failing, tmp_path, bisect=True)
    assert report["bisection"]["change"] == "starts failing"
    assert report["headline"] == (
        "1.0 passes; 1.1 is the first release that is not ok (1 anomaly);"
        " after it, 1.2 is not ok (1 anomaly)"
    )


def test_a_release_not_judged_here_leaves_the_run_incomplete(tmp_path: Path) -> None:
    records = {
        "3.1.0": {"ok": False, "error": {"type": "ServerUnavailable", "message": "no initdb"}},
        "3.2.0": {"ok": True, "anomalies": []},
    }
    report = run_versions(list(records), lambda release, _: records[release], tmp_path)
    assert (report["ok"], report["passed_what_ran"], report["complete"]) == (False, True, False)
    assert report["headline"] == "3.1.0 could not be judged here; 3.2.0 passes"


def test_a_bisections_two_ends_run_side_by_side(tmp_path: Path) -> None:
    # Each end waits at the barrier for the other: run one after the other, the first
    # would break the barrier at its timeout instead.
    together = threading.Barrier(2, timeout=30)
    ran: list[str] = []
    judged = evidence("1.3", ran)

    def run(release: str, directory: Path) -> dict[str, Any]:
        if release in (RELEASES[0], RELEASES[-1]):
            together.wait()
        return judged(release, directory)  # type: ignore[no-any-return]

    report = run_versions(RELEASES, run, tmp_path, bisect=True, at_once=2)
    assert report["bisection"]["found"] == "1.3"
    assert report["at_once"] == 2
    assert set(ran[:2]) == {RELEASES[0], RELEASES[-1]}
    assert len(set(ran)) == len(ran)


def test_a_matrix_side_by_side_keeps_its_releases_order_and_never_runs_more_at_once(
    tmp_path: Path,
) -> None:
    guard = threading.Lock()
    going: list[str] = []
    most = 0
    judged = evidence("1.2", [])

    def run(release: str, directory: Path) -> dict[str, Any]:
        nonlocal most
        with guard:
            going.append(release)
            most = max(most, len(going))
        try:
            return judged(release, directory)  # type: ignore[no-any-return]
        finally:
            with guard:
                going.remove(release)

    report = run_versions(RELEASES, run, tmp_path, at_once=3)
    assert [row["release"] for row in report["rows"]] == RELEASES
    assert [row["passes"] for row in report["rows"]] == [False, False] + [True] * 5
    assert 1 <= most <= 3


def test_an_interrupted_side_by_side_matrix_waits_for_the_runs_going_and_starts_none(
    tmp_path: Path,
) -> None:
    first_stopped = threading.Event()
    started: list[str] = []
    finished: list[str] = []

    def run(release: str, directory: Path) -> dict[str, Any]:
        started.append(release)
        if release == "1.0":
            first_stopped.set()
            raise KeyboardInterrupt
        # Still going when the interruption reaches the matrix: it must be waited for.
        assert first_stopped.wait(timeout=30)
        finished.append(release)
        return {"ok": True}

    with pytest.raises(KeyboardInterrupt):
        run_versions(RELEASES, run, tmp_path, at_once=2)
    assert sorted(started) == ["1.0", "1.1"]
    assert finished == ["1.1"]


def test_no_release_at_a_time_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="at-once"):
        run_versions(RELEASES, evidence("1.0", []), tmp_path, at_once=0)
