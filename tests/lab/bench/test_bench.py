"""The benchmark: a smoke run with tiny sizes checks the report's shape, never its speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.bench.figures import jain_index, median_run, percentile
from crashqueuelab.lab.bench.report import reasons, table, targets, versus_peers
from crashqueuelab.lab.bench.runner import run_bench
from tests.conftest import RunCli


def test_percentiles_use_the_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([7], 0.99) == 7
    assert percentile([], 0.5) == 0.0


def test_jains_index_is_one_when_even_and_one_over_n_when_one_does_all() -> None:
    assert jain_index([5, 5, 5, 5]) == 1.0
    assert jain_index([20, 0, 0, 0]) == 0.25
    assert jain_index([0, 0]) == 0.0


def test_a_tiny_bench_reports_every_cell_verified(tmp_path: Path) -> None:
    report = run_bench(tmp_path / "bench", jobs=40, workers=(1, 2), work_ms=(0.0,), batch=8)
    assert report["ok"] is True
    lanes = {
        "textbook", "sqlite-single", "sqlite-chained", "sqlite-batched", "sqlite-batched-chained",
    }  # fmt: skip
    assert {cell["system"] for cell in report["cells"]} == lanes
    assert set(report["systems"]) == lanes
    assert report["systems"]["sqlite-single"]["durability"] == "WAL, synchronous=FULL"
    assert len(report["cells"]) == 2 * len(lanes)
    for cell in report["cells"]:
        assert cell["verified"]["ok"] is True
        assert cell["verified"]["succeeded"] == 40
        assert cell["verified"]["acknowledged"] == 40
        assert 0 <= cell["jobs_per_worker_min"] <= cell["jobs_per_worker_max"] <= 40
        assert 0 < cell["fairness_jain"] <= 1
        assert cell["latency_p99_ms"] >= cell["latency_p50_ms"] > 0
        assert cell["worker_exit_codes"] == [0] * cell["workers"]
    assert report["disk"]["fsyncs_per_s"] > 0
    assert report["targets"]["batched_vs_textbook_1_worker"] > 0
    assert report["targets"]["chained_vs_textbook_1_worker"] > 0
    assert json.loads((tmp_path / "bench" / "bench.json").read_text()) == report
    assert not list((tmp_path / "bench").glob("databases"))
    assert "| textbook | 1 | 0 |" in table(report["cells"])
    batched = [cell for cell in report["cells"] if cell["system"].startswith("sqlite-batched")]
    assert [cell["batch"] for cell in batched] == [8, 8, 8, 8]
    assert all(0 < cell["batch_largest"] <= 8 for cell in batched)


def one_run(rate: float, *, p99: float = 1.0, ok: bool = True) -> dict[str, Any]:
    return {
        "system": "x", "workers": 1, "work_ms": 0.0, "jobs": 10, "jobs_per_s": rate,
        "latency_p50_ms": 0.5, "latency_p99_ms": p99, "fairness_jain": 1.0,
        "jobs_per_worker_min": 10, "jobs_per_worker_max": 10,
        "verified": {"ok": ok, "succeeded": 10, "handed_out_twice": 0 if ok else 2},
    }  # fmt: skip


def test_a_repeated_cell_shows_its_median_run_whole_and_every_run() -> None:
    runs = [one_run(300, p99=3.0), one_run(100, p99=1.0), one_run(200, p99=2.0)]
    cell = median_run(runs)
    # The figures of one real run, never a mix: the median's throughput with its own p99.
    assert (cell["jobs_per_s"], cell["latency_p99_ms"]) == (200, 2.0)
    assert [run["jobs_per_s"] for run in cell["runs"]] == [300, 100, 200]
    assert all(run["verified"] for run in cell["runs"])
    assert cell["verified"]["ok"] is True
    assert median_run(runs[:2])["jobs_per_s"] == 100  # of two, the lower
    assert "(100-300)" in table([cell])
    assert "(" not in table([median_run([one_run(100)])]).splitlines()[-1]


def test_one_refused_run_makes_its_repeated_cell_refused() -> None:
    cell = median_run([one_run(300), one_run(100, ok=False), one_run(200)])
    assert cell["jobs_per_s"] == 200
    assert cell["verified"]["ok"] is False
    assert [run["verified"] for run in cell["runs"]] == [True, False, True]
    assert reasons([cell]) == ["x at 1 workers, 0 ms (run 2 of 3): 2 jobs handed out twice"]


def test_a_failed_run_fails_its_cell_and_a_skipped_cell_stays_skipped() -> None:
    failed = {"system": "x", "workers": 2, "work_ms": 0.0, "failed": "a worker raised"}
    cell = median_run([one_run(100), failed, failed])
    assert (cell["failed"], cell["runs_failed"], cell["runs_total"]) == ("a worker raised", 2, 3)
    assert reasons([cell]) == ["x at 2 workers, 0 ms: a worker raised"]
    skipped = {"system": "x", "workers": 2, "work_ms": 0.0, "skipped": "one owner"}
    assert median_run([skipped, skipped]) == skipped
    with pytest.raises(ValueError, match="at least one run"):
        median_run([])


def test_a_repeated_bench_interleaves_its_rounds(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_bench(
        tmp_path / "bench", jobs=20, workers=(1,), work_ms=(0.0,), batch=8, repeat=2,
        progress=lines.append,
    )  # fmt: skip
    assert report["ok"] is True
    assert report["repeat"] == 2
    for cell in report["cells"]:
        assert len(cell["runs"]) == 2
        assert cell["jobs_per_s"] == min(run["jobs_per_s"] for run in cell["runs"])
    first = [at for at, line in enumerate(lines) if "(run 1 of 2)" in line]
    second = [at for at, line in enumerate(lines) if "(run 2 of 2)" in line]
    assert len(first) == len(second) == len(report["cells"])
    assert max(first) < min(second)  # every lane once, then every lane again
    with pytest.raises(ValueError, match="at least once"):
        run_bench(tmp_path / "never", jobs=20, repeat=0)
    assert not (tmp_path / "never").exists()


def test_the_batched_path_sizes_its_batches_itself_by_default(tmp_path: Path) -> None:
    report = run_bench(tmp_path / "bench", jobs=60, workers=(1,), work_ms=(0.0,))
    assert report["ok"] is True
    assert report["batch"] == "adaptive"
    [cell] = [cell for cell in report["cells"] if cell["system"] == "sqlite-batched"]
    assert cell["batch"] == "adaptive"
    # The first batch is measured (8 jobs); jobs that cost nothing then make the next
    # batch as large as the 52 jobs left allow.
    assert cell["batch_largest"] > 8
    assert cell["batch_mean"] > 8


def test_targets_are_none_where_a_cell_is_missing() -> None:
    result = targets([])
    assert result["single_vs_textbook_1_worker"] is None
    assert result["sqlite-batched"]["fairness_16_workers_1ms"] is None


def test_other_systems_run_beside_the_textbook_queue(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path / "bench",
        jobs=30,
        workers=(1, 2),
        work_ms=(0.0,),
        systems=("walqueue", "persist-queue"),
        batch=4,
    )
    cells = {(cell["system"], cell["workers"]): cell for cell in report["cells"]}
    # persist-queue may hand one job to both of two workers: counted, and the cell fails.
    doubled = cells["persist-queue-single", 2]["verified"]
    assert doubled["handed_out_twice"] == doubled["acknowledged"] - 30
    assert doubled["ok"] is (doubled["handed_out_twice"] == 0)
    assert report["ok"] is doubled["ok"]
    assert set(report["systems"]) == {"textbook", "walqueue-single", "persist-queue-single"}
    assert cells["walqueue-single", 1]["verified"]["succeeded"] == 30
    # One owner: two workers cannot share walqueue's directory; the cell says so.
    assert "single owner" in cells["walqueue-single", 2]["skipped"]
    assert "skipped: walqueue has a single owner" in table(report["cells"])
    assert cells["persist-queue-single", 1]["verified"]["succeeded"] == 30
    assert cells["persist-queue-single", 1]["verified"]["handed_out_twice"] == 0


def test_the_bench_command_prints_targets_and_a_table(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "bench", "--output-directory", str(tmp_path / "b"), "--jobs", "20",
        "--workers", "1", "--work-ms", "0", "--batch", "adaptive",
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK
    assert outcome.result["ok"] is True
    assert "| system | workers |" in outcome.stderr
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["batch"] == "adaptive"


@pytest.mark.parametrize(
    "argv",
    [
        ["--workers", "0"],
        ["--workers", "a,b"],
        ["--work-ms", "-1"],
        ["--work-ms", "x"],
        ["--jobs", "0"],
        ["--batch", "0"],
        ["--batch", "adaptively"],
        ["--repeat", "0"],
    ],
)
def test_bad_bench_arguments_are_usage_errors(
    tmp_path: Path, argv: list[str], run_cli: RunCli
) -> None:
    outcome = run_cli("bench", "--output-directory", str(tmp_path / "b"), *argv)
    assert outcome.code == cli.EXIT_USAGE
    assert not (tmp_path / "b").exists()


def test_the_chaos_command_reports_its_accounting(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "chaos", "--output-directory", str(tmp_path / "c"), "--jobs", "400",
        "--workers", "2", "--kills", "4", "--pauses", "0", "--seed", "5",
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK
    assert outcome.result["ok"] is True
    assert outcome.result["kills_delivered"] == 4
    accounting = outcome.result["accounting"]
    assert isinstance(accounting, dict)
    assert accounting["lost"] == 0


def test_peer_libraries_run_through_their_own_calls_beside_ours(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path / "bench", jobs=30, workers=(1,), work_ms=(0.0,), batch=8,
        peers=("litequeue", "litequeue-full", "huey", "persist-queue"),
    )  # fmt: skip
    assert report["ok"] is True, report["reasons"]
    peers = {"litequeue", "litequeue-full", "huey", "persist-queue"}
    cells = {cell["system"]: cell for cell in report["cells"]}
    assert peers <= set(cells)
    for name in peers:
        assert cells[name]["verified"] == {
            "succeeded": 30, "claimed_twice": None, "ok": True,
            "acknowledged": 30, "handed_out_twice": 0,
        }  # fmt: skip
    # The durability in force is read back from each library's own connection.
    assert "synchronous=NORMAL (its default)" in report["systems"]["litequeue"]["durability"]
    assert (
        "synchronous=FULL (set by the bench)" in report["systems"]["litequeue-full"]["durability"]
    )
    assert report["systems"]["huey"]["version"].startswith("huey ")
    compared = report["targets"]["versus_peers"]
    assert {row["peer"] for row in compared["cells"]} == peers
    row = compared["cells"][0]
    assert row["sqlite-single"] == pytest.approx(
        cells["sqlite-single"]["jobs_per_s"] / cells[row["peer"]]["jobs_per_s"]
    )
    # The page's reproduce command is the run's: its peers, workers and costs included.
    from crashqueuelab.lab.pages.bench import bench_view

    view = bench_view(tmp_path / "bench")
    assert view.verdict.command == (
        "crashqueuelab bench --system sqlite --peer litequeue --peer litequeue-full"
        " --peer huey --peer persist-queue --jobs 30 --workers 1 --work-ms 0 --batch 8"
        f" --output-directory {tmp_path / 'bench'}"
    )
    assert set(compared["ahead_of_every_peer"]) == {
        "sqlite-single", "sqlite-chained", "sqlite-batched", "sqlite-batched-chained",
    }  # fmt: skip


def test_a_cell_that_fails_verification_is_named_in_the_reasons() -> None:
    cells = [
        {"system": "p", "workers": 4, "work_ms": 0.0, "jobs": 10,
         "verified": {"ok": False, "succeeded": 10, "handed_out_twice": 3}},
        {"system": "q", "workers": 1, "work_ms": 1.0, "failed": "a worker's system raised: X"},
        {"system": "r", "workers": 2, "work_ms": 0.0, "jobs": 10,
         "verified": {"ok": False, "succeeded": 8, "claimed_twice": 1, "judge_ok": False}},
        {"system": "s", "workers": 1, "work_ms": 0.0, "jobs": 10, "verified": {"ok": True}},
    ]  # fmt: skip
    assert reasons(cells) == [
        "p at 4 workers, 0 ms: 3 jobs handed out twice",
        "q at 1 workers, 1 ms: a worker's system raised: X",
        "r at 2 workers, 0 ms: 1 jobs claimed twice, 8 of 10 jobs finished, the judge refused"
        " the store",
    ]
    assert versus_peers(cells, ()) == {
        "cells": [],
        "ahead_of_every_peer": {
            "sqlite-single": None,
            "sqlite-chained": None,
            "sqlite-batched": None,
            "sqlite-batched-chained": None,
        },
    }


def test_an_unknown_peer_is_refused_before_anything_is_written(
    tmp_path: Path, run_cli: RunCli
) -> None:
    argv = ["bench", "--peer", "celery", "--output-directory", str(tmp_path / "b")]
    outcome = run_cli(*argv)
    assert outcome.code == cli.EXIT_USAGE
    error = outcome.result["error"]
    assert error["type"] == "InvalidInput"
    assert "'celery' is not one of litequeue" in error["message"]
    assert not (tmp_path / "b").exists()


def test_an_acknowledgement_can_lease_the_next_job_in_the_same_commit(tmp_path: Path) -> None:
    from crashqueuelab.core.clock import ManualClock
    from crashqueuelab.core.ids import SeededIds
    from crashqueuelab.core.retry import RetryPolicy
    from crashqueuelab.systems import resolve_system
    from crashqueuelab.systems.contract import ChainingClient, JobSpec, OpenRequest, Verdict

    clock = ManualClock(1_000)
    request = OpenRequest(tmp_path / "store", clock, SeededIds(3), RetryPolicy())
    client = resolve_system("sqlite").open(request)
    try:
        assert isinstance(client, ChainingClient)
        for n in range(2):
            client.submit(JobSpec(key=f"k{n}", job_type="t", payload={}))
        first = client.claim("w", 100)
        assert first is not None
        verdict, second = client.succeed_and_claim(first, 100)
        assert verdict is Verdict.SUCCEEDED
        assert second is not None
        assert (second.key, second.worker_id) == ("k1", "w")
        clock.advance(200)  # the second lease ran out: its acknowledgement is stale
        assert client.succeed_and_claim(second, 100) == (Verdict.STALE, None)
        client.recover()  # expired: a retry is scheduled
        clock.advance(10**9)
        client.recover()  # and promoted
        third = client.claim("w", 100)
        assert third is not None
        assert client.succeed_and_claim(third, 100) == (Verdict.SUCCEEDED, None)
        for n in range(2, 5):
            client.submit(JobSpec(key=f"k{n}", job_type="t", payload={}))
        batch = client.claim_many("w", 100, 2)
        verdicts, following = client.succeed_many_and_claim(batch, "w", 100, 2)
        assert verdicts == [Verdict.SUCCEEDED, Verdict.SUCCEEDED]
        assert [claim.key for claim in following] == ["k4"]
        clock.advance(200)  # its lease ran out: stale, and nothing left to claim
        assert client.succeed_many_and_claim(following, "w", 100, 2) == ([Verdict.STALE], [])
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["chained", "batched-chained"])
def test_a_chained_lane_on_a_system_that_cannot_chain_fails_its_cell(
    tmp_path: Path, kind: str
) -> None:
    import multiprocessing

    from crashqueuelab.lab.bench.plan import Lane
    from crashqueuelab.lab.bench.runner import run_config
    from crashqueuelab.systems import resolve_system

    system = resolve_system("walqueue")
    assert not system.capabilities.chained
    lane = Lane(f"walqueue-{kind}", kind, "walqueue", False, system.describe())
    context = multiprocessing.get_context("forkserver")
    cell = run_config(context, tmp_path, lane=lane, workers=1, work_ms=0.0, jobs=5, batch=1)
    assert "cannot acknowledge and claim in one commit" in cell["failed"]


def test_a_peer_acknowledgement_the_library_refuses_is_not_counted(tmp_path: Path) -> None:
    import importlib.metadata

    from crashqueuelab.lab.bench.peers import resolve_peer

    peer = resolve_peer("litequeue")
    peer.fill(tmp_path / "s", 1)
    queue = peer.open(tmp_path / "s")
    try:
        item = queue.take()
        assert item is not None
        assert queue.done(item) is True
        # From 0.14 litequeue fences done by the claim id: a second done is stale.
        version = importlib.metadata.version("litequeue")
        fenced = tuple(int(part) for part in version.split(".")[:2]) >= (0, 14)
        assert queue.done(item) is (not fenced)
        assert queue.take() is None
        assert queue.finished(1) == 1
    finally:
        queue.close()


def test_the_textbook_queue_waits_for_the_write_lock_as_long_as_ours(tmp_path: Path) -> None:
    """On a loaded machine a baseline that gave up sooner would fail with "database is
    locked" where DurableQueue merely waits: the comparison would measure the load."""
    from crashqueuelab.core.storage import DEFAULT_BUSY_TIMEOUT_MS
    from crashqueuelab.lab.bench import textbook

    path = tmp_path / "textbook.sqlite"
    textbook.create(path, jobs=2)
    conn = textbook.connect(path)
    try:
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == DEFAULT_BUSY_TIMEOUT_MS
        assert textbook.claim(conn, lease_until=1) == 1
    finally:
        conn.close()
