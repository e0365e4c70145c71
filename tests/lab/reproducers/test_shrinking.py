"""From "no" to a reproducer: recorded choices replay the same run, delta debugging finds the
smallest failing one, and the exported pytest file fails on the broken system and passes on
a correct one, importing nothing but the public API."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.pages.chains import observation_chain, seconds_from
from crashqueuelab.lab.reproducers import export
from crashqueuelab.lab.reproducers.campaign import (
    REPRODUCER_DIRECTORY,
    anomaly_kind,
    shrink_if_failed,
)
from crashqueuelab.lab.reproducers.ddmin import shrink
from crashqueuelab.lab.workloads.choices import ChoiceTape
from crashqueuelab.lab.workloads.model import SCHEDULE_FILE, run_model_workload
from crashqueuelab.regression import Outcome, replay_model_workload, run_crash_point, run_probe
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import EXAMPLES, SHRINK_BUDGET_S, RunCli

BROKEN = "broken_adapters:stale_ack_system"
CORRECT = "tiny_adapter:tiny_system"


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def draws(tape: ChoiceTape, blocks: int) -> list[list[int]]:
    for _ in range(blocks):
        tape.next_block()
        tape.random()
        tape.randrange(1000)
        tape.choice("abc")
    return tape.used


def test_a_recorded_tape_replays_the_same_draws_and_an_edited_one_stays_valid() -> None:
    recorded = draws(ChoiceTape(5), 4)
    assert len(recorded) == 5
    assert recorded[0] == []
    assert draws(ChoiceTape(99, recorded), 4) == recorded  # the seed no longer matters
    # A block removed: the others still draw their own values; a block that asks for more
    # than it holds gets zeros, and a tape that ran out gives zeros.
    edited = [recorded[0], recorded[2], [recorded[3][0]]]
    replayed = draws(ChoiceTape(5, edited), 4)
    assert replayed[1] == recorded[2]
    assert replayed[2][0] == recorded[3][0]
    assert replayed[2][1:] == [0, 0]
    assert replayed[3] == [0, 0, 0] == replayed[4]
    assert ChoiceTape(5, [[]]).random() == 0.0


def test_delta_debugging_finds_the_smallest_failing_list() -> None:
    items = list(range(100))
    found = shrink(items, lambda kept: 17 in kept and 42 in kept, seconds=60)
    assert found is not None
    assert (found.items, found.minimal) == ([17, 42], True)
    assert found.runs > 2
    assert shrink(items, lambda kept: False, seconds=60) is None


def test_delta_debugging_stops_at_its_budget_with_a_list_that_still_fails() -> None:
    ticks = iter(range(1000))
    found = shrink(
        list(range(100)), lambda kept: 90 in kept, seconds=3, clock=lambda: float(next(ticks))
    )
    assert found is not None
    assert 90 in found.items
    assert not found.minimal


def test_an_anomaly_kind_leaves_out_the_names_and_numbers_of_its_run() -> None:
    one = "job model-13: an ack by worker-b of lease 5d287f08f43c44fb was accepted (at 5.000001 s)"
    two = "job model-02: an ack by worker-a of lease ab00ff11cc22dd33 was accepted (at 9 s)"
    assert anomaly_kind(one) == anomaly_kind(two) == "job #: an ack by W of lease # was accepted"
    assert anomaly_kind("case 01-x: first reason; second") == "case: first reason"
    assert anomaly_kind("probe p: it failed") != anomaly_kind("probe q: it passed")


def test_a_replayed_schedule_of_the_shipped_queue_makes_the_same_observations(
    tmp_path: Path,
) -> None:
    system = resolve_system("sqlite")
    first = run_model_workload(system, tmp_path / "one", seed=3, steps=60)
    schedule = json.loads((tmp_path / "one" / SCHEDULE_FILE).read_text())
    assert schedule["operations"] == 60
    outcome = replay_model_workload("sqlite", schedule, tmp_path / "two")
    assert outcome.ok
    assert first["ok"]
    logs = [
        (path / "observations.jsonl").read_text() for path in (tmp_path / "one", outcome.directory)
    ]
    assert logs[0] == logs[1]
    assert first["store"]
    assert all(set(job) == {"status", "attempts"} for job in first["store"].values())
    rows = observation_chain(tmp_path / "one" / "observations.jsonl", first["store"])
    assert rows[0]["at"] == "0 s"
    assert rows[-1]["who"] == "store"


def test_seconds_read_as_seconds_from_the_start() -> None:
    assert seconds_from(1_005_000_001, 1_000_000_000) == "5.000001 s"
    assert seconds_from(7, 7) == "0 s"


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The unfenced example queue's campaign, shrunk, with each test run against the correct
    example queue too."""
    target = tmp_path_factory.mktemp("shrunk") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        report = run_campaign(target, seed=3, system=BROKEN)
        shrink_if_failed(target, report, SHRINK_BUDGET_S, correct_system=CORRECT)
    return target, report


