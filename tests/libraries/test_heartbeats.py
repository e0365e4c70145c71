"""The heartbeat experiment: the library's own worker loop runs long jobs, no worker harmed,
and every job must run once. pgqueuer's QueueManager on the session's PostgreSQL server
(installed release, and pgqueuer #430's releases in environments of their own); the
ledger and the judge alone; a loop that fails, and a system that has none.
"""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.environments import CACHE_VARIABLE
from crashqueuelab.lab.heartbeats import Execution, judge, read_ledger
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.contract import JobStatus, LibraryWorker, System


def run(argv: list[str]) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, stdout=out, stderr=err)
    return code, json.loads(out.getvalue()), err.getvalue()


def _refusing_loop(
    directory: Path, worker_id: str, work: Callable[[str], None], stop: threading.Event
) -> None:
    raise RuntimeError(f"{worker_id} cannot reach its broker")


def failing_loop_system() -> System:
    """The shipped SQLite queue with a library loop that fails at once."""
    return dataclasses.replace(
        resolve_system("sqlite"),
        library_worker=LibraryWorker(0.1, _refusing_loop, "a loop that fails at once"),
    )


def test_a_ledger_closes_each_start_with_the_next_end_of_its_key_and_skips_torn_lines() -> None:
    text = (
        "start a 1.000000\nstart b 1.500000\nend a 3.000000\nstart a 3.200000\n"
        "end b 4.000000\nnonsense\nend a x\nstart c"
    )
    assert read_ledger(text, "w") == [
        Execution("a", "w", 1.0, 3.0),
        Execution("b", "w", 1.5, 4.0),
        Execution("a", "w", 3.2, None),
    ]


def test_a_job_run_again_beside_or_after_its_first_execution_is_an_anomaly() -> None:
    runs = [
        Execution("a", "w0", 1.0, 5.0),
        Execution("a", "w1", 3.0, 7.0),  # beside the first
        Execution("b", "w0", 1.0, 2.0),
        Execution("b", "w1", 2.5, None),  # after the first, still running at the end
        Execution("c", "w0", 1.0, 2.0),
    ]
    done = dict.fromkeys("abc", JobStatus.SUCCEEDED)
    anomalies = judge(["a", "b", "c"], runs, done, origin=1.0)
    assert anomalies == [
        "job a: run again beside a live worker's execution: by w0 from 0.00 s to 4.00 s,"
        " then by w1 from 2.00 s to 6.00 s; no worker was killed, stopped or cut off",
        "job b: run again after a live worker's execution: by w0 from 0.00 s to 1.00 s,"
        " then by w1 from 1.50 s still running; no worker was killed, stopped or cut off",
    ]


def test_a_job_never_run_or_not_held_done_by_the_store_is_an_anomaly() -> None:
    runs = [Execution("a", "w0", 0.0, 1.0)]
    stored = {"a": JobStatus.LEASED}
    assert judge(["a", "b"], runs, stored, origin=0.0) == [
        "job a: the store holds it leased after every execution ended",
        "job b: never run, while every worker was alive and polling",
        "job b: the store holds it nowhere after every execution ended",
    ]
    assert judge(["a"], runs, None, origin=0.0) == []


def test_a_system_without_its_librarys_worker_loop_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    target = tmp_path / "never"
    code, result, _ = run(["heartbeats", "--system", "sqlite", "--output-directory", str(target)])
    assert code == 2
    assert result["error"]["type"] == "SystemUnavailable"
    assert "own worker loop" in result["error"]["message"]
    assert not target.exists()


def test_a_library_loop_that_fails_is_a_failed_run_never_a_verdict_on_promises(
    tmp_path: Path,
) -> None:
    code, result, _ = run(
        [
            "heartbeats",
            "--system",
            "tests.libraries.test_heartbeats:failing_loop_system",
            "--jobs",
            "2",
            "--output-directory",
            str(tmp_path / "h"),
        ]
    )
    assert code == 1
    assert result["ok"] is False
    assert result["promises"] is None
    assert result["reasons"][0] == (
        "WorkerFailed: worker-0: RuntimeError: worker-0 cannot reach its broker;"
        " worker-1: RuntimeError: worker-1 cannot reach its broker"
    )
    record = json.loads((tmp_path / "h" / "heartbeats.json").read_text())
    assert record["executions"] == []
    assert {job["runs"] for job in record["jobs"].values()} == {0}
    assert (tmp_path / "h" / "report.html").is_file()


def test_pgqueuers_installed_release_keeps_every_live_workers_job(
    tmp_path: Path, postgres_dsn: str
) -> None:
    code, result, err = run(
        [
            "heartbeats",
            "--system",
            "pgqueuer",
            "--dsn",
            postgres_dsn,
            "--jobs",
            "3",
            "--work-timers",
            "3",
            "--output-directory",
            str(tmp_path / "h"),
        ]
    )
    assert code == 0, err
    assert {job["runs"] for job in result["jobs"].values()} == {1}
    assert {job["stored"] for job in result["jobs"].values()} == {"succeeded"}
    assert result["promises"]["keeps_its_promises"] is True
    page = (tmp_path / "h" / "report.html").read_text()
    assert "QueueManager.run" in page
    assert "job-02" in page


@pytest.mark.releases
def test_heartbeats_too_slow_for_the_retry_timer_rerun_live_jobs_on_0_21_0_not_on_0_24_0(
    tmp_path: Path, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgqueuer #430: 0.21.0 flushes heartbeats once per retry timer, so a live worker's
    job looks dead and runs again beside it; 0.24.0 flushes four times as often."""
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "environments"))
    code, result, err = run(
        [
            "versions",
            "--system",
            "pgqueuer",
            "--releases",
            "0.21.0,0.24.0",
            "--bisect",
            "--output-directory",
            str(tmp_path / "m"),
            "heartbeats",
            "--dsn",
            postgres_dsn,
            "--jobs",
            "3",
        ]
    )
    assert code == 0, err
    assert result["bisection"]["found"] == "0.24.0"
    old, fixed = (
        json.loads((tmp_path / "m" / release / "heartbeats.json").read_text())
        for release in ("0.21.0", "0.24.0")
    )
    assert old["system"]["version"] == "pgqueuer 0.21.0"
    assert any(job["runs"] > 1 for job in old["jobs"].values())
    # Against pgqueuer's own promise (its retry timer takes only jobs gone silent): a bug.
    assert old["promises"]["keeps_its_promises"] is False
    assert "run again beside a live worker's execution" in old["promises"]["broken_promises"][0]
    assert fixed["system"]["version"] == "pgqueuer 0.24.0"
    assert {job["runs"] for job in fixed["jobs"].values()} == {1}
    assert fixed["promises"]["keeps_its_promises"] is True
