"""The campaign's failover crash mode: what a promoted standby holds held against what the
primary held at the crash, judged by the level's promise (unit tests), and small real
campaigns on a primary and a streaming standby at ``on`` and at ``local``."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.campaign import failover_cases
from crashqueuelab.lab.campaign.failover_cases import (
    LEASE_WENT_BACK,
    LOST,
    RESURRECTED,
    WENT_BACK,
    _effects,
    _unfinished,
    answers_differ,
    event_text,
    failover_changes,
    judge_failover,
)
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.failover.promises import promise_of
from crashqueuelab.lab.failover.targets import case_failover
from crashqueuelab.lab.faults.crashmodes import check_crash_mode
from crashqueuelab.lab.faults.standbyhold import MADE_FILE, ask_for_hold, holding
from crashqueuelab.lab.reproducers.campaign import shrink_if_failed
from crashqueuelab.lab.runs.commands import campaign_command
from crashqueuelab.lab.workloads.scenario import effect_key, scenario_jobs
from crashqueuelab.servers.postgres import find_binaries
from crashqueuelab.systems.contract import (
    JobStatus,
    StoredJob,
    StoreReading,
)
from crashqueuelab.systems.crashpoints import (
    phase_before,
)
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import RunCli

needs_postgres = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")


def _reading(
    jobs: dict[str, tuple[str, JobStatus, int]], history: Sequence[Mapping[str, Any]]
) -> StoreReading:
    return StoreReading(
        exists=True,
        jobs={
            key: StoredJob(state, status, attempts)
            for key, (state, status, attempts) in jobs.items()
        },
        facts={},
        ok=True,
        problems=[],
        judge="test",
        history=history,
    )


def _event(seq: int, kind: str, job: str) -> dict[str, Any]:
    return {"seq": seq, "event_type": kind, "job_id": job}


PRIMARY = _reading(
    {
        "a": ("SUCCEEDED", JobStatus.SUCCEEDED, 1),
        "b": ("LEASED", JobStatus.LEASED, 1),
        "c": ("QUEUED", JobStatus.PENDING, 0),
        "d": ("QUEUED", JobStatus.PENDING, 0),
    },
    [
        _event(1, "SUBMITTED", "ja"), _event(2, "SUBMITTED", "jb"), _event(3, "SUBMITTED", "jc"),
        _event(4, "SUBMITTED", "jd"), _event(5, "CLAIMED", "ja"), _event(6, "SUCCEEDED", "ja"),
        _event(7, "CLAIMED", "jb"),
    ],
)  # fmt: skip


def test_the_promoted_standby_is_held_against_the_primary_job_by_job() -> None:
    promoted = _reading(
        {
            "a": ("LEASED", JobStatus.LEASED, 1),
            "b": ("QUEUED", JobStatus.PENDING, 0),
            "c": ("QUEUED", JobStatus.PENDING, 0),
        },
        PRIMARY.history[:5],
    )
    changes = failover_changes(PRIMARY, promoted)
    assert [
        (one["job"], one["change"], one["primary"], one["promoted"]) for one in changes["jobs"]
    ] == [
        ("a", RESURRECTED, ["SUCCEEDED", 1], ["LEASED", 1]),
        ("b", WENT_BACK, ["LEASED", 1], ["QUEUED", 0]),
        ("d", LOST, ["QUEUED", 0], None),
    ]
    assert changes["transitions_lost"] == [
        "SUCCEEDED of job ja (seq 6)",
        "CLAIMED of job jb (seq 7)",
    ]
    assert changes["jobs_never_on_the_primary"] == []
    assert changes["transitions_never_on_the_primary"] == []
    # Nothing lost, nothing found: no finding at any level.
    same = failover_changes(PRIMARY, PRIMARY)
    assert judge_failover(same, promise_of("on")) == ([], [])


def test_a_heartbeat_lost_at_the_failover_shortens_the_lease_the_holder_was_told() -> None:
    leased = StoredJob("LEASED", JobStatus.LEASED, 1, 9_000)
    told = StoreReading(True, {"a": leased}, {}, True, [], "test")
    earlier = StoreReading(
        True, {"a": StoredJob("LEASED", JobStatus.LEASED, 1, 5_000)}, {}, True, [], "test"
    )
    changes = failover_changes(told, earlier)
    assert changes["jobs"] == [
        {"job": "a", "change": LEASE_WENT_BACK, "primary": ["LEASED", 1],
         "promoted": ["LEASED", 1], "lease_deadlines_us": [9_000, 5_000]},
    ]  # fmt: skip
    _, documented = judge_failover(changes, promise_of("off"))
    assert "job a lease went back (LEASED/1, its lease to 9000 us on the primary," in documented[0]


def test_a_loss_is_documented_where_the_level_allows_it_and_broken_where_not() -> None:
    promoted = _reading({"a": ("LEASED", JobStatus.LEASED, 1)}, PRIMARY.history[:5])
    changes = failover_changes(PRIMARY, promoted)
    found, documented = judge_failover(changes, promise_of("local"))
    assert found == []
    assert len(documented) == 1
    assert "documented: synchronous_commit=local allows it" in documented[0]
    assert (
        "job a resurrected (SUCCEEDED/1 on the primary, LEASED/1 after promotion)" in documented[0]
    )
    assert "2 transitions lost" in documented[0]
    for level in ("remote_write", "on", "remote_apply"):
        found, documented = judge_failover(changes, promise_of(level))
        assert documented == []
        assert [finding.kind for finding in found] == [Kind.ACKNOWLEDGED_WORK_LOST]
        assert found[0].text.startswith(f"broken promise of synchronous_commit={level}:")
        assert found[0].facts["transitions_lost"] == 2


def test_what_the_primary_never_had_is_a_finding_at_every_level() -> None:
    promoted = _reading(
        {**{key: (j.native_state, j.status, j.attempts) for key, j in PRIMARY.jobs.items()},
         "z": ("QUEUED", JobStatus.PENDING, 0)},
        [*PRIMARY.history, _event(8, "SUBMITTED", "jz")],
    )  # fmt: skip
    changes = failover_changes(PRIMARY, promoted)
    assert changes["jobs_never_on_the_primary"] == ["z"]
    found, documented = judge_failover(changes, promise_of("off"))
    assert documented == []
    assert [finding.kind for finding in found] == [Kind.STORE_DIFFERS]
    assert "z, SUBMITTED of job jz (seq 8)" in found[0].text


def test_the_queue_on_the_promoted_standby_must_answer_what_it_holds() -> None:
    answers: dict[str, list[object] | None] = {
        "a": ["SUCCEEDED", 1], "b": ["LEASED", 1], "c": None, "e": None,
    }  # fmt: skip
    found = answers_differ(answers, PRIMARY)
    assert [finding.job for finding in found] == ["c"]
    assert found[0].kind is Kind.REPORT_DIFFERS
    assert "answered None, the standby holds ['QUEUED', 0]" in found[0].text


def test_events_and_phases_are_named_as_the_page_says_them() -> None:
    assert event_text({"type": "enqueued", "job": 3}) == "enqueued of job 3"
    assert event_text({}) == "event of job ?"
    assert phase_before("AFTER_SUCCESS_COMMIT") == "BEFORE_SUCCESS_COMMIT"
    assert phase_before("CLAIM_COMMIT_REPLY_LOST") == "BEFORE_CLAIM_COMMIT"
    assert phase_before("SUCCESS_COMMIT_ID_REUSED") == "BEFORE_SUCCESS_COMMIT"
    assert phase_before("BEFORE_CLAIM_COMMIT") is None
    assert phase_before("enqueue:after") == "enqueue:before"
    assert phase_before("enqueue:before") is None
    assert phase_before("AFTER_HEARTBEAT") is None


def test_the_child_waits_until_the_run_has_held_the_standby(tmp_path: Path) -> None:
    held = threading.Event()
    with holding(tmp_path, held.set) as hold:
        assert ask_for_hold(tmp_path)
    assert held.is_set()
    assert hold.made
    # Nobody answering: the child goes on after its wait, and says the hold was not made.
    other = tmp_path / "other"
    other.mkdir()
    assert not ask_for_hold(other, wait_s=0.05)
    assert not (other / MADE_FILE).exists()
    with holding(other / "never", held.set) as hold:
        pass
    assert not hold.made


def test_a_failover_is_refused_where_there_is_nothing_to_fail_over(
    tmp_path: Path, run_cli: RunCli
) -> None:
    with pytest.raises(InvalidInput, match="a system on PostgreSQL only"):
        check_crash_mode("failover", resolve_system("sqlite"))
    with pytest.raises(InvalidInput, match="not one of process, power-loss"):
        check_crash_mode("failover", experiment="chaos")
    with pytest.raises(InvalidInput, match="one of off, local"):
        case_failover("sometimes")
    with pytest.raises(InvalidInput, match="of --crash-mode failover, and of it alone"):
        run_campaign(tmp_path / "a", seed=1, system="postgres", crash_mode="failover")
    with pytest.raises(InvalidInput, match="of --crash-mode failover, and of it alone"):
        run_campaign(tmp_path / "a", seed=1, system="postgres", failover=case_failover("on"))
    outcome = run_cli(
        "campaign", "--system", "sqlite", "--crash-mode", "failover",
        "--output-directory", tmp_path / "b",
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE == 2
    assert outcome.result["error"]["field"] == "crash_mode"
    outcome = run_cli(
        "campaign", "--system", "postgres", "--synchronous-commit", "local",
        "--output-directory", tmp_path / "c",
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["field"] == "synchronous_commit"
    report = {"system": {"name": "postgres"}, "seed": 3, "crash_mode": "failover",
              "failover": {"synchronous_commit": "off"}}  # fmt: skip
    assert "--crash-mode failover --synchronous-commit off --system postgres" in (
        campaign_command(report, "out")
    )


#: A point of each kind: a BEFORE phase (nothing of its own committed), an AFTER phase,
#: and a reply lost after the COMMIT.
POINTS = ("BEFORE_CLAIM_COMMIT", "AFTER_SUCCESS_COMMIT", "CLAIM_COMMIT_REPLY_LOST")


def _campaign(run_cli: RunCli, out: Path, *level: str) -> dict[str, object]:
    points = [word for point in POINTS for word in ("--crash-point", point)]
    outcome = run_cli(
        "campaign", "--system", "postgres", "--crash-mode", "failover", *level, *points,
        "--probe", "idempotent_submit", "--quiet", "--output-directory", out,
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result
    report: dict[str, object] = json.loads((out / "campaign.json").read_text())
    return report


@needs_postgres
def test_at_on_every_point_passes_and_the_promoted_standby_lacks_nothing(
    run_cli: RunCli, tmp_path: Path
) -> None:
    report = _campaign(run_cli, tmp_path / "on")
    summary = report["summary"]
    assert isinstance(summary, dict)
    assert summary["synchronous_commit"] == "on"
    assert summary["passed"] == 3
    assert summary["failed"] == 0
    assert summary["cases_losing_committed_work"] == 0
    # The lag is the WAL the primary had written and the standby not flushed when the
    # primary was killed: at `on` no COMMIT's, but WAL no COMMIT waited for may be (968
    # bytes in one case of a run beside a busy suite, which lost nothing): measured, and
    # what `on` promises is the promoted state below.
    assert isinstance(summary["lag_bytes_max"], int)
    assert summary["promise"].startswith("When set to on, commits wait")
    cases = report["cases"]
    assert isinstance(cases, list)
    for case in cases:
        assert case["failover"]["standby_held"].startswith("never held")
        assert case["promoted_state"]["signature"] == case["crash_state"]["signature"]
        assert case["answers_on_the_promoted"] is not None
        assert case["failover"]["promoted_s"] > 0
    assert (
        "failover campaign at synchronous_commit=on"
        in (tmp_path / "on" / "report.html").read_text()
    )


@needs_postgres
def test_at_local_a_held_standby_loses_the_tail_as_documented(
    run_cli: RunCli, tmp_path: Path
) -> None:
    report = _campaign(run_cli, tmp_path / "local", "--synchronous-commit", "local")
    summary = report["summary"]
    assert isinstance(summary, dict)
    assert summary["passed"] == 3
    assert summary["broken_promises"] == 0
    assert summary["cases_with_documented_loss"] >= 1
    cases = {case["fault_point"]: case for case in report["cases"]}  # type: ignore[attr-defined]
    # Held from the phase before its COMMIT: the success alone is taken back, and the job
    # the primary had finished is to run again.
    success = cases["AFTER_SUCCESS_COMMIT"]
    assert success["failover"]["standby_held"] == "from BEFORE_SUCCESS_COMMIT"
    assert success["failover"]["lag_bytes"] > 0
    assert [one["change"] for one in success["changes"]["jobs"]] == [RESURRECTED]
    assert [t.split(" of ")[0] for t in success["changes"]["transitions_lost"]] == ["SUCCEEDED"]
    assert "synchronous_commit=local allows it" in success["documented"][0]
    assert success["recovered_terminal_state"] == {"effect": "SUCCEEDED", "flaky": "SUCCEEDED"}
    page = (tmp_path / "local" / "report.html").read_text()
    assert "The setting local causes commits to wait for local flush" in page
    assert "1 resurrected, 1 transition lost" in page


def test_effects_run_again_are_documented_only_as_a_documented_loss_s_consequence() -> None:
    jobs = scenario_jobs("case")
    ledger = {"effects_by_key": {effect_key(jobs[0]): 2, effect_key(jobs[1]): 1}}
    changes = {"jobs": [{"job": jobs[0].key}]}
    anomalies: list[Anomaly] = []
    documented = ["committed on the primary and absent after promotion: ..."]
    _effects(anomalies, documented, ledger, jobs, changes)
    assert anomalies == []
    assert documented[1].endswith("after the jobs the failover took back")
    _effects(anomalies, [], ledger, jobs, changes)
    assert [finding.kind for finding in anomalies] == [Kind.EFFECTS_NOT_ONCE]
    # A job the failover did not take back has no excuse, documented loss or not.
    other = {"effects_by_key": {effect_key(jobs[0]): 1, effect_key(jobs[1]): 2}}
    anomalies.clear()
    _effects(anomalies, documented, other, jobs, changes)
    assert [finding.kind for finding in anomalies] == [Kind.EFFECTS_NOT_ONCE]
    # Never submitted again (its producer had been told it was): documented with the loss.
    anomalies.clear()
    states = {"effect": "MISSING", "flaky": "SUCCEEDED"}
    _unfinished(anomalies, documented, states, jobs, changes, {"effect": False, "flaky": True})
    assert anomalies == []
    assert documented[-1].startswith("final states {'effect': 'MISSING'")
    _unfinished(anomalies, documented, states, jobs, changes, {"effect": True, "flaky": False})
    assert [finding.kind for finding in anomalies] == [Kind.RECOVERY_UNFINISHED]


def test_a_failing_failover_campaign_is_not_shrunk(tmp_path: Path, run_cli: RunCli) -> None:
    report: dict[str, Any] = {
        "crash_mode": "failover", "ok": False, "passed_what_ran": False, "shrink": None,
    }  # fmt: skip
    assert shrink_if_failed(tmp_path, report, 60.0)["shrink"] is None
    (tmp_path / "campaign.json").write_text(json.dumps(report))
    outcome = run_cli("shrink", tmp_path)
    assert outcome.code == cli.EXIT_USAGE
    assert "a failover campaign is not shrunk" in outcome.result["error"]["message"]


@needs_postgres
def test_a_level_the_system_cannot_run_at_is_refused_with_exit_2(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The queue is not told the level (as a system that checks its own settings): it refuses
    # to open at local, and the run ends at its first case, the others never started.
    monkeypatch.setattr(failover_cases, "LEVEL_VARIABLE", "CRASHQUEUELAB_NOT_A_LEVEL")
    outcome = run_cli(
        "campaign", "--system", "postgres", "--crash-mode", "failover",
        "--synchronous-commit", "local", "--crash-point", "AFTER_SUBMIT_COMMIT",
        "--crash-point", "AFTER_CLAIM_COMMIT", "--output-directory", tmp_path / "c",
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE, outcome.result
    assert outcome.result["error"]["field"] == "synchronous_commit"
    assert "postgres cannot run at synchronous_commit=local" in outcome.result["error"]["message"]
    assert len(list((tmp_path / "c" / "cases").iterdir())) == 1