def test_each_distinct_failure_gets_a_confirmed_small_reproducer(
    shrunk: tuple[Path, dict[str, Any]],
) -> None:
    target, report = shrunk
    assert not report["ok"]
    records = report["shrink"]["reproducers"]
    assert (
        records
        == json.loads((target / REPRODUCER_DIRECTORY / "reproducers.json").read_text())[
            "reproducers"
        ]
    )
    names = [record["name"] for record in records]
    assert "model workload" in names
    assert any(name.startswith("probe ") for name in names)
    for record in records:
        assert record["shrunk"]
        assert record["reproduced"] == record["confirmations"] == 3
        assert record["test_run"]["failed"] is True, record["test_run"]
        assert record["test_run_on_correct_system"]["failed"] is False
        assert (target / record["test_file"]).is_file()
        for rerun in record["reruns"]:
            assert (target / rerun).is_dir()
    model = next(record for record in records if record["name"] == "model workload")
    assert model["before"]["operations"] == 400
    assert 0 < model["after"]["operations"] <= 12
    assert model["minimal"]
    schedule = json.loads((target / model["schedule"]).read_text())
    assert schedule["operations"] == model["after"]["operations"]
    # Rerun from the exported schedule, it fails the same way once more.
    again = replay_model_workload(BROKEN, schedule, target / "again")
    assert not again.ok
    assert anomaly_kind(model["anomaly"]) in {anomaly_kind(line) for line in again.anomalies}


def test_the_exported_test_imports_only_the_public_api(shrunk: tuple[Path, dict[str, Any]]) -> None:
    target, report = shrunk
    for record in report["shrink"]["reproducers"]:
        tree = ast.parse((target / record["test_file"]).read_text())
        imported = {
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert imported == {"os", "pathlib", "pytest", "crashqueuelab.regression"}, imported


def test_the_page_leads_with_the_reproducers_and_the_chain_of_events(
    shrunk: tuple[Path, dict[str, Any]],
) -> None:
    from crashqueuelab.lab.pages.render import write_report

    target, _ = shrunk
    page = write_report(target).read_text()
    assert page.index("Smallest failing runs") < page.index("Why it failed")
    assert "failed 3 of 3" in page
    assert "fails as exported" in page
    assert "the independent reader finds model-" in page
    assert "claimed model-" in page


@pytest.mark.slow
def test_a_retained_campaign_is_shrunk_by_the_shrink_command_once(
    tmp_path: Path, run_cli: RunCli
) -> None:
    target = tmp_path / "run"
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:losing_system", "--seed", "3", "--quiet",
        "--shrink-seconds", "0", "--output-directory", str(target),
    )  # fmt: skip
    assert outcome.code == 1
    assert outcome.result["reproducers"] == []
    assert not (target / REPRODUCER_DIRECTORY).exists()
    outcome = run_cli("shrink", str(target), "--shrink-seconds", str(SHRINK_BUDGET_S))
    assert outcome.code == 1, outcome.result
    assert outcome.result["reproducers"]
    assert all("fails as exported" in line for line in outcome.result["reproducers"])
    kept = json.loads((target / "campaign.json").read_text())
    assert kept["shrink"]["reproducers"]
    before = sorted(path.relative_to(target) for path in target.rglob("*"))
    outcome = run_cli("shrink", str(target))
    assert outcome.code == 2
    assert "shrunk already" in outcome.result["error"]["message"]
    assert sorted(path.relative_to(target) for path in target.rglob("*")) == before


