"""The power-loss mount for real: a FUSE file system under SQLite and the campaign.

These run wherever Linux has /dev/fuse (``.ci/run`` installs fuse3, the bindings come with
the powerloss extra); elsewhere they skip, and the command says why with exit code 4.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.core.errors import CrashModeUnavailable
from crashqueuelab.lab.faults.powerloss import disk as disk_module
from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, materialize
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk, unavailable_reason
from crashqueuelab.lab.runs.modes import POWER_LOSS
from tests.conftest import SHOWCASE_SEED, RunCli

needs_fuse = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
    reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
)


def commit_rows(database: Path, synchronous: str, rows: range) -> None:
    connection = sqlite3.connect(database, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA synchronous={synchronous}")
        connection.execute("CREATE TABLE IF NOT EXISTS t(x)")
        for row in rows:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO t VALUES (?)", (row,))
            connection.execute("COMMIT")
        # A child that dies keeps its connection open: no checkpoint on close saves it.
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only dies
            os._exit(0)
        os.waitpid(pid, 0)
    finally:
        connection.close()


def rows_after_the_cut(tmp_path: Path, synchronous: str) -> int:
    with PowerLossDisk(tmp_path / "disk", tmp_path / "mnt") as disk:
        commit_rows(tmp_path / "mnt" / "db.sqlite", "FULL", range(5))
        # Only the last transaction runs at the setting under test; the close above
        # checkpointed the first five into the database file and synced it.
        database = tmp_path / "mnt" / "db.sqlite"
        connection = sqlite3.connect(database, isolation_level=None)
        connection.execute(f"PRAGMA synchronous={synchronous}")
        connection.execute("INSERT INTO t VALUES (5)")
        journal = disk.cut()
        connection.close()  # the mount is gone: this closes a handle on nothing
    state = materialize(tmp_path / "disk", journal, LOSE_ALL, tmp_path / "state")
    reader = sqlite3.connect(state.directory / "db.sqlite")
    try:
        count: int = reader.execute("SELECT count(*) FROM t").fetchone()[0]
    finally:
        reader.close()
    return count


@needs_fuse
def test_sqlite_full_survives_the_cut_and_normal_loses_its_last_commit(tmp_path: Path) -> None:
    assert rows_after_the_cut(tmp_path / "full", "FULL") == 6
    assert rows_after_the_cut(tmp_path / "normal", "NORMAL") == 5


@needs_fuse
def test_a_mount_that_does_not_come_up_in_time_is_stopped_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_module, "MOUNT_TIMEOUT_S", 0.0)
    disk = PowerLossDisk(tmp_path / "disk", tmp_path / "mnt")
    with pytest.raises(CrashModeUnavailable, match="did not come up"):
        disk.start()
    # The file system was killed mid-start; its mount, if any, was detached.
    assert not disk_module._listed_as_mounted(tmp_path / "mnt")


@needs_fuse
def test_relative_paths_work_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with PowerLossDisk(Path("disk"), Path("mnt")) as disk:
        (tmp_path / "mnt" / "file").write_bytes(b"x")
        journal = disk.cut()
    assert [op.path for op in journal.names] == ["/file"]
    assert not disk_module._listed_as_mounted(tmp_path / "mnt")


@pytest.mark.parametrize(
    "command",
    [["campaign", "--crash-mode", "power-loss"], ["disk-faults", "--disk-fault", "eio-fsync"]],
)
def test_a_machine_without_fuse_gets_exit_4_and_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli, command: list[str]
) -> None:
    monkeypatch.setattr(disk_module, "unavailable_reason", lambda: "no /dev/fuse here")
    target = tmp_path / "run"
    outcome = run_cli(*command, "--output-directory", str(target))
    assert outcome.code == cli.EXIT_UNAVAILABLE == 4
    error = outcome.result["error"]
    assert error["type"] == "CrashModeUnavailable"
    assert error["message"] == "crash mode 'power-loss': no /dev/fuse here"
    assert not target.exists()  # nothing was run or written


@pytest.mark.parametrize(
    ("platform", "dev_fuse", "module", "library", "root", "expected"),
    [
        ("darwin", True, True, True, True, "needs Linux FUSE"),
        ("linux", False, True, True, True, "has none"),
        ("linux", True, False, True, True, "install -e '.[powerloss]' (from the checkout's root)"),
        ("linux", True, True, False, True, "apt-get install fuse3"),
        ("linux", True, True, True, False, "needs root or fusermount3"),
    ],
)
def test_each_missing_piece_is_named(
    monkeypatch: pytest.MonkeyPatch,
    platform: str,
    dev_fuse: bool,
    module: bool,
    library: bool,
    root: bool,
    expected: str,
) -> None:
    # The real modules, patched for the one call below.
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(os.path, "exists", lambda path: dev_fuse)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name: None if name == "mfusepy" and not module else find_spec(name),
    )
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "lib" if library else None)
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    reason = unavailable_reason()
    assert reason is not None
    assert expected in reason


@needs_fuse
def test_sqlite_at_full_keeps_every_acknowledged_transition_at_every_point(
    showcase_run: tuple[int, dict[str, object], Path],
) -> None:
    """Read from the session's showcase, whose sqlite power-loss campaign ran every point."""
    _, _, showcase = showcase_run
    run = showcase / "sqlite" / "power-loss-campaign"
    report = json.loads((run / "campaign.json").read_text())
    summary = report["summary"]
    assert report["ok"], report["anomalies"]
    assert report["crash_mode"] == POWER_LOSS
    assert summary["passed"] == summary["named_fault_points"] == 13
    assert summary["crash_states"] == summary["crash_states_passed"] >= 13 * 4
    assert summary["states_losing_acknowledged_work"] == 0
    assert summary["pending_writes_at_cuts"] > 0  # the cuts did take something away
    case = report["cases"][0]
    journal = run / case["artifacts"]["journal"]
    assert json.loads(journal.read_text())["data"]  # the retained evidence of what was lost


