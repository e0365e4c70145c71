"""PostgreSQL under power loss, for real: each case's server keeps its data directory on the
FUSE disk, and each crash state is started as a server of its own (WAL recovery) and judged.

Run wherever Linux has /dev/fuse and the server binaries exist (``.ci/run`` installs both).
One crash point here; ``docs/postgres.md`` gives the full campaign's command and figures.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.campaign import power_cases as cases_module
from crashqueuelab.lab.campaign.power_cases import run_power_loss_case
from crashqueuelab.lab.faults.powerloss import serverdisk
from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, Choice, CrashState, materialize
from crashqueuelab.lab.faults.powerloss.journal import Journal
from crashqueuelab.lab.faults.powerloss.serverdisk import ClusterTemplate
from crashqueuelab.lab.mutants.asynccommit import async_commit_system
from crashqueuelab.servers.postgres import DSN_VARIABLE
from crashqueuelab.systems.postgres import postgres_system
from tests.conftest import RunCli

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
    reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
)
ASYNC_SPEC = "crashqueuelab.lab.mutants.asynccommit:async_commit_system"


@pytest.fixture(scope="module")
def template(postgres_dsn: str) -> Any:
    with ClusterTemplate() as made:
        yield made


@pytest.mark.slow
@pytest.mark.early
def test_an_acknowledgement_survives_every_crash_state(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "postgres", "--crash-mode", "power-loss", "--seed", "7",
        "--crash-point", "AFTER_SUCCESS_COMMIT", "--dsn", postgres_dsn, "--quiet",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["anomalies"]
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    assert report["crash_points_chosen"] == ["AFTER_SUCCESS_COMMIT"]
    [case] = report["cases"]
    assert case["died_at_fault_point"]
    # The cut found unsynced work (the server's data files: a commit syncs only the WAL).
    assert case["power_cut"]["pending_writes"] > 0
    assert case["power_cut"]["pending_directory_changes"] > 0
    assert case["states_passed"] == len(case["crash_states"]) >= 2
    for state in case["crash_states"]:
        assert state["crash_state"]["signature"]["effect_job"] == ["SUCCEEDED", 1]
        state_dir = tmp_path / "c" / case["artifacts"]["case_directory"] / state["directory"]
        assert "redo" in (state_dir / serverdisk.STATE_SERVER_LOG).read_text()
    case_dir = tmp_path / "c" / case["artifacts"]["case_directory"]
    journal = json.loads((tmp_path / "c" / case["artifacts"]["journal"]).read_text())
    assert journal["data"], "the journal keeps every pending write as evidence"
    assert "database system is ready" in (case_dir / serverdisk.SERVER_LOG).read_text()
    # The environment names the given server again.
    assert os.environ[DSN_VARIABLE] == postgres_dsn


def lose_everything_unsynced(journal: Journal, seed: int) -> list[Choice]:
    return [LOSE_ALL]


def test_asynchronous_commit_loses_an_acknowledgement_and_is_caught(
    template: ClusterTemplate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One crash state (every unsynced write lost) keeps this test short; the campaign above
    # and the documented full run judge them all.
    monkeypatch.setattr(cases_module, "crash_choices", lose_everything_unsynced)
    system = async_commit_system()
    point = next(p for p in system.crash_points if p.name == "AFTER_SUCCESS_COMMIT")
    case = run_power_loss_case(
        tmp_path, 0, point, 7, system=system, spec=ASYNC_SPEC, template=template
    )
    assert not case["passed"]
    [state] = case["crash_states"]
    assert not state["durable_as_promised"]
    assert state["anomalies"][0].startswith("acknowledged work lost: effect_job: promised")
    assert state["crash_state"]["signature"]["effect_job"] != ["SUCCEEDED", 1]


def test_a_crash_state_the_server_cannot_start_on_fails_the_case(
    template: ClusterTemplate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cases_module, "crash_choices", lose_everything_unsynced)

    def without_control_file(root: Path, journal: Journal, choice: Choice, to: Path) -> Any:
        state: CrashState = materialize(root, journal, choice, to)
        (to / "global" / "pg_control").unlink()
        return state

    monkeypatch.setattr(serverdisk, "materialize", without_control_file)
    system = postgres_system()
    point = next(p for p in system.crash_points if p.name == "AFTER_CLAIM_COMMIT")
    case = run_power_loss_case(
        tmp_path, 0, point, 7, system=system, spec="postgres", template=template
    )
    assert not case["passed"]
    [state] = case["crash_states"]
    assert state["anomalies"][0].startswith("the server did not start on the crash state")
    assert "pg_control" in state["anomalies"][0]


def test_an_unknown_crash_point_is_refused_before_anything_is_written(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "sqlite", "--crash-point", "NOWHERE",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["type"] == "InvalidInput"
    assert "NOWHERE: sqlite has no such crash point" in outcome.result["error"]["message"]
    assert not (tmp_path / "c").exists()


def test_a_case_server_that_cannot_mount_leaves_nothing_behind(
    template: ClusterTemplate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashqueuelab.core.errors import CrashModeUnavailable
    from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk

    def refuse(disk: PowerLossDisk) -> None:
        raise CrashModeUnavailable("power-loss", "no mount today")

    monkeypatch.setattr(PowerLossDisk, "start", refuse)
    before = os.environ.get(DSN_VARIABLE)
    target = serverdisk.ServerOnDisk(tmp_path, template)
    with pytest.raises(CrashModeUnavailable, match="no mount today"), target:
        pass
    assert not target.server.root.exists()
    assert os.environ.get(DSN_VARIABLE) == before
