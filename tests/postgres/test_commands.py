"""The lab's commands on the PostgreSQL system, each against a real server: a throwaway one
the command starts and removes, or the session's given with --dsn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest

from crashqueuelab import cli
from crashqueuelab.servers import postgres as server_module
from crashqueuelab.servers.postgres import DSN_VARIABLE
from tests.conftest import RunCli


def test_the_campaign_passes_every_crash_point_on_a_server_it_starts(
    tmp_path: Path, run_cli: RunCli
) -> None:
    before = os.environ.get(DSN_VARIABLE)
    outcome = run_cli(
        "campaign", "--system", "postgres", "--seed", "7", "--quiet",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["anomalies"]
    summary = outcome.result["summary"]
    # 13 crash points, 7 where a transition's COMMIT answer is lost first, 7 where the COMMIT
    # is still waiting for a held standby then (on a primary and standby of their own), and 6
    # where the server crashes and gives the transaction's id to another session first.
    assert (summary["passed"], summary["failed"], summary["probes_failed"]) == (33, 0, 0)
    assert summary["model_workload_ok"]
    # The run's server is gone, and the environment is as it was.
    assert os.environ.get(DSN_VARIABLE) == before
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    case = report["cases"][0]
    assert "own SQL" in case["crash_state"]["store"]["judge"]


def test_a_given_server_is_used_and_left_running(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "demo", "--system", "postgres", "--dsn", postgres_dsn, "--seed", "3",
        "--output-directory", str(tmp_path / "d"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result
    assert os.environ[DSN_VARIABLE] == postgres_dsn
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.slow
def test_chaos_with_server_restarts_and_terminated_sessions_loses_nothing(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    outcome = run_cli(
        "chaos", "--system", "postgres", "--seed", "7", "--jobs", "600", "--workers", "4",
        "--kills", "40", "--pauses", "2", "--server-restarts", "1", "--session-kills", "3",
        "--lease-ms", "300", "--quiet", "--output-directory", str(tmp_path / "x"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["reasons"]
    assert (
        outcome.result["server_restarts_delivered"],
        outcome.result["session_kills_delivered"],
    ) == (1, 3)
    accounting = outcome.result["accounting"]
    assert (accounting["succeeded"], accounting["lost"], accounting["duplicated_effects"]) == (
        600,
        0,
        0,
    )
    assert accounting["judge_ok"]
    report = json.loads((tmp_path / "x" / "chaos.json").read_text())
    restart = next(f for f in report["faults"] if f["kind"] == "server restart")
    assert restart["back_after_s"] > 0
    page = (tmp_path / "x" / "report.html").read_text()
    assert "server crashed (pg_ctl stop -m immediate)" in page


@pytest.mark.slow
def test_chaos_with_deploys_replaced_after_exit_loses_nothing_on_a_server_it_starts(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", "--system", "postgres", "--seed", "4", "--jobs", "200", "--workers", "3",
        "--kills", "5", "--pauses", "0", "--deploys", "3", "--grace-s", "1", "--surge", "2",
        "--replace", "after-exit", "--lease-ms", "300", "--quiet",
        "--output-directory", str(tmp_path / "x"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["reasons"]
    assert outcome.result["deploys_delivered"] == 3
    accounting = outcome.result["accounting"]
    assert (accounting["lost"], accounting["acknowledged_twice"]) == (0, 0)
    deployed = outcome.result["deploys"]
    assert deployed["workers_stopped"] == 6
    assert deployed["exited_within_grace"] + deployed["sigkilled"] == 6
    report = json.loads((tmp_path / "x" / "chaos.json").read_text())
    started = {worker["worker_id"]: worker for worker in report["workers_started"]}
    for fault in (f for f in report["faults"] if f["kind"] == "deploy"):
        for worker in fault["workers"]:
            # After its exit: the slot's next worker started once the old one was gone.
            slot, generation = worker["worker_id"].removeprefix("worker-").split(".")
            after = started[f"worker-{slot}.{int(generation) + 1}"]
            gone = worker.get("exited_at_s", worker.get("killed_at_s"))
            assert after["started_at_s"] >= gone


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--system", "postgres", "--server-restarts", "1"], "server_restarts"),
        (["--system", "sqlite", "--session-kills", "1"], "session_kills"),
    ],
)
def test_faults_the_run_cannot_deliver_are_refused_up_front(
    postgres_dsn: str, tmp_path: Path, extra: list[str], field: str, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", *extra, "--dsn", postgres_dsn, "--jobs", "100", "--kills", "0",
        "--pauses", "0", "--output-directory", str(tmp_path / "x"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["field"] == field


# A failover campaign starts a primary and a standby per case: the same binaries.
@pytest.mark.parametrize("extra", [(), ("--crash-mode", "failover")])
def test_no_server_binaries_is_said_plainly_with_exit_4(
    extra: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    monkeypatch.setattr(server_module, "DEBIAN_BINARIES", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(server_module.BIN_VARIABLE, raising=False)
    outcome = run_cli(
        "campaign", "--system", "postgres", *extra, "--output-directory", str(tmp_path / "c")
    )
    assert outcome.code == cli.EXIT_UNAVAILABLE
    assert outcome.result["error"]["type"] == "ServerUnavailable"
    assert "no PostgreSQL server binaries" in outcome.result["error"]["reason"]
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_the_bench_runs_postgres_beside_sqlite(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "bench", "--system", "sqlite", "--system", "postgres", "--dsn", postgres_dsn,
        "--jobs", "120", "--workers", "1,2", "--work-ms", "0", "--quiet",
        "--output-directory", str(tmp_path / "b"),
    )  # fmt: skip
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert outcome.code == cli.EXIT_OK, report
    lanes = {(cell["system"], cell["workers"]) for cell in report["cells"]}
    assert {("postgres-single", 2), ("postgres-batched", 2)} <= lanes
    assert report["systems"]["postgres-single"]["durability"].startswith("synchronous_commit=on")


def test_a_power_cut_is_refused_where_the_data_is_not_on_the_disk(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    # Chaos's power-loss disk holds the store directory; the server's data lives elsewhere,
    # so a cut would lose nothing: a pass would prove nothing. (The campaign puts the data
    # directory on the disk: tests/postgres/test_power_loss.py.)
    outcome = run_cli(
        "chaos", "--crash-mode", "power-loss", "--power-cuts", "1", "--kills", "0",
        "--pauses", "0", "--system", "postgres", "--dsn", postgres_dsn,
        "--output-directory", str(tmp_path / "x"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_UNAVAILABLE
    assert outcome.result["error"]["type"] == "CrashModeUnavailable"
    assert "server's data directory" in outcome.result["error"]["message"]
    assert not (tmp_path / "x").exists()
