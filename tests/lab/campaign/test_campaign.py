"""The campaign, the effect demo and the showcase, judged from their retained artifacts."""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.campaign.cases import death_record, death_summary
from crashqueuelab.lab.campaign.run import campaign_order, run_campaign
from crashqueuelab.lab.demo import run_demo
from crashqueuelab.lab.faults.children import CHILD_STDERR, ChildRun
from crashqueuelab.lab.faults.hooks import InjectedCrash, raise_at
from crashqueuelab.lab.mutants.catalog import MUTANTS
from crashqueuelab.lab.showcase import summarize
from crashqueuelab.lab.workloads.scenario import run_campaign_workload
from crashqueuelab.systems import CrashPoint, System, resolve_system
from tests.conftest import EXAMPLES, SHOWCASE_SEED, RunCli, invoke_cli

SQLITE = resolve_system("sqlite")
WALQUEUE = resolve_system("walqueue")


def without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "timings"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_a_seed_fixes_the_order_and_another_seed_changes_it() -> None:
    assert campaign_order(SQLITE, 7) == campaign_order(SQLITE, 7)
    assert sorted(p.name for p in campaign_order(SQLITE, 7)) == sorted(
        p.name for p in SQLITE.crash_points
    )
    assert campaign_order(SQLITE, 7) != campaign_order(SQLITE, 8)


def test_two_campaigns_with_one_seed_differ_only_in_timings(tmp_path: Path) -> None:
    first = run_campaign(tmp_path / "one", seed=5)
    second = run_campaign(tmp_path / "two", seed=5)
    assert first["ok"] is True
    assert first["summary"]["passed"] == 13
    assert first != second  # the timings really differ...
    assert without_timings(first) == without_timings(second)  # ...and nothing else does
    on_disk = json.loads((tmp_path / "one" / "campaign.json").read_text())
    assert without_timings(on_disk) == without_timings(first)


def recount(path: Path, sql: str) -> Any:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def test_the_demo_numbers_come_from_the_retained_databases(tmp_path: Path) -> None:
    comparison = run_demo(tmp_path / "demo")
    assert comparison == json.loads((tmp_path / "demo" / "comparison.json").read_text())
    assert set(comparison) == {
        "system", "fault_point", "idempotent", "non_idempotent", "queue_delivery_semantics",
    }  # fmt: skip
    assert comparison["system"]["name"] == "sqlite"
    for name, effects in (("idempotent", 1), ("non_idempotent", 2)):
        scenario = tmp_path / "demo" / name
        assert recount(scenario / "effects.sqlite", "SELECT count(*) FROM effects") == effects
        attempts = recount(scenario / "store/queue.sqlite", "SELECT attempts FROM jobs")
        state = recount(scenario / "store/queue.sqlite", "SELECT state FROM jobs")
        assert comparison[name] == {
            "attempt_count": attempts,
            "effect_count": effects,
            "final_state": state,
            "final_status": "succeeded",
            "invariants_ok": True,
        }
        assert (attempts, state) == (2, "SUCCEEDED")
        report = json.loads((scenario / "report.json").read_text())
        assert report["first_worker"]["died_at_fault_point"] is True
        assert report["executions"] == 2
        history = json.loads((scenario / "history.json").read_text())
        assert [event["event_type"] for event in history] == [
            "SUBMITTED", "CLAIMED", "LEASE_EXPIRED", "PROMOTED", "CLAIMED", "SUCCEEDED",
        ]  # fmt: skip


