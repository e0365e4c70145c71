"""The verdict: one short line on stderr that says what was proven (the details it leaves
out counted, and where they are), the exit code that goes with it, and a versions run
whose verdict follows its releases rather than its bisection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.cli.verdict import LINE_LIMIT, verdict_line
from tests.conftest import EXAMPLES, RunCli
from tests.lab.versions.test_matrix import _power_loss_campaign

REASON = (
    "case 01-enqueue-after: keep-names-1-2-5-8: acknowledged work lost: effect_job: promised"
    " ['queued', 0], found None (recovered to {'effect': 'done', 'flaky': 'done'})"
)
HINT = "power-loss mode needs the FUSE bindings: pip install 'crashqueuelab[powerloss]'"


def _counted(line: str, *paths: str) -> int:
    """The line's length without the paths it names."""
    return len(line) - sum(len(path) for path in paths if path in line)


def test_a_failing_campaign_with_many_long_reasons_gets_one_short_line(tmp_path: Path) -> None:
    record, page = tmp_path / "c" / "campaign.json", str(tmp_path / "c" / "report.html")
    result = {"ok": False, "reasons": [REASON] * 176, "report": page}
    line = verdict_line(result, record=record)
    assert line is not None
    assert "\n" not in line
    assert _counted(line, str(record), page) <= LINE_LIMIT
    assert line.startswith("crashqueuelab: not ok: case 01-enqueue-after: keep-names-1-2-5-8")
    assert line.endswith(f"... (in full, with 175 more, in {record}); report: {page}")
    short = [f"probe probe_{number}: the queue offered nothing" for number in range(12)]
    line = verdict_line({"ok": False, "reasons": short, "report": page}, record=record)
    assert line is not None
    assert _counted(line, str(record), page) <= LINE_LIMIT
    assert line.startswith(f"crashqueuelab: not ok: {short[0]}; {short[1]}; {short[2]}")
    assert line.endswith(f" (and 9 more in {record}); report: {page}")


def test_a_reason_too_long_for_the_line_is_cut_and_says_where_it_is_whole() -> None:
    pip = "ERROR: Could not find a version that satisfies the requirement huey==9.9.9\n" * 20
    line = verdict_line({"ok": False, "error": {"message": pip}}, experiment=False)
    assert line is not None
    assert "\n" not in line
    assert len(line) - len("the JSON on stdout") <= LINE_LIMIT
    assert line.startswith("crashqueuelab: not ok: ERROR: Could not find a version")
    assert line.endswith("... (in full in the JSON on stdout)")
    two = verdict_line({"ok": False, "reasons": [pip, "another"]}, record=Path("r.json"))
    assert two is not None
    assert two.endswith("... (in full, with 1 more, in r.json)")


def test_evidence_not_run_for_one_reason_says_the_reason_once() -> None:
    result = {
        "ok": False,
        "passed_what_ran": True,
        "headline": f"not run: power-loss campaigns (sqlite, walqueue) and 4 of 21 mutants: {HINT}",
        "not_run": [f"sqlite: the power-loss campaign ({HINT})"] * 2,
    }
    line = verdict_line(result)
    assert line == f"crashqueuelab: passed what ran: {result['headline']}"
    assert line.count(HINT) == 1
    mutants = {"ok": False, "passed_what_ran": True, "not_run": [{"mutant": "m", "reason": "r"}]}
    assert verdict_line(mutants) == "crashqueuelab: passed what ran: not run: m: r"


def test_a_passing_database_command_has_no_verdict_line_and_an_experiment_has_one() -> None:
    assert verdict_line({"ok": True}, experiment=False) is None
    assert verdict_line({"ok": True, "report": "p"}) == "crashqueuelab: passed; report: p"
    interrupted = {"ok": False, "interrupted": True, "reasons": ["interrupted by SIGINT"]}
    assert verdict_line(interrupted) == "crashqueuelab: interrupted: interrupted by SIGINT"
    assert verdict_line({"ok": False}) == "crashqueuelab: not ok: not ok"


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """The versions command over a stand-in for each pinned release's run: it writes the
    release's campaign record where the real run would."""
    from crashqueuelab.cli import versions

    records: dict[str, dict[str, Any]] = {}

    def run_pinned(
        pin: Any, argv: list[str], err: Any, prefix: str = "", extra: Any = None
    ) -> tuple[int, dict[str, Any]]:
        directory = Path(argv[argv.index("--output-directory") + 1])
        directory.mkdir(parents=True)
        err.write(f"{prefix}campaign {pin.version}: done\n")
        record = records[pin.version]
        (directory / "campaign.json").write_text(json.dumps(record))
        return (0 if record["ok"] else 1), record

    monkeypatch.setattr(versions, "run_pinned", run_pinned)
    return records


def _versions(run_cli: RunCli, directory: Path, *bisect: str) -> Any:
    return run_cli(
        "versions", "--system", "huey", "--releases", "3.2.0,3.2.1,3.3.0", *bisect,
        "--output-directory", str(directory), "campaign", "--crash-mode", "power-loss",
        "--crash-point", "enqueue:after",
    )  # fmt: skip


