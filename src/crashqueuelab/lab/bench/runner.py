"""Running the benchmark matrix and computing its figures.

For every (system, workers, handler cost) the runner builds a fresh database holding the
same number of pre-submitted jobs, starts the workers from a fork server (so starting a
worker costs a fork, and no SQLite connection ever crosses it), releases them through one
barrier, and collects each worker's per-job claim-to-ack latencies. Throughput counts jobs
acknowledged per second from the release to the last acknowledgement.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.models import JobState
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.lab.bench import textbook
from crashqueuelab.lab.bench.workers import WAIT_TIMEOUT_S, WorkerReport, WorkerSpec, run_worker
from crashqueuelab.lab.reports import prepare_output_directory, write_json

SYSTEMS = ("textbook", "crashqueuelab-single", "crashqueuelab-batched")
DEFAULT_WORKERS = (1, 2, 4, 8, 16)
DEFAULT_WORK_MS = (0.0, 1.0)
DEFAULT_BATCH = 32
BENCH_FILE = "bench.json"

Progress = Callable[[str], None]


def percentile(values: Sequence[int], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    # The tiny slack keeps 0.99 * 100 at rank 99 whatever the float rounding.
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered) - 1e-9)))
    return float(ordered[rank - 1])


def jain_index(counts: Sequence[int]) -> float:
    """Jain's fairness index: 1.0 when every worker did the same, 1/n when one did all."""
    total = sum(counts)
    squares = sum(count * count for count in counts)
    if squares == 0:
        return 0.0
    return total * total / (len(counts) * squares)


def fsync_rate(directory: Path, *, seconds: float = 1.0) -> dict[str, float]:
    """Appends of 100 bytes each followed by fsync, in ``directory``: the physical limit."""
    path = directory / "fsync-probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    latencies: list[int] = []
    try:
        deadline = time.monotonic() + seconds
        payload = b"x" * 100
        while time.monotonic() < deadline:
            os.write(fd, payload)
            begin = time.monotonic()
            os.fsync(fd)
            latencies.append(int((time.monotonic() - begin) * 1e6))
    finally:
        os.close(fd)
        path.unlink()
    return {
        "fsyncs_per_s": len(latencies) / seconds,
        "p50_us": percentile(latencies, 0.5),
        "p99_us": percentile(latencies, 0.99),
    }


def _prepare_database(system: str, path: Path, jobs: int) -> float:
    """Fill a fresh database with ``jobs`` queued jobs; returns submissions per second."""
    started = time.monotonic()
    if system == "textbook":
        textbook.create(path, jobs)
    else:
        with DurableQueue(path, clock=ManualClock(1), ids=SeededIds(1, path.name)) as queue:
            requests: list[dict[str, Any]] = [
                {"idempotency_key": f"job-{n}", "job_type": "bench", "payload": {"value": n}}
                for n in range(jobs)
            ]
            if system == "crashqueuelab-batched":
                for start in range(0, jobs, 100):
                    queue.submit_many(requests[start : start + 100])
            else:
                for request in requests:
                    queue.submit(**request)
    return jobs / (time.monotonic() - started)


def _verify(system: str, path: Path, jobs: int) -> dict[str, Any]:
    """Every job acknowledged, none claimed twice (for crashqueuelab: one attempt each)."""
    if system == "textbook":
        succeeded = textbook.count_succeeded(path)
        return {"succeeded": succeeded, "claimed_twice": None, "ok": succeeded == jobs}
    with DurableQueue(path, create=False) as queue:
        succeeded = queue.counts()[JobState.SUCCEEDED]
        twice = int(
            queue.connection.execute("SELECT count(*) FROM jobs WHERE attempts > 1").fetchone()[0]
        )
    return {"succeeded": succeeded, "claimed_twice": twice, "ok": succeeded == jobs and twice == 0}