def test_the_showcase_prints_a_summary_computed_from_its_artifacts(
    showcase_run: tuple[int, dict[str, Any], Path], tmp_path: Path
) -> None:
    code, printed, shared = showcase_run
    summary = dict(printed)
    # A copy: the damage below must not reach the other tests that read this showcase.
    target = tmp_path / "showcase"
    shutil.copytree(shared, target)
    # Where this machine cannot cut the power, what ran passed and the rest is named.
    complete = summary["power_loss"] == "ran"
    assert code == (cli.EXIT_OK if complete else cli.EXIT_PASSED_WHAT_RAN)
    assert (summary["ok"], summary["passed_what_ran"]) == (complete, True)
    assert summary["seed"] == SHOWCASE_SEED
    effect = summary["effect_commit_before_acknowledgement"]
    assert effect["attempts_per_scenario"] == {"idempotent": 2, "non_idempotent": 2}
    assert effect["durable_effects"] == {"idempotent": 1, "non_idempotent": 2}
    campaign = summary["process_fault_campaign"]
    assert campaign["exit_codes"] == [86]
    assert (campaign["passed"], campaign["failed"], campaign["timeouts"]) == (13, 0, 0)
    assert campaign["crash_mode"] == "spawned_process_os_exit"
    assert summary["queue_delivery_semantics"] == "at-least-once execution"
    assert set(summary["systems"]) == {"sqlite", "walqueue"}
    assert summary["systems"]["sqlite"]["process_fault_campaign"] == campaign
    walqueue = summary["systems"]["walqueue"]
    assert (walqueue["ok"], walqueue["passed_what_ran"]) == (complete, True)
    assert walqueue["system"]["name"] == "walqueue"
    assert walqueue["process_fault_campaign"]["passed"] == len(WALQUEUE.crash_points)
    assert walqueue["effect_commit_before_acknowledgement"]["durable_effects"] == {
        "idempotent": 1,
        "non_idempotent": 2,
    }
    for section in summary["systems"].values():
        power_loss = section["power_loss_campaign"]
        assert power_loss["ok"] is power_loss["ran"] is complete
        if power_loss["ran"]:
            assert power_loss["crash_states_passed"] == power_loss["crash_states"] > 0
    mutants = summary["mutants"]
    assert (mutants["ok"], mutants["passed_what_ran"]) == (not mutants["not_run"], True)
    assert mutants["total"] == len(MUTANTS)
    assert mutants["caught"] == len(MUTANTS) - len(mutants["not_run"])
    assert summary["complete"] is (not mutants["not_run"] and summary["power_loss"] == "ran")
    assert mutants["line"].startswith(f"mutants: {mutants['caught']} of {len(MUTANTS)} caught")
    assert summary.pop("report") == str(shared / "report.html")
    assert json.loads((target / "showcase.json").read_text()) == summary
    # Damage one retained effect database: the summary, recomputed, must notice.
    conn = sqlite3.connect(
        target / "sqlite/effect-commit-before-acknowledgement/idempotent/effects.sqlite"
    )
    conn.execute("DROP INDEX effects_unique_key")
    conn.execute("INSERT INTO effects SELECT NULL, effect_key, value, job_id, 9, worker_id,"
                 " applied_at_us FROM effects")  # fmt: skip
    conn.commit()
    conn.close()
    recomputed = summarize(target, seed=SHOWCASE_SEED)
    assert recomputed["effect_commit_before_acknowledgement"]["durable_effects"]["idempotent"] == 2
    assert recomputed["ok"] is False


