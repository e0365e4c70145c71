"""persist-queue under the lab: its crash points, its probes and a chaos run, as measured.

persist-queue comes with the ``peers`` extra, which the gates install: these tests run.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.systems import JobSpec, OpenRequest, resolve_system
from crashqueuelab.systems.libraries.persistqueue.client import PersistQueueClient


def test_every_crash_point_passes_and_the_probes_name_what_persist_queue_lacks(
    tmp_path: Path,
) -> None:
    report = run_campaign(tmp_path / "c", seed=5, system="persist-queue")
    summary = report["summary"]
    assert (summary["passed"], summary["failed"]) == (10, 0)
    assert report["system"]["version"].startswith("persist-queue ")
    verdicts = {probe["name"]: probe for probe in report["probes"]}
    # No lease expiry: an abandoned task comes back only when a process reopens the queue.
    assert verdicts["stale_holder_after_expiry"]["ok"] is False
    assert "the queue offered nothing" in verdicts["stale_holder_after_expiry"]["detail"]
    # No deadline: an acknowledgement at (or long after) it is accepted.
    assert verdicts["acknowledgement_at_the_deadline"]["ok"] is False
    assert verdicts["idempotent_submit"]["ok"] is True
    assert verdicts["attempts_run_out"]["ok"] is True
    assert verdicts["retry_delay_is_capped"]["ok"] is True
    # The same missing expiry: a task whose holder died is neither retried nor dead.
    assert "yet it is unack (leased)" in verdicts["expired_attempts_run_out"]["detail"]
    failed = {name for name, probe in verdicts.items() if probe["status"] == "failed"}
    assert failed == {
        "stale_holder_after_expiry",
        "acknowledgement_at_the_deadline",
        "expired_attempts_run_out",
        "batched_acknowledgement_fences_each_item",
    }
    assert {name for name, probe in verdicts.items() if not probe["ran"]} == {
        "worker_id_reused_after_restart",
        "heartbeat_after_expiry",
        "heartbeat_survives_restart",
        "batched_acknowledgement_sees_the_lease_as_it_stands",
        "self_reports_match_what_holders_were_told",
        "chained_acknowledgement_is_fenced",
        "carried_calls_are_judged_against_the_store",
    }
    assert report["ok"] is False


@pytest.mark.slow
def test_chaos_counts_the_jobs_that_two_workers_both_acknowledged(tmp_path: Path) -> None:
    report = run_chaos(
        tmp_path / "h", seed=7, jobs=400, workers=4, kills=20, pauses=0, lease_ms=300,
        system="persist-queue",
    )  # fmt: skip
    accounting = report["accounting"]
    assert accounting["lost"] == 0
    assert accounting["succeeded"] == 400
    assert accounting["duplicated_effects"] == 0  # the idempotent ledger absorbs them...
    assert accounting["executions"] > 400  # ...but the work ran again
    # A task whose handler kills its worker is handed out again at every reopen, with no
    # attempt limit: the poison jobs that die are never dead-lettered, and the reader sees
    # their attempts pass the limit. Nothing else in the file is wrong.
    poison = accounting["poison"]["anomalies"]
    assert any("never dead-lettered" in line for line in poison)
    assert all(line.startswith("job poison-") for line in accounting["judge_problems"])
    # Every respawned worker reopens the queue, and auto_resume hands the live workers'
    # tasks out again; the two holders' acknowledgements are both accepted.
    assert accounting["acknowledged_twice"] >= 1
    doubled = [line for line in report["anomalies"] if "acknowledged" in line]
    assert len(doubled) == accounting["acknowledged_twice"]  # every one listed, none capped
    assert report["ok"] is False
    # The page spells out the first anomalies with their evidence and counts the rest.
    from crashqueuelab.lab.pages.chaos import EXPLAINED_ANOMALIES
    from crashqueuelab.lab.pages.render import write_report

    html = write_report(tmp_path / "h").read_text()
    more = len(report["anomalies"]) - EXPLAINED_ANOMALIES
    assert more > 0, "the run should list more anomalies than the page spells out"
    assert f"And {more:,} more anomal" in html
    assert "chaos.json lists every one." in html


def test_the_queue_file_is_wal_with_full_synchronous(tmp_path: Path) -> None:
    request = OpenRequest(tmp_path, ManualClock(0), SeededIds(0, "t"), RetryPolicy())
    client = PersistQueueClient(request)
    try:
        client.submit(JobSpec(key="k", job_type="t", payload={}))
    finally:
        client.close()
    conn = sqlite3.connect(tmp_path / "data.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        conn.close()
    reading = resolve_system("persist-queue").reader
    assert reading is not None
    assert reading(tmp_path).jobs["k"].native_state == "inited"