def run_config(
    context: Any, scratch: Path, *, system: str, workers: int, work_ms: float, jobs: int, batch: int
) -> dict[str, Any]:
    """One cell of the matrix."""
    path = scratch / f"{system}-w{workers}-{work_ms:g}ms.sqlite"
    submit_rate = _prepare_database(system, path, jobs)
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    processes = [
        context.Process(
            target=run_worker,
            args=(WorkerSpec(system, str(path), index, work_ms, batch), barrier, results),
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    barrier.wait(timeout=WAIT_TIMEOUT_S)
    released = time.monotonic()
    reports: list[WorkerReport] = [results.get(timeout=WAIT_TIMEOUT_S * 5) for _ in processes]
    for process in processes:
        process.join(timeout=WAIT_TIMEOUT_S)
    exit_codes = [process.exitcode for process in processes]
    finished = max(report.finished for report in reports)
    latencies = [value for report in reports for value in report.latencies_us]
    counts = [report.jobs for report in sorted(reports, key=lambda r: r.worker_index)]
    elapsed = finished - released
    verification = _verify(system, path, jobs)
    for suffix in ("", "-wal", "-shm", "-turns"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return {
        "system": system,
        "workers": workers,
        "work_ms": work_ms,
        "batch": batch if system == "crashqueuelab-batched" else 1,
        "jobs": jobs,
        "jobs_per_s": sum(counts) / elapsed if elapsed > 0 else 0.0,
        "elapsed_s": elapsed,
        "latency_p50_ms": percentile(latencies, 0.5) / 1000,
        "latency_p99_ms": percentile(latencies, 0.99) / 1000,
        "jobs_per_worker_min": min(counts),
        "jobs_per_worker_max": max(counts),
        "fairness_jain": jain_index(counts),
        "submit_per_s": submit_rate,
        "worker_exit_codes": exit_codes,
        "verified": verification,
    }


def _cell(
    cells: list[dict[str, Any]], system: str, workers: int, work_ms: float
) -> dict[str, Any] | None:
    for cell in cells:
        if (cell["system"], cell["workers"], cell["work_ms"]) == (system, workers, work_ms):
            return cell
    return None


def targets(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, as ratios measured in this run (None where a cell is missing)."""

    def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
        if a is None or b is None or not b[key]:
            return None
        return float(a[key]) / float(b[key])

    book1 = _cell(cells, "textbook", 1, 0.0)
    single1 = _cell(cells, "crashqueuelab-single", 1, 0.0)
    batched1 = _cell(cells, "crashqueuelab-batched", 1, 0.0)
    book16 = _cell(cells, "textbook", 16, 1.0)
    result: dict[str, Any] = {
        "single_vs_textbook_1_worker": ratio(single1, book1, "jobs_per_s"),
        "batched_vs_textbook_1_worker": ratio(batched1, book1, "jobs_per_s"),
    }
    for system in ("crashqueuelab-single", "crashqueuelab-batched"):
        ours16 = _cell(cells, system, 16, 1.0)
        ours1 = _cell(cells, system, 1, 1.0)
        result[system] = {
            "throughput_vs_textbook_16_workers_1ms": ratio(ours16, book16, "jobs_per_s"),
            "p99_vs_textbook_16_workers_1ms": ratio(ours16, book16, "latency_p99_ms"),
            "fairness_16_workers_1ms": None if ours16 is None else ours16["fairness_jain"],
            "sixteen_vs_one_worker_1ms": ratio(ours16, ours1, "jobs_per_s"),
        }
    return result


def table(cells: list[dict[str, Any]]) -> str:
    """A Markdown table of every cell."""
    lines = [
        "| system | workers | work ms | jobs/s | p50 ms | p99 ms | per worker min-max | Jain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell['system']} | {cell['workers']} | {cell['work_ms']:g} |"
            f" {cell['jobs_per_s']:,.0f} | {cell['latency_p50_ms']:.2f} |"
            f" {cell['latency_p99_ms']:.2f} |"
            f" {cell['jobs_per_worker_min']}-{cell['jobs_per_worker_max']} |"
            f" {cell['fairness_jain']:.2f} |"
        )
    return "\n".join(lines)


def run_bench(
    output_dir: Path,
    *,
    jobs: int,
    workers: Sequence[int] = DEFAULT_WORKERS,
    work_ms: Sequence[float] = DEFAULT_WORK_MS,
    systems: Sequence[str] = SYSTEMS,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole matrix, the fsync rate of the disk, and ``bench.json``."""
    prepare_output_directory(output_dir)
    scratch = output_dir / "databases"
    scratch.mkdir()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["crashqueuelab.lab.bench.workers"])
    disk = fsync_rate(output_dir)
    cells = []
    for cost in work_ms:
        for count in workers:
            # Systems alternate inside each (cost, workers) pair, so drift hits them alike.
            for system in systems:
                cell = run_config(
                    context,
                    scratch,
                    system=system,
                    workers=count,
                    work_ms=cost,
                    jobs=jobs,
                    batch=batch,
                )
                cells.append(cell)
                if progress is not None:
                    rate = f"{cell['jobs_per_s']:,.0f} jobs/s"
                    progress(f"{system} workers={count} work={cost:g}ms: {rate}")
    scratch.rmdir()
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
        },
        "jobs_per_cell": jobs,
        "batch": batch,
        "disk": disk,
        "cells": cells,
        "targets": targets(cells),
        "ok": all(cell["verified"]["ok"] for cell in cells),
    }
    write_json(output_dir / BENCH_FILE, report)
    return report