def test_shrink_refuses_what_is_not_a_campaign_and_passes_an_ok_one(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli("shrink", str(tmp_path))
    assert outcome.code == 2
    assert "holds neither campaign.json nor chaos.json" in outcome.result["error"]["message"]
    (tmp_path / "campaign.json").write_text(json.dumps({"ok": True}))
    outcome = run_cli("shrink", str(tmp_path))
    assert (outcome.code, outcome.result["detail"]) == (0, "the run is ok: nothing to shrink")
    outcome = run_cli("shrink", str(tmp_path), "--shrink-seconds", "-1")
    assert outcome.code == 2


def test_the_public_reruns(tmp_path: Path) -> None:
    failing = run_probe(BROKEN, "stale_holder_after_expiry", tmp_path / "probe")
    assert not failing.ok
    assert "it must be refused" in failing.explain()
    assert run_probe(CORRECT, "stale_holder_after_expiry", tmp_path / "fine").ok
    point = resolve_system("sqlite").crash_points[0].name
    outcome = run_crash_point("sqlite", point, seed=1, directory=tmp_path / "case")
    assert outcome.ok
    assert "no anomaly" in outcome.explain()
    with pytest.raises(InvalidInput):
        run_probe("sqlite", "no_such_probe", tmp_path / "nope")
    assert Outcome(False, ["a", "b"], tmp_path).explain().endswith("- a\n- b")


def test_an_exported_test_under_a_relative_directory_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The documented commands name relative output directories: pytest, started in the
    # test's own directory, was given the relative path again and ran nothing.
    export.write_test(tmp_path / "r", "test_x", "def test_x() -> None:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    run = export.run_test(Path("r") / "test_x.py", import_path=None)
    assert (run["outcome"], run["failed"]) == ("passed", False), run["detail"]


def test_an_exported_test_runs_with_no_plugin_but_pytests_own(tmp_path: Path) -> None:
    # This suite's environment has xdist, hypothesis and the lab's own plugin installed:
    # the exported file is shown to need none of them.
    body = (
        "def test_x(pytestconfig) -> None:\n"
        "    names = {'xdist', 'hypothesispytest', 'crashqueuelab', 'pytest_cov'}\n"
        "    assert not [n for n in names if pytestconfig.pluginmanager.has_plugin(n)]\n"
    )
    path = export.write_test(tmp_path, "test_x", body)
    run = export.run_test(path, import_path=None)
    assert (run["outcome"], run["failed"]) == ("passed", False), run["detail"]
    assert "plugins:" not in (tmp_path / run["output"]).read_text()


def test_an_exported_test_that_cannot_run_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = export.write_test(tmp_path, "test_x", "def test_x() -> None:\n    pass\n")
    assert export.run_test(path, import_path=None)["failed"] is False
    (tmp_path / "test_x.py").write_text("import nowhere_to_be_found\n")
    broken = export.run_test(path, import_path=str(tmp_path), system="sqlite")
    assert broken["failed"] is None
    assert broken["detail"].startswith("pytest exited")

    def too_slow(*args: Any, **kwargs: Any) -> None:
        raise subprocess.TimeoutExpired("pytest", 1)

    monkeypatch.setattr(subprocess, "run", too_slow)
    assert "ran past" in export.run_test(path, import_path=None)["detail"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    not_run = export.run_test(path, import_path=None)
    assert not_run["detail"] == "not run: pytest is not installed"
    assert export.said(not_run) == "not run: pytest is not installed"
    assert export.function_name("model workload", "an acknowledgement " * 20).startswith(
        "test_model_workload_an_acknowledgement"
    )
    assert len(export.function_name("word " * 40)) <= 72
