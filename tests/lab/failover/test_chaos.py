"""Failovers as a chaos fault: the run starts a primary and a streaming standby, kills the
primary while the standby lags and promotes it; the workers reconnect to it, and every
transition they were told was committed is judged on the promoted standby."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab.servers.postgres import find_binaries
from tests.conftest import RunCli


@pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")
def test_chaos_fails_the_server_over_and_every_acknowledged_job_is_on_the_promoted_standby(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "chaos"
    run = run_cli(
        "chaos", "--system", "postgres", "--jobs", "150", "--workers", "2", "--kills", "2",
        "--failovers", "1", "--seed", "7", "--quiet", "--output-directory", out,
    )  # fmt: skip
    assert run.code == 0, run.result
    assert run.result["failovers_delivered"] == 1
    report = json.loads((out / "chaos.json").read_text())
    assert report["parameters"]["failovers"] == 1
    delivered = [fault for fault in report["faults"] if fault["kind"] == "failover"]
    assert len(delivered) == 1
    measured = delivered[0]["failover"]
    # The primary died while the standby lagged, and the standby was promoted.
    assert measured["before"]["lag_bytes"] is not None
    assert measured["promoted_s"] > 0
    assert report["accounting"]["lost"] == 0
    assert report["accounting"]["succeeded"] == 150
    page = (out / "report.html").read_text()
    assert "1 failovers" in page
    assert "--replay" in page


def test_failovers_need_a_replicated_server_the_run_starts(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "refused"
    run = run_cli(
        "chaos", "--system", "sqlite", "--jobs", "50", "--kills", "1", "--failovers", "1",
        "--output-directory", out,
    )  # fmt: skip
    assert run.code == 2, run.result
    assert run.result["error"]["field"] == "failovers"
    assert not out.exists()


@pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")
def test_chaos_holds_commits_open_while_the_workers_lose_them_and_every_answer_holds(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "held"
    run = run_cli(
        "chaos", "--system", "postgres", "--jobs", "150", "--workers", "2", "--kills", "0",
        "--pauses", "0", "--held-commits", "2", "--seed", "7", "--quiet",
        "--output-directory", out,
    )  # fmt: skip
    assert run.code == 0, run.result
    assert run.result["held_commits_delivered"] == 2
    report = json.loads((out / "chaos.json").read_text())
    assert report["parameters"]["held_commits"] == 2
    held = [fault["held_commits"] for fault in report["faults"] if "held_commits" in fault]
    assert len(held) == 2
    # COMMITs waited for the standby when the workers' connections were reset.
    assert sum(one["commits_waiting_at_the_reset"] for one in held) > 0
    assert report["accounting"]["lost"] == 0
    assert report["accounting"]["succeeded"] == 150
    assert "commits held open" in (out / "report.html").read_text()


def test_held_commits_need_a_replicated_server_the_run_starts(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "refused"
    run = run_cli(
        "chaos", "--system", "sqlite", "--jobs", "50", "--kills", "1", "--held-commits", "1",
        "--output-directory", out,
    )  # fmt: skip
    assert run.code == 2, run.result
    assert run.result["error"]["field"] == "held_commits"
    assert not out.exists()