@needs_fuse
def test_sqlite_at_normal_loses_acknowledged_work_and_the_lab_names_it(
    showcase_run: tuple[int, dict[str, object], Path],
) -> None:
    """Read from the session's showcase, whose mutant pass ran the synchronous=NORMAL
    mutant through the power-loss campaign."""
    _, _, showcase = showcase_run
    run = (
        showcase
        / "mutants"
        / "synchronous_normal"
        / f"seed-{SHOWCASE_SEED}"
        / "power-loss-campaign"
    )
    result = json.loads((run / "campaign.json").read_text())
    assert not result["ok"]
    assert result["crash_mode"] == "power-loss"
    case = next(c for c in result["cases"] if c["fault_point"] == "AFTER_SUCCESS_COMMIT")
    lose_all = case["crash_states"][0]
    assert lose_all["choice"] == "lose-all"
    assert not lose_all["durable_as_promised"]
    assert lose_all["anomalies"][0].startswith(
        "acknowledged work lost: effect_job: promised ['SUCCEEDED', 1], found"
    )
    assert any("AFTER_SUCCESS_COMMIT" not in line for line in result["anomalies"])
    assert result["summary"]["states_losing_acknowledged_work"] > 0


@needs_fuse
def test_walqueue_passes_and_its_two_sync_mutants_are_caught(
    showcase_run: tuple[int, dict[str, object], Path],
) -> None:
    """Read from the session's showcase, which ran walqueue's power-loss campaign and each
    mutant through the evidence that catches it (for these two, the power-loss campaign)."""
    _, _, showcase = showcase_run
    passed = json.loads(
        (showcase / "walqueue" / "power-loss-campaign" / "campaign.json").read_text()
    )
    assert passed["ok"], passed["anomalies"]
    assert passed["crash_mode"] == POWER_LOSS
    for mutant in ("wal_without_fsync", "current_without_directory_sync"):
        kept = (
            showcase
            / "mutants"
            / mutant
            / f"seed-{SHOWCASE_SEED}"
            / "power-loss-campaign"
            / "campaign.json"
        )
        report = json.loads(kept.read_text())
        assert report["system"]["name"] == f"walqueue-mutant-{mutant.replace('_', '-')}"
        assert not report["ok"]
        assert report["summary"]["states_losing_acknowledged_work"] > 0


@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0, reason="only root may mount for other accounts")
def test_a_shared_mount_lets_another_account_create_files_it_owns() -> None:
    import pwd
    import subprocess
    import tempfile

    nobody = pwd.getpwnam("nobody")
    # Another account must reach the mount point: not under pytest's private directory.
    root = Path(tempfile.mkdtemp(prefix="crashqueuelab-shared-"))
    try:
        root.chmod(0o755)
        mountpoint = root / "mnt"
        with PowerLossDisk(root / "disk", mountpoint, shared=True) as disk:
            os.chown(disk.tree, nobody.pw_uid, nobody.pw_gid)
            subprocess.run(
                ["/bin/sh", "-c", f"echo x > '{mountpoint / 'made'}'"],
                user=nobody.pw_uid,
                group=nobody.pw_gid,
                extra_groups=[],
                check=True,
                timeout=30,
            )
            made = os.stat(disk.tree / "made")
            disk.cut()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert (made.st_uid, made.st_gid) == (nobody.pw_uid, nobody.pw_gid)
