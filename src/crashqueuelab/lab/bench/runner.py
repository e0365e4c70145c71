"""Running the benchmark matrix: every cell of the plan, and ``bench.json``.

For every (lane, workers, handler cost) the runner builds a fresh store holding the same
number of pre-submitted jobs, starts the workers from a fork server (so starting a worker
costs a fork, and no connection ever crosses it), releases them through one barrier, and
collects each worker's per-job claim-to-ack latencies. Throughput counts jobs acknowledged
per second from the release to the last acknowledgement. Each cell's store is then verified
by its system's own reader.

With ``repeat`` above one, every cell runs that many times, the rounds interleaved (every
lane once, then every lane again), and the cell reports its median run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import queue
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.lab.bench import textbook
from crashqueuelab.lab.bench.figures import fsync_rate, jain_index, median_run, percentile
from crashqueuelab.lab.bench.peers import resolve_peer
from crashqueuelab.lab.bench.plan import (
    DEFAULT_BATCH,
    DEFAULT_REPEAT,
    DEFAULT_WORK_MS,
    DEFAULT_WORKERS,
    PEER,
    TEXTBOOK,
    Lane,
    lanes_for,
)
from crashqueuelab.lab.bench.report import BENCH_FILE, reasons, targets, versus_peers
from crashqueuelab.lab.bench.workers import (
    WAIT_TIMEOUT_S,
    WorkerReport,
    WorkerSpec,
    open_client,
    run_worker,
)
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import Interrupted, forkserver_context, start_owned
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.systemcalls import SystemRaised, calling
from crashqueuelab.systems.contract import JobSpec, JobStatus
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system

#: How long a failed cell waits for its workers' own account of what went wrong.
REPORT_GRACE_S = 5.0


def _prepare_store(lane: Lane, store: Path, jobs: int) -> float:
    """Fill a fresh store with ``jobs`` pending jobs; returns submissions per second."""
    started = time.monotonic()
    if lane.path_kind == TEXTBOOK:
        textbook.create(store, jobs)
        return jobs / (time.monotonic() - started)
    if lane.path_kind == PEER:
        resolve_peer(lane.system).fill(store, jobs)
        return jobs / (time.monotonic() - started)
    specs = [JobSpec(key=f"job-{n}", job_type="bench", payload={"value": n}) for n in range(jobs)]
    with calling(lane.system, "open"):
        client = open_client(lane.system, str(store))
    try:
        if lane.path_kind.startswith("batched"):
            with calling(lane.system, "submit_many"):
                for start in range(0, jobs, 100):
                    client.submit_many(specs[start : start + 100])
        else:
            with calling(lane.system, "submit"):
                for spec in specs:
                    client.submit(spec)
    finally:
        client.close()
    return jobs / (time.monotonic() - started)


def _verify(lane: Lane, store: Path, jobs: int) -> dict[str, Any]:
    """Every job acknowledged, none claimed twice (for a system: one attempt each)."""
    if lane.path_kind == TEXTBOOK:
        succeeded = textbook.count_succeeded(store)
        return {"succeeded": succeeded, "claimed_twice": None, "ok": succeeded == jobs}
    if lane.path_kind == PEER:
        finished = resolve_peer(lane.system).finished(store, jobs)
        return {"succeeded": finished, "claimed_twice": None, "ok": finished == jobs}
    reading = read_store(resolve_system(lane.system), store, [f"job-{n}" for n in range(jobs)])
    found = reading.jobs.values()
    succeeded = sum(1 for job in found if job.status is JobStatus.SUCCEEDED)
    twice = sum(1 for job in found if job.attempts > 1)
    return {
        "succeeded": succeeded,
        "claimed_twice": twice,
        "judge_ok": reading.ok,
        "ok": succeeded == jobs and twice == 0 and reading.ok,
    }


def _remove_store(store: Path) -> None:
    if store.is_dir():
        shutil.rmtree(store)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store}{suffix}").unlink(missing_ok=True)


def _stop_workers(processes: list[Any], store: Path) -> None:
    """Kill a cell's workers (those that were started) and remove its store."""
    for process in processes:
        if process.pid is not None:
            process.kill()
            process.join(timeout=WAIT_TIMEOUT_S)
    _remove_store(store)