@pytest.mark.slow
def test_a_showcase_without_power_loss_says_why_and_runs_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    from crashqueuelab.lab import showcase

    monkeypatch.setattr(showcase, "unavailable_reason", lambda: "no /dev/fuse here")
    # Two mutants a process death or a probe catches, two only a power cut does: enough to
    # show how the showcase counts what it could not run.
    chosen = [m for m in MUTANTS if not m.needs_power_loss][:2]
    chosen += [m for m in MUTANTS if m.needs_power_loss][:2]
    monkeypatch.setattr(showcase, "MUTANTS", chosen)
    argv = ["showcase", "--system", "sqlite", "--seed", "2", "--quiet"]
    outcome = run_cli(*argv, "--output-directory", str(tmp_path / "s"))
    # What ran passed, and evidence did not run: never ok, never exit 0.
    assert outcome.code == cli.EXIT_PASSED_WHAT_RAN
    assert outcome.result["power_loss"] == "unavailable: no /dev/fuse here"
    section = outcome.result["systems"]["sqlite"]
    assert section["power_loss_campaign"] == {
        "ran": False,
        "ok": False,
        "unavailable": "no /dev/fuse here",
    }
    assert (section["ok"], section["passed_what_ran"], section["complete"]) == (False, True, False)
    assert not (tmp_path / "s" / "sqlite" / "power-loss-campaign").exists()
    # Skipped evidence is part of the verdict: counted in the total, named, never caught.
    mutants = outcome.result["mutants"]
    needing = [mutant.name for mutant in chosen if mutant.needs_power_loss]
    assert (mutants["total"], mutants["caught"]) == (4, 2)
    assert (mutants["ok"], mutants["passed_what_ran"]) == (False, True)
    assert [m["mutant"] for m in mutants["not_run"]] == needing
    assert mutants["line"].startswith("mutants: 2 of 4 caught, 2 not run by the evidence")
    assert "; why not run: mutants.json;" in mutants["line"]
    assert not [name for name in needing if name in mutants["line"]]
    assert (outcome.result["ok"], outcome.result["complete"]) == (False, False)
    assert outcome.result["passed_what_ran"] is True
    assert outcome.result["not_run"] == [
        "sqlite: the power-loss campaign (no /dev/fuse here)",
        "2 of 4 mutants (it needs a power cut, and no /dev/fuse here)",
    ]
    # The verdict line says the reason once.
    headline = "not run: power-loss campaign (sqlite) and 2 of 4 mutants: no /dev/fuse here"
    assert outcome.result["headline"] == headline
    last = outcome.stderr.rstrip().splitlines()[-1]
    assert last == f"crashqueuelab: passed what ran: {headline}; report: {outcome.result['report']}"
    kept = json.loads((tmp_path / "s" / "mutants" / "mutants.json").read_text())
    assert (kept["caught"], kept["total"], kept["ran"], kept["complete"]) == (2, 4, 2, False)
    assert (kept["ok"], kept["passed_what_ran"]) == (False, True)
    page = (tmp_path / "s" / "report.html").read_text()
    assert "Passed what ran" in page
    assert 'data-ok="false" data-complete="false"' in page
    assert "mutants 2 of 4 caught, 2 not run" in page
    assert "Not run (2): not counted as passed" in page
    assert '<h2>sqlite <span class="">passed what ran</span></h2>' in page
    # Counts as a reader writes them, and the effect page's order (non-idempotent first).
    assert "{'" not in page
    assert '<td colspan="2">26 SUCCEEDED</td>' in page
    effects = 'durable effects (non-idempotent / idempotent)</th><td class="num">2 / 1</td>'
    assert effects in page
    demo = tmp_path / "s" / "sqlite" / "effect-commit-before-acknowledgement" / "report.html"
    assert effects in demo.read_text()
    mutants_page = (tmp_path / "s" / "mutants" / "report.html").read_text()
    assert "mutants: 2 of 4 caught, 2 not run" in mutants_page
    assert 'data-ok="false" data-complete="false"' in mutants_page
    assert mutants_page.count("not run, so not caught") == 2


def test_the_mutants_line_stays_short_when_many_mutants_did_not_run_for_a_long_reason(
    tmp_path: Path,
) -> None:
    """Without FUSE the mutants' reason carries the install hint, which the showcase's
    verdict line says once: the mutants' line gives each reason's first clause and names
    the file that lists the mutants (it was 445 characters, the hint in full)."""
    from crashqueuelab.cli.verdict import LINE_LIMIT
    from crashqueuelab.lab.showcase import _mutant_summary

    hint = (
        "power-loss mode needs the FUSE bindings: /a/long/virtual/environment/bin/pip"
        " install -e '.[powerloss]' (from the checkout's root)"
    )
    needing = [m.name for m in MUTANTS if m.needs_power_loss]
    report = {
        "seed": 1, "timings": {"total_s": 20.4}, "ok": False, "passed_what_ran": True,
        "caught": 17, "total": 22, "missed": [], "seeds": [1], "evidence": {},
        "not_run": [{"mutant": n, "reason": f"it needs a power cut, and {hint}"} for n in needing],
    }  # fmt: skip
    (tmp_path / "mutants.json").write_text(json.dumps(report))
    line = _mutant_summary(tmp_path)["line"]
    assert len(f"crashqueuelab: {line}") <= LINE_LIMIT, line
    assert f"caught, {len(needing)} not run by the evidence" in line
    assert "; why not run: mutants.json;" in line
    assert "pip install" not in line


