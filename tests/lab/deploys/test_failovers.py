"""Deploy runs that fail the system's PostgreSQL server over (``deploys --failovers``): the
library's own workers across a promotion, a worker that exits by itself started again as
a process manager does, and how long a job submitted after the promotion waits for a
worker (LISTEN/NOTIFY lives in one server's session); what the option refuses; and the
waits computed from a run's executions alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.deploys.plan import DeployPlan, server_fault_times, submissions
from crashqueuelab.lab.deploys.serverfaults import failover_wakeups
from crashqueuelab.lab.runs.executions import Execution
from crashqueuelab.servers.postgres import find_binaries
from tests.conftest import RunCli

needs_postgres = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")


def test_failovers_fall_half_an_interval_after_each_stop_and_jobs_are_submitted_past_them() -> None:
    plan = DeployPlan(workers=2, deploys=0, failovers=2, interval_s=4.0, warmup_s=1.0)
    plan.check()
    assert server_fault_times(plan) == [3.0, 7.0]
    planned = submissions(["a", "b", "c", "d"], [], until_s=9.0)
    assert planned == [(0.0, "a"), (0.0, "b"), (4.5, "c"), (9.0, "d")]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"failovers": -1}, "failovers"),
        ({"promote_after_s": 1.0}, "promote_after_s"),
        ({"failovers": 1, "promote_after_s": -1.0}, "promote_after_s"),
        ({"deploys": 0}, "deploys"),
    ],
)
def test_a_plan_refuses_what_a_failover_cannot_be(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        DeployPlan(**changes).check()
    assert refused.value.field == field


def test_the_waits_are_the_jobs_submitted_one_by_one_before_the_first_failover_and_after_each() -> (
    None
):
    runs = [
        Execution("burst", "w0.0", 0.5, 0.6),
        Execution("early", "w0.0", 1.02, 1.1),
        Execution("after", "w0.0", 9.0, 9.1),
        Execution("after", "w1.0", 9.5, 9.6),
        Execution("late", "w1.0", 20.0, 20.1),
    ]
    submitted = {"burst": 0.0, "early": 1.0, "after": 4.0, "late": 15.0, "lost": 16.0}
    failovers: list[dict[str, Any]] = [
        {"at_s": 2.0, "promoted_at_s": 2.2, "promoted_s": 0.2, "before": {"lag_bytes": 0}},
        {"at_s": 14.0, "promoted_at_s": 14.3, "promoted_s": 0.3},
    ]
    found = failover_wakeups(failovers, submitted, runs, ["early", "after", "late", "lost"])
    before = found["before_the_first"]
    assert (before["jobs"], before["wait_s"]) == (1, {"median": 0.02, "max": 0.02})
    first, second = found["failovers"]
    assert (first["jobs"], first["wait_s"], first["never_started"]) == (
        1,
        {"median": 5.0, "max": 5.0},
        0,
    )
    assert first["first_start_after_promotion_s"] == 6.8
    assert first["lag_before"] == {"lag_bytes": 0}
    assert (second["jobs"], second["never_started"], second["wait_s"]) == (
        2,
        1,
        {"median": 5.0, "max": 5.0},
    )
    assert failover_wakeups([], submitted, runs, ["early"])["failovers"] == []


def test_failovers_need_a_replicated_server_this_run_starts(
    tmp_path: Path, run_cli: RunCli
) -> None:
    refused = run_cli(
        "deploys", "--system", "sqlite", "--failovers", "1",
        "--output-directory", str(tmp_path / "d"),
    )  # fmt: skip
    assert refused.code == 2
    assert refused.result["error"]["field"] == "failovers"
    assert not (tmp_path / "d").exists()


@pytest.mark.server_fault
@needs_postgres
def test_pgq_run_exits_at_each_failover_is_started_again_and_no_job_is_lost(
    tmp_path: Path, run_cli: RunCli
) -> None:
    directory = tmp_path / "d"
    outcome = run_cli(
        "deploys", "--system", "pgqueuer", "--workers", "2", "--deploys", "0",
        "--failovers", "1", "--jobs", "6", "--long-share", "0", "--interval-s", "4",
        "--seed", "3", "--output-directory", str(directory),
    )  # fmt: skip
    record = json.loads((directory / "deploys.json").read_text())
    assert record["error"] is None, record["error"]
    # At its defaults pgq run raises its driver's error and ends; the lab starts it again.
    restarted = record["restarted_after_exit"]
    assert {one["slot"] for one in restarted} == {0, 1}
    assert all("connection" in (one["said"] or "") for one in restarted)
    assert {job["status"] for job in record["jobs"].values()} == {"succeeded"}
    assert not [f for f in record["findings"] if f["kind"] == "lost_in_deploy"]
    # A job whose completion pgqueuer had not yet logged when its worker died runs again:
    # what its reliability guide says of a crashed worker.
    assert record["promises"]["keeps_its_promises"] is True, record["anomalies"]
    (failover,) = record["failovers"]["failovers"]
    assert failover["promoted_at_s"] > failover["at_s"]
    assert outcome.result["failovers"] == record["failovers"]
    page = (directory / "report.html").read_text()
    assert "Failovers of the PostgreSQL server" in page
    assert "--failovers 1" in page
