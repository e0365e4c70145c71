"""Chaos with power cuts: every process dies at once and the disk keeps only what was synced."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.lab.runs.modes import POWER_LOSS
from tests.conftest import RunCli
from tests.lab.faults.powerloss.test_mount import needs_fuse


@needs_fuse
def test_sqlite_keeps_every_acknowledgement_across_power_cuts(tmp_path: Path) -> None:
    report = run_chaos(
        tmp_path / "run", seed=3, jobs=400, workers=3, kills=8, pauses=1, lease_ms=300,
        crash_mode=POWER_LOSS, power_cuts=2,
    )  # fmt: skip
    assert report["ok"], report["reasons"]
    assert report["power_cuts_delivered"] == 2
    accounting = report["accounting"]
    assert (accounting["lost"], accounting["acknowledged_twice"]) == (0, 0)
    cuts = [fault for fault in report["faults"] if fault["kind"] == "power cut"]
    assert [cut["crash_state"] for cut in cuts] == ["lose-all", "seed-3002"]
    for cut in cuts:
        assert (tmp_path / "run" / cut["journal"]).is_file()
        assert len(cut["workers_killed"]) == 3
    # The accounting read the last disk, after a clean shutdown.
    assert report["artifacts"]["store_directory"] == "disks/disk-2/tree"


@needs_fuse
@pytest.mark.slow
def test_unsynced_commits_are_acknowledged_twice_after_a_cut(tmp_path: Path) -> None:
    report = run_chaos(
        tmp_path / "run", seed=3, jobs=400, workers=3, kills=0, pauses=0, lease_ms=300,
        crash_mode=POWER_LOSS, power_cuts=2,
        system="crashqueuelab.lab.mutants.catalog:synchronous_normal",
    )  # fmt: skip
    assert not report["ok"]
    accounting = report["accounting"]
    assert accounting["acknowledged_twice"] + accounting["lost"] > 0
    assert report["system"]["durability"].startswith("WAL, synchronous=NORMAL")


def test_power_cuts_need_the_power_loss_mode(tmp_path: Path, run_cli: RunCli) -> None:
    target = tmp_path / "run"
    argv = ["chaos", "--power-cuts", "2", "--output-directory", str(target)]
    outcome = run_cli(*argv)
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["field"] == "power_cuts"
    assert not target.exists()


def test_power_cuts_count_against_the_room_for_faults(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="6 kills, 0 pauses and 3 power cuts need at least"):
        run_chaos(tmp_path / "run", seed=1, jobs=10, workers=1, kills=6, pauses=0,
                  crash_mode=POWER_LOSS, power_cuts=3)  # fmt: skip
    assert not (tmp_path / "run").exists()