def test_what_a_showcase_did_not_run_is_listed_with_each_reason_and_said_once_per_reason() -> None:
    from crashqueuelab.lab.showcase import PROBES_NOT_OPENED, not_run_of

    hint = "power-loss mode needs root or fusermount3 to mount (Debian: apt-get install fuse3)"

    def section(probes_not_run: int) -> dict[str, Any]:
        return {
            "power_loss_campaign": {"ran": False, "ok": False, "unavailable": hint},
            "process_fault_campaign": {"probes_not_run": probes_not_run},
        }

    systems = {"sqlite": section(0), "walqueue": section(2)}
    mutants = {"not_run": [{"reason": f"it needs a power cut, and {hint}"}] * 4, "total": 21}
    listed, headline = not_run_of(systems, mutants, hint)
    assert listed == [
        f"sqlite: the power-loss campaign ({hint})",
        f"walqueue: the power-loss campaign ({hint})",
        f"walqueue: 2 probes of the crash campaign ({PROBES_NOT_OPENED})",
        f"4 of 21 mutants (it needs a power cut, and {hint})",
    ]
    assert headline == (
        f"not run: power-loss campaigns (sqlite, walqueue) and 4 of 21 mutants: {hint};"
        f" 2 probes of the crash campaign (walqueue): {PROBES_NOT_OPENED}"
    )
    complete = {"power_loss_campaign": {"ran": True}, "process_fault_campaign": {}}
    assert not_run_of({"sqlite": complete}, {"not_run": []}, None) == ([], None)


def test_a_campaign_whose_probes_could_not_open_their_system_passed_only_what_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No server named for a probe is a setup error: the probe did not run, the campaign
    is not ok, and nothing is counted as a failure of the system or shrunk as one."""
    from crashqueuelab.lab.pages.render import write_report
    from crashqueuelab.lab.reproducers.campaign import shrink_if_failed
    from crashqueuelab.servers.postgres import DSN_VARIABLE

    monkeypatch.delenv(DSN_VARIABLE, raising=False)
    directory = tmp_path / "c"
    report = run_campaign(directory, seed=1, system="postgres", probes=["idempotent_submit"])
    assert (report["ok"], report["passed_what_ran"], report["complete"]) == (False, True, False)
    assert report["anomalies"] == []
    assert report["not_run"] == [
        "probe idempotent_submit: not run: SystemUnavailable: system 'postgres': no server:"
        " the command line starts one (or give --dsn); CRASHQUEUELAB_POSTGRES_DSN is unset"
    ]
    summary = report["summary"]
    assert (summary["probes_failed"], summary["probes_not_run"]) == (0, 1)
    assert shrink_if_failed(directory, report, 5)["shrink"] is None
    shrunk = invoke_cli("shrink", directory)
    assert shrunk.code == cli.EXIT_PASSED_WHAT_RAN
    assert shrunk.result["detail"] == "nothing that ran failed: nothing to shrink"
    assert not (directory / "reproducer").exists()
    page = write_report(directory).read_text()
    assert "Passed what ran" in page
    assert "Not run (1): not counted as passed" in page
    assert "0 passed, 0 failed, 1 not run" in page


@pytest.mark.parametrize("command", ["showcase", "demo", "campaign"])
def test_a_non_empty_output_directory_is_refused_untouched(
    tmp_path: Path, command: str, run_cli: RunCli
) -> None:
    (tmp_path / "earlier-result.json").write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    outcome = run_cli(command, "--output-directory", str(tmp_path), "--seed", "1")
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["type"] == "InvalidInput"
    assert "not empty" in outcome.result["error"]["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "earlier-result.json").read_text() == "{}"


def test_an_output_path_that_is_a_file_is_refused(tmp_path: Path, run_cli: RunCli) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    outcome = run_cli("demo", "--output-directory", str(target))
    assert outcome.code == cli.EXIT_USAGE
    assert "not a directory" in outcome.result["error"]["message"]


def test_demo_and_campaign_commands_report_through_the_cli(tmp_path: Path, run_cli: RunCli) -> None:
    demo = run_cli("demo", "--output-directory", str(tmp_path / "d"))
    assert (demo.code, demo.result["ok"]) == (cli.EXIT_OK, True)
    assert demo.result["comparison"]["non_idempotent"]["effect_count"] == 2
    campaign = run_cli("campaign", "--output-directory", str(tmp_path / "c"), "--seed", "2")
    assert (campaign.code, campaign.result["ok"]) == (cli.EXIT_OK, True)
    assert campaign.result["summary"]["named_fault_points"] == 13


def every_point() -> list[tuple[System, CrashPoint]]:
    return [(system, point) for system in (SQLITE, WALQUEUE) for point in system.crash_points]


@pytest.mark.parametrize(
    ("system", "point"), every_point(), ids=[f"{s.name}-{p.name}" for s, p in every_point()]
)
def test_the_workload_reaches_every_point_in_process(
    tmp_path: Path, system: System, point: CrashPoint
) -> None:
    """The same workload with a raising hook: fast, and it measures the workload's coverage."""
    if point.after is not None:
        with pytest.raises(InjectedCrash):
            run_campaign_workload(tmp_path, system, case_id="c", seed=1, hook=raise_at(point.after))
    with pytest.raises(InjectedCrash) as caught:
        run_campaign_workload(tmp_path, system, case_id="c", seed=1, hook=raise_at(point.name))
    assert caught.value.point == point.name


