"""A power-loss campaign counts distinct crash states: choices that make a state already
judged are skipped and named, and a cut with nothing unsynced is one state, said so."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.campaign.power_cases import STATES_DIRECTORY, judge_state
from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, Choice, DistinctStates
from crashqueuelab.lab.faults.powerloss.journal import GRAVEYARD, TREE, Journal
from crashqueuelab.lab.faults.powerloss.targets import DISK_DIRECTORY, StoreOnDisk
from crashqueuelab.lab.pages.render import REPORT_FILE
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import RunCli

needs_fuse = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
    reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
)


def test_a_state_with_the_bytes_of_one_judged_before_is_not_judged_or_kept(
    tmp_path: Path,
) -> None:
    """Nothing is read, recovered or kept for it: its case lists it as skipped instead."""
    case_dir = tmp_path / "case"
    (case_dir / DISK_DIRECTORY / TREE / "walqueue").mkdir(parents=True)
    (case_dir / DISK_DIRECTORY / TREE / "walqueue" / "wal-00000000000000000001.log").touch()
    (case_dir / DISK_DIRECTORY / GRAVEYARD).mkdir()
    journal = Journal()
    distinct = DistinctStates(journal)
    assert distinct.new_bytes(LOSE_ALL, case_dir / DISK_DIRECTORY / TREE)
    system = resolve_system("walqueue")
    judged = judge_state(
        case_dir, StoreOnDisk(case_dir), journal, Choice(frozenset(), None),
        system=system, point=system.crash_points[0], jobs=(), seed=1, case_id="case",
        distinct=distinct,
    )  # fmt: skip
    assert judged is None
    assert list((case_dir / STATES_DIRECTORY).iterdir()) == []
    assert [same.by for same in distinct.skipped] == ["bytes"]


@needs_fuse
def test_walqueue_cuts_count_each_crash_state_once(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "campaign", "--system", "walqueue", "--crash-mode", "power-loss", "--seed", "20260827",
        "--crash-point", "snapshot:before_write", "--crash-point", "snapshot:after_rename",
        "--quiet", "--output-directory", tmp_path / "run",
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result
    report = json.loads((tmp_path / "run" / "campaign.json").read_text())
    cases = {case["fault_point"]: case for case in report["cases"]}
    nothing, renamed = cases["snapshot:before_write"], cases["snapshot:after_rename"]
    # Nothing was pending at the cut: one crash state, and no choice to make at all.
    assert nothing["power_cut"]["nothing_unsynced"] is True
    assert (nothing["power_cut"]["crash_states"], nothing["duplicate_crash_states"]) == (1, [])
    assert [state["choice"] for state in nothing["crash_states"]] == ["lose-all"]
    # Two pending directory changes (the snapshot's create and its rename): keeping the rename
    # keeps the create, so three states, and every other choice names the one it equals.
    assert renamed["power_cut"]["nothing_unsynced"] is False
    judged = [state["choice"] for state in renamed["crash_states"]]
    assert judged == ["lose-all", "keep-names-1", "keep-names-1-2"]
    fates = [json.dumps(state["fate"], sort_keys=True) for state in renamed["crash_states"]]
    assert len(set(fates)) == len(fates) == renamed["power_cut"]["crash_states"] == 3
    skipped = renamed["duplicate_crash_states"]
    assert skipped[0] == {"choice": "keep-names-2", "same_as": "keep-names-1-2", "by": "fate"}
    assert len(skipped) == renamed["power_cut"]["duplicates_skipped"] == 4
    assert {same["same_as"] for same in skipped} <= set(judged)
    assert not any((tmp_path / "run" / renamed["artifacts"]["crash_states"] / s["choice"]).exists()
                   for s in skipped)  # fmt: skip
    summary = report["summary"]
    assert (summary["crash_states"], summary["crash_states_passed"]) == (4, 4)
    assert summary["duplicate_crash_states_skipped"] == 4
    assert summary["cases_with_nothing_unsynced"] == 1
    page = (tmp_path / "run" / REPORT_FILE).read_text()
    assert "nothing unsynced at the cut: 1 crash state" in page
    assert "4 of 4 distinct crash states" in page
    assert "4 more choices made a state already judged" in page
    assert "<code>keep-names-2</code> = <code>keep-names-1-2</code>" in page
    # A report kept from before states were told apart still gets its page, and claims
    # nothing about distinct states it never counted.
    for key in ("duplicate_crash_states_skipped", "cases_with_nothing_unsynced"):
        del report["summary"][key]
    for case in report["cases"]:
        del case["duplicate_crash_states"], case["power_cut"]["nothing_unsynced"]
    (tmp_path / "run" / "campaign.json").write_text(json.dumps(report))
    assert run_cli("report", tmp_path / "run").code == cli.EXIT_OK
    page = (tmp_path / "run" / REPORT_FILE).read_text()
    assert "4 of 4 crash states" in page
    assert "distinct" not in page.split("<h2>Crash points</h2>")[0]
    assert "nothing unsynced at the cut" not in page


@needs_fuse
def test_a_bound_on_crash_states_judges_lose_all_first_and_names_every_choice_it_left(
    tmp_path: Path, run_cli: RunCli
) -> None:
    """``--crash-states 2``: of the snapshot rename's seven choices, ``lose-all`` and the state
    that keeps every pending name are judged; of the five others, those with the fates of a
    state judged are duplicates, and the one left is named in the case, counted in the
    summary, said in ``not_run`` (the run is not complete) and on the page, and a rerun
    keeps the bound. Outside the power-loss mode the option is refused, nothing written."""
    run = tmp_path / "run"
    outcome = run_cli(
        "campaign", "--system", "walqueue", "--crash-mode", "power-loss", "--seed", "20260827",
        "--crash-point", "snapshot:after_rename", "--crash-states", "2", "--quiet",
        "--output-directory", run,
    )  # fmt: skip
    report = json.loads((run / "campaign.json").read_text())
    [case] = report["cases"]
    assert [state["choice"] for state in case["crash_states"]] == ["lose-all", "keep-names-1-2"]
    assert case["power_cut"]["states_bound"] == report["crash_states_per_case"] == 2
    # Of the other five, four make a state already judged (they are duplicates, as without
    # a bound); only keep-names-1 would be a state of its own, not known.
    assert case["power_cut"]["choices_unstarted"] == ["keep-names-1"]
    assert len(case["duplicate_crash_states"]) == case["power_cut"]["choices"] - 3 == 4
    assert report["summary"]["crash_state_choices_unstarted"] == 1
    assert report["passed_what_ran"] is True
    assert (report["ok"], report["complete"]) == (False, False)
    assert report["not_run"] == [
        "crash states: 1 of 7 choices not judged, in 1 of 1 cases (at most 2 states per case;"
        " each case's power_cut.choices_unstarted names its own)"
    ]
    assert outcome.code == cli.EXIT_PASSED_WHAT_RAN, outcome.result
    page = (run / REPORT_FILE).read_text()
    assert "2 of 2 (1 not judged)" in page
    assert "crash-state choices not judged" in page
    assert "<code>keep-names-1</code>" in page.split("Not judged (at most 2")[1]
    assert "--crash-mode power-loss --crash-states 2 --system walqueue" in page
    refused = run_cli(
        "campaign", "--system", "walqueue", "--crash-states", "2",
        "--output-directory", tmp_path / "process",
    )  # fmt: skip
    assert refused.code == cli.EXIT_USAGE
    assert refused.result["error"]["field"] == "crash_states"
    assert not (tmp_path / "process").exists()


def test_a_system_on_rabbitmq_gets_a_power_loss_campaign_only_with_what_it_declares() -> None:
    """A case settles the node with what the system declares on its broker before the power
    comes on; a system that declares nothing (Celery on RabbitMQ) is refused, and chaos never
    puts a node's data directory on its disk."""
    import dataclasses

    from crashqueuelab.lab.faults.crashmodes import power_loss_refusal

    on_rabbitmq = dataclasses.replace(resolve_system("sqlite"), broker="rabbitmq", server="redis")
    refused = power_loss_refusal(on_rabbitmq)
    assert refused is not None
    assert "declares nothing the lab can settle" in refused
    declaring = dataclasses.replace(on_rabbitmq, declare_broker=lambda directory, url: None)
    assert power_loss_refusal(declaring) is None
    chaos = power_loss_refusal(declaring, "chaos")
    assert chaos is not None
    assert "chaos's power-loss disk does not hold" in chaos