def run_config(
    context: Any,
    scratch: Path,
    *,
    lane: Lane,
    workers: int,
    work_ms: float,
    jobs: int,
    batch: int | None,
) -> dict[str, Any]:
    """One cell of the matrix."""
    cell: dict[str, Any] = {"system": lane.name, "workers": workers, "work_ms": work_ms}
    if lane.single_owner and workers > 1:
        return cell | {"skipped": f"{lane.description['name']} has a single owner: one worker"}
    store = scratch / f"{lane.name}-w{workers}-{work_ms:g}ms"
    try:
        submit_rate = _prepare_store(lane, store, jobs)
    except SystemRaised as raised:
        _remove_store(store)
        return cell | {"failed": raised.reason}
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    inherited = Inherited.capture()
    processes = [
        context.Process(
            target=run_worker,
            args=(
                WorkerSpec(
                    lane.path_kind, lane.system, str(store), index, work_ms, batch, inherited
                ),
                barrier,
                results,
            ),
        )
        for index in range(workers)
    ]
    try:
        for process in processes:
            start_owned(process)
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        released = time.monotonic()
        reports: list[WorkerReport] = [results.get(timeout=WAIT_TIMEOUT_S * 5) for _ in processes]
    except (threading.BrokenBarrierError, queue.Empty):
        # A worker died (its system raised) or hung: this cell failed; the run goes on.
        errors = []
        with contextlib.suppress(queue.Empty):
            for _ in processes:
                report = results.get(timeout=REPORT_GRACE_S)
                errors += [report.error] if report.error is not None else []
        _stop_workers(processes, store)
        codes = [process.exitcode for process in processes]
        if errors:
            return cell | {"failed": f"a worker's system raised: {errors[0]}"}
        return cell | {"failed": f"workers did not start or finish (exit codes {codes})"}
    except Interrupted:
        _stop_workers(processes, store)
        raise
    for process in processes:
        process.join(timeout=WAIT_TIMEOUT_S)
    exit_codes = [process.exitcode for process in processes]
    errors = [report.error for report in reports if report.error is not None]
    if errors:
        _remove_store(store)
        return cell | {"failed": f"a worker's system raised: {errors[0]}"}
    finished = max(report.finished for report in reports)
    latencies = [value for report in reports for value in report.latencies_us]
    counts = [report.jobs for report in sorted(reports, key=lambda r: r.worker_index)]
    elapsed = finished - released
    verification = _verify(lane, store, jobs)
    # What the workers were told: an acknowledgement of a job another worker also
    # acknowledged is a job handed out twice, whatever the store's attempt counter says.
    acknowledged = sum(counts)
    verification["acknowledged"] = acknowledged
    verification["handed_out_twice"] = max(0, acknowledged - jobs)
    verification["ok"] = verification["ok"] and acknowledged == jobs
    _remove_store(store)
    batches = sum(report.batches for report in reports)
    if lane.path_kind.startswith("batched"):
        sizes = {
            "batch": "adaptive" if batch is None else batch,
            "batch_mean": acknowledged / batches if batches else 0.0,
            "batch_largest": max(report.largest_batch for report in reports),
        }
    else:
        sizes = {"batch": 1}
    return (
        cell
        | sizes
        | {
            "jobs": jobs,
            # Jobs finished per second; repeated acknowledgements of one job do not count.
            "jobs_per_s": min(acknowledged, jobs) / elapsed if elapsed > 0 else 0.0,
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
    )


def run_bench(
    output_dir: Path,
    *,
    jobs: int,
    workers: Sequence[int] = DEFAULT_WORKERS,
    work_ms: Sequence[float] = DEFAULT_WORK_MS,
    systems: Sequence[str] = (DEFAULT_SYSTEM,),
    batch: int | None = DEFAULT_BATCH,
    progress: Progress | None = None,
    peers: Sequence[str] = (),
    repeat: int = DEFAULT_REPEAT,
) -> dict[str, Any]:
    """The whole matrix, the fsync rate of the disk, and ``bench.json``."""
    if repeat < 1:
        raise ValueError(f"every cell runs at least once, not {repeat} times")
    # An unknown system or peer is refused before anything is written.
    for spec in systems:
        resolve_system(spec)
    for name in peers:
        resolve_peer(name)
    prepare_output_directory(output_dir)
    progress = labelled(progress, "bench")
    scratch = output_dir / "databases"
    scratch.mkdir()
    lanes = lanes_for(systems, peers, scratch)
    adapters = {
        resolve_system(lane.system).open.__module__
        for lane in lanes
        if lane.system and lane.path_kind != PEER
    }
    # "__main__" first: the children then need not re-run the main script one by one.
    context = forkserver_context(["__main__", "crashqueuelab.lab.bench.workers", *sorted(adapters)])
    disk = fsync_rate(output_dir)
    cells: list[dict[str, Any]] = []
    try:
        for cost in work_ms:
            for count in workers:
                runs: dict[str, list[dict[str, Any]]] = {lane.name: [] for lane in lanes}
                # Systems alternate inside each (cost, workers) pair, and so do the rounds, so
                # drift hits them alike.
                for round_number in range(1, repeat + 1):
                    for lane in lanes:
                        run = run_config(
                            context,
                            scratch,
                            lane=lane,
                            workers=count,
                            work_ms=cost,
                            jobs=jobs,
                            batch=batch,
                        )
                        runs[lane.name].append(run)
                        if progress is not None:
                            rate = (
                                f"{run['jobs_per_s']:,.0f} jobs/s"
                                if "jobs_per_s" in run
                                else run.get("skipped") or run.get("failed")
                            )
                            which = f" (run {round_number} of {repeat})" if repeat > 1 else ""
                            progress(f"{lane.name} workers={count} work={cost:g}ms{which}: {rate}")
                cells += [median_run(runs[lane.name]) for lane in lanes]
    except Interrupted as interruption:
        interruption.partial["cells_done"] = len(cells)
        interruption.partial["cells"] = cells
        raise
    scratch.rmdir()
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
        },
        "systems": {lane.name: lane.description for lane in lanes},
        "system_specs": list(systems),
        "peers": list(peers),
        "jobs_per_cell": jobs,
        "repeat": repeat,
        "batch": "adaptive" if batch is None else batch,
        "disk": disk,
        "cells": cells,
        "targets": targets(cells) | {"versus_peers": versus_peers(cells, peers)},
        "reasons": reasons(cells),
    }
    report["ok"] = not report["reasons"]
    write_json(output_dir / BENCH_FILE, report)
    return report