@pytest.mark.parametrize("system", [SQLITE, WALQUEUE], ids=["sqlite", "walqueue"])
def test_the_uninterrupted_workload_finishes_both_jobs(tmp_path: Path, system: System) -> None:
    run_campaign_workload(tmp_path, system, case_id="c", seed=1, hook=lambda phase: None)
    reading = system.reader(tmp_path / "store") if system.reader else None
    assert reading is not None
    assert reading.ok is True
    assert {job.status.value for job in reading.jobs.values()} == {"succeeded"}
    assert len(reading.jobs) == 2


def test_a_child_that_died_of_an_error_says_which(tmp_path: Path) -> None:
    """A child that did not reach its crash point is reported with the last line it wrote
    to stderr: a traceback's last line names the exception."""
    point = resolve_system("sqlite").crash_points[0]
    failed = ChildRun(exit_code=1, timed_out=False, elapsed_ms=3.0)
    (tmp_path / CHILD_STDERR).write_text(
        "Traceback (most recent call last):\n  File ...\nOSError: [Errno 5] Input/output error\n\n"
    )
    death = death_record("c", point, failed, None, tmp_path)
    assert death["died_at_fault_point"] is False
    assert death["child_error"] == "OSError: [Errno 5] Input/output error"
    assert death_summary(death) == (
        "exit 1, last words None, it said 'OSError: [Errno 5] Input/output error'"
    )
    (tmp_path / CHILD_STDERR).unlink()
    silent = death_record("c", point, failed, None, tmp_path)
    assert silent["child_error"] is None
    assert death_summary(silent) == "exit 1, last words None"


def test_a_system_without_concurrent_stores_gets_its_cases_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashqueuelab.lab.campaign import run as campaign_run

    monkeypatch.syspath_prepend(str(EXAMPLES))
    seen: list[int] = []
    real = campaign_run._run_cases

    def counting(*args: Any) -> list[dict[str, Any]]:
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(campaign_run, "_run_cases", counting)
    for spec in ("tiny_adapter:tiny_system", "tests.lab.campaign.test_campaign:one_store_system"):
        campaign_run.run_campaign(
            tmp_path / spec.replace(":", "-"), seed=1, system=spec,
            crash_points=["claim:after"], probes=[],
        )  # fmt: skip
    assert seen == [campaign_run.CASES_AT_ONCE, 1]


def one_store_system() -> System:
    from tiny_adapter import tiny_system

    plain = tiny_system()
    capabilities = replace(plain.capabilities, concurrent_stores=False)
    return replace(plain, name="tinyqueue-one-store", capabilities=capabilities)