def test_releases_side_by_side_give_the_same_matrix_and_say_whose_each_line_is(
    tmp_path: Path, run_cli: RunCli, releases: dict[str, dict[str, Any]]
) -> None:
    releases |= {release: _power_loss_campaign(release) for release in ("3.2.0", "3.2.1", "3.3.0")}
    one = _versions(run_cli, tmp_path / "one")
    both = _versions(run_cli, tmp_path / "both", "--at-once", "2")
    assert both.code == one.code == 1
    assert both.result["rows"] == one.result["rows"]
    assert both.result["headline"] == one.result["headline"]
    assert json.loads((tmp_path / "both" / "versions.json").read_text())["at_once"] == 2
    said = both.stderr.splitlines()
    assert {f"[{r}] campaign {r}: done" for r in ("3.2.0", "3.2.1", "3.3.0")} <= set(said)
    assert "campaign 3.2.0: done" in one.stderr.splitlines()
    # The page's command runs the same releases again, side by side as this run did, and a
    # library's row gives its own promises before the lab's contract.
    page = (tmp_path / "both" / "report.html").read_text()
    assert "--releases 3.2.0,3.2.1,3.3.0 --at-once 2 --output-directory" in page
    assert "--at-once" not in (tmp_path / "one" / "report.html").read_text()
    assert page.index("against its own promises</th>") < page.index("lab's contract</th>")


def test_a_bisection_over_releases_that_lose_work_is_not_ok_and_says_what_they_did(
    tmp_path: Path, run_cli: RunCli, releases: dict[str, dict[str, Any]]
) -> None:
    releases |= {release: _power_loss_campaign(release) for release in ("3.2.0", "3.2.1", "3.3.0")}
    outcome = _versions(run_cli, tmp_path / "v", "--bisect", "--bisect-on", "cases")
    headline = (
        "huey 3.2.0 and 3.2.1 lose acknowledged work at a power cut (35 of 35 crash states each);"
        " 3.3.0 is the first release that passes every crash case"
    )
    assert outcome.code == cli.EXIT_REJECTED
    assert (outcome.result["ok"], outcome.result["passed_what_ran"]) == (False, False)
    assert outcome.result["headline"] == headline
    assert outcome.result["bisection"]["found"] == "3.3.0"
    last = outcome.stderr.rstrip().splitlines()[-1]
    kept_at, page_at = tmp_path / "v" / "versions.json", tmp_path / "v" / "report.html"
    # Each failing release's first reason is in the record.
    assert last == f"crashqueuelab: not ok: {headline} (and 2 more in {kept_at}); report: {page_at}"
    kept = json.loads((tmp_path / "v" / "versions.json").read_text())
    assert (kept["ok"], kept["headline"]) == (False, headline)
    page = (tmp_path / "v" / "report.html").read_text()
    assert '<div class="verdict failed" id="verdict" data-ok="false"' in page
    assert f"FAILED</span>: {headline}" in page
    assert "Passed" not in page


def test_a_versions_run_that_passed_what_ran_exits_5_and_one_that_passed_all_exits_0(
    tmp_path: Path, run_cli: RunCli, releases: dict[str, dict[str, Any]]
) -> None:
    passing = {"ok": True, "anomalies": [], "summary": {"failed": 0}, "system": {}}
    releases |= dict.fromkeys(("3.2.0", "3.2.1", "3.3.0"), passing)
    bisected = _versions(run_cli, tmp_path / "b", "--bisect")
    assert bisected.code == cli.EXIT_PASSED_WHAT_RAN
    assert (bisected.result["ok"], bisected.result["passed_what_ran"]) == (False, True)
    assert bisected.result["not_run"] == ["3.2.1"]
    assert (
        bisected.stderr.rstrip()
        .splitlines()[-1]
        .startswith(
            "crashqueuelab: passed what ran: huey 3.2.0 and 3.3.0 pass; no change between them"
        )
    )
    page = (tmp_path / "b" / "report.html").read_text()
    assert 'class="verdict incomplete" id="verdict" data-ok="false"' in page
    assert "3.2.1: the bisection did not need it" in page
    matrix = _versions(run_cli, tmp_path / "m")
    assert (matrix.code, matrix.result["ok"]) == (cli.EXIT_OK, True)
    assert (
        matrix.stderr.rstrip()
        .splitlines()[-1]
        .startswith("crashqueuelab: passed: huey 3.2.0, 3.2.1 and 3.3.0 pass; report: ")
    )


def test_a_real_failing_campaign_ends_with_a_short_line_pointing_at_its_record(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    directory = tmp_path / "c"
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:losing_system", "--seed", "3", "--quiet",
        "--shrink-seconds", "0", "--output-directory", directory,
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    lines = outcome.stderr.rstrip().splitlines()
    record, page = str(directory / "campaign.json"), str(directory / "report.html")
    assert lines[-1].startswith("crashqueuelab: not ok: case ")
    assert lines[-1].endswith(f"; report: {page}")
    assert _counted(lines[-1], record, page) <= LINE_LIMIT
    reasons = outcome.result["reasons"]
    if len(reasons) > 1:
        assert f" more in {record})" in lines[-1] or f" more, in {record})" in lines[-1]