def _failed_case(**recovery: Any) -> dict[str, Any]:
    """A process-death case record whose recovery lost a job and left one unfinished."""
    return {
        "case_id": "02-claim-after", "fault_point": "claim:after", "passed": False,
        "died_at_fault_point": True, "points_reached": None, "exit_code": 137,
        "crash_state_matches_point": True, "recovery_ok": False,
        "crash_state": {"signature": {}}, "expected_crash_signature": {},
        "crash_judgement": {"problems": []},
        "recovery": {
            "anomalies": ["job 02-claim-after/effect: leased/1 at the crash, missing after"
                          " recovery"],
            "store": {"problems": []}, "each_effect_durable_once": False,
            "ledger": {"effects_by_key": {"02-claim-after/flaky-1": 1}},
            "final_states": {"effect": "MISSING", "flaky": "succeeded"},
            **recovery,
        },
    }  # fmt: skip


def test_a_campaign_record_without_findings_is_read_as_its_lines() -> None:
    from crashqueuelab.judges.findings import Anomaly, Kind
    from crashqueuelab.lab.campaign.verdict import anomalies_of

    report: dict[str, Any] = {
        "cases": [_failed_case()],
        "probes": [{"name": "stale_holder_after_expiry", "ran": True, "ok": False,
                    "status": "failed", "detail": "job x: was accepted"}],
        "model": {"anomalies": ["job m: handed out as attempt 2 of 1 (at 1 s)"]},
    }  # fmt: skip
    case_line = (
        "case 02-claim-after: job 02-claim-after/effect: leased/1 at the crash, missing after"
        " recovery; effects after recovery: {'02-claim-after/flaky-1': 1}; final states"
        " {'effect': 'MISSING', 'flaky': 'succeeded'}"
    )
    old = anomalies_of(report)
    assert old == [
        case_line,
        "probe stale_holder_after_expiry: job x: was accepted",
        "model workload: job m: handed out as attempt 2 of 1 (at 1 s)",
    ]
    # Kept today: the same lines, each reason a part of its case's finding.
    lost = Anomaly(Kind.LOST_IN_RECOVERY, report["cases"][0]["recovery"]["anomalies"][0])
    report["cases"] = [_failed_case(findings=[lost.to_json()])]
    [case, *_] = anomalies_of(report)
    assert isinstance(case, Anomaly)
    assert case.text == case_line
    assert [part.kind for part in case.parts] == [
        Kind.LOST_IN_RECOVERY,
        Kind.EFFECTS_NOT_ONCE,
        Kind.RECOVERY_UNFINISHED,
    ]
    assert case.parts[1].facts == {"effect_effects": 0, "flaky_effects": 1}
    assert case.parts[2].facts == {"effect_state": "MISSING", "flaky_state": "succeeded"}
    assert {part.point for part in case.parts} == {"claim:after"}


def test_a_power_loss_case_without_findings_is_read_as_its_lines() -> None:
    from crashqueuelab.lab.campaign.verdict import anomalies_of

    case = {"case_id": "03-x", "fault_point": "x", "passed": False, "anomalies": ["s1: lost"]}
    report = {"cases": [case], "probes": [], "model": {"anomalies": []}}
    assert anomalies_of(report) == ["case 03-x: s1: lost"]


def test_a_child_that_did_not_die_at_its_point_is_a_finding_of_why() -> None:
    from crashqueuelab.judges.findings import Kind
    from crashqueuelab.lab.campaign.cases import death_finding

    death = {
        "fault_point": "claim:after",
        "exit_code": 0,
        "points_reached": ["submit:before"],
        "last_words": None,
    }
    never = death_finding(death)
    assert (never.kind, never.point) == (Kind.CRASH_POINT_NOT_REACHED, "claim:after")
    assert never.text.startswith("crash point claim:after was never reached")
    died = {"exit_code": 1, "points_reached": None, "last_words": "claim:before"}
    elsewhere = death_finding({**death, **died, "child_error": "ValueError: x"})
    assert (elsewhere.kind, dict(elsewhere.facts)) == (
        Kind.CHILD_DIED_ELSEWHERE,
        {"exit_code": 1, "last_words": "claim:before"},
    )
    assert elsewhere.text == "exit 1, last words claim:before, it said 'ValueError: x'"
