"""Running the benchmark matrix and computing its figures.

The lanes are the textbook queue (the baseline) and, for every system under test, its
single-job path and (where the system batches) its batched path. For every (lane, workers,
handler cost) the runner builds a fresh store holding the same number of pre-submitted
jobs, starts the workers from a fork server (so starting a worker costs a fork, and no
connection ever crosses it), releases them through one barrier, and collects each worker's
per-job claim-to-ack latencies. Throughput counts jobs acknowledged per second from the
release to the last acknowledgement. A system with a single owner runs with one worker only.

With ``repeat`` above one, every cell runs that many times, the rounds interleaved (every
lane once, then every lane again), and the cell reports its median run whole (throughput,
latencies and fairness of that one run) with every run's figures beside it: one slow
moment of a shared disk then moves a spread, not a ratio.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import queue
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.lab.bench import textbook
from crashqueuelab.lab.bench.peers import resolve_peer
from crashqueuelab.lab.bench.workers import (
    WAIT_TIMEOUT_S,
    WorkerReport,
    WorkerSpec,
    open_client,
    run_worker,
)
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import Interrupted, forkserver_context
from crashqueuelab.lab.runs.kinds import BENCH
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.systemcalls import SystemRaised, calling
from crashqueuelab.systems.contract import JobSpec, JobStatus
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system

TEXTBOOK = "textbook"
PEER = "peer"
TEXTBOOK_DESCRIPTION = {
    "name": TEXTBOOK,
    "version": "crashqueuelab.lab.bench.textbook",
    "durability": "WAL, synchronous=FULL; no history, no attempts, no fencing",
}
DEFAULT_WORKERS = (1, 2, 4, 8, 16)
DEFAULT_WORK_MS = (0.0, 1.0)
#: None: each worker of the batched path sizes its own batches (lab/workloads/batching.py).
DEFAULT_BATCH: int | None = None
BENCH_FILE = BENCH.record
#: Runs of each cell: one by default.
DEFAULT_REPEAT = 1
#: How long a failed cell waits for its workers' own account of what went wrong.
REPORT_GRACE_S = 5.0
#: The default system's lanes, which the targets compare with the textbook queue.
SINGLE = f"{DEFAULT_SYSTEM}-single"
CHAINED = f"{DEFAULT_SYSTEM}-chained"
BATCHED = f"{DEFAULT_SYSTEM}-batched"
BATCHED_CHAINED = f"{DEFAULT_SYSTEM}-batched-chained"
#: The default system's lanes, in the order the targets list them.
PATHS = (SINGLE, CHAINED, BATCHED, BATCHED_CHAINED)


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


@dataclass(frozen=True)
class Lane:
    """One column of the matrix: the textbook queue, or one path of one system."""

    name: str
    path_kind: str
    system: str
    single_owner: bool
    description: dict[str, Any]


def lanes_for(
    systems: Sequence[str], peers: Sequence[str] = (), scratch: Path | None = None
) -> list[Lane]:
    """The textbook baseline, then each system's single-job path and its batched path, then
    each peer library (described from a store opened in ``scratch``)."""
    lanes = [Lane(TEXTBOOK, TEXTBOOK, "", False, TEXTBOOK_DESCRIPTION)]
    for spec in systems:
        system = resolve_system(spec)
        kinds = (
            "single",
            *(["chained"] if system.capabilities.chained else []),
            *(["batched"] if system.capabilities.batching else []),
            *(
                ["batched-chained"]
                if system.capabilities.batching and system.capabilities.chained
                else []
            ),
        )
        lanes += [
            Lane(
                f"{system.name}-{kind}",
                kind,
                spec,
                system.capabilities.single_owner,
                system.describe(),
            )
            for kind in kinds
        ]
    for name in peers:
        peer = resolve_peer(name)
        where = Path(tempfile.mkdtemp(dir=scratch))
        try:
            description = peer.describe(where)
        finally:
            shutil.rmtree(where)
        lanes.append(Lane(name, PEER, name, False, description))
    return lanes


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
            process.start()
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


def _run_figures(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "jobs_per_s": run["jobs_per_s"],
        "latency_p99_ms": run["latency_p99_ms"],
        "fairness_jain": run["fairness_jain"],
        "verified": run["verified"]["ok"],
    }


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One cell from its repeated runs: the run of median throughput (the lower of the two
    middle ones for an even count), whole, with every run's figures under ``runs``.

    A cell fails if any run failed and is skipped if its runs were. Its verification is
    that of the first run refused, if any was: a job handed out twice in one run of three
    makes the cell not ok, whatever the median run shows.
    """
    if not runs:
        raise ValueError("a cell needs at least one run")
    if "skipped" in runs[0]:
        return dict(runs[0])
    failed = [run for run in runs if "failed" in run]
    if failed:
        return dict(failed[0]) | {"runs_failed": len(failed), "runs_total": len(runs)}
    ordered = sorted(runs, key=lambda run: run["jobs_per_s"])
    cell = dict(ordered[(len(ordered) - 1) // 2])
    refused = [number for number, run in enumerate(runs, 1) if not run["verified"]["ok"]]
    if refused:
        cell["verified"] = runs[refused[0] - 1]["verified"] | {"run": refused[0]}
    return cell | {"runs": [_run_figures(run) for run in runs]}


def _cell(
    cells: list[dict[str, Any]], system: str, workers: int, work_ms: float
) -> dict[str, Any] | None:
    for cell in cells:
        key = (cell["system"], cell["workers"], cell["work_ms"])
        if key == (system, workers, work_ms) and "jobs_per_s" in cell:
            return cell
    return None


def versus_peers(cells: list[dict[str, Any]], peers: Sequence[str]) -> dict[str, Any]:
    """The default system's paths against each peer library, cell by cell (jobs/s ratios of
    this run), and whether each path was ahead of every peer in every cell both ran."""
    comparisons = []
    for peer in peers:
        for cell in cells:
            if cell["system"] != peer or "jobs_per_s" not in cell or not cell["jobs_per_s"]:
                continue
            row: dict[str, Any] = {
                "peer": peer,
                "workers": cell["workers"],
                "work_ms": cell["work_ms"],
            }
            for lane in PATHS:
                ours = _cell(cells, lane, cell["workers"], cell["work_ms"])
                row[lane] = None if ours is None else ours["jobs_per_s"] / cell["jobs_per_s"]
            comparisons.append(row)
    ahead = {
        lane: (
            all(row[lane] is not None and row[lane] > 1.0 for row in comparisons)
            if comparisons
            else None
        )
        for lane in PATHS
    }
    return {"cells": comparisons, "ahead_of_every_peer": ahead}


def reasons(cells: list[dict[str, Any]]) -> list[str]:
    """Why a run is not ok: each failed cell and each cell its verification refused."""
    found = []
    for cell in cells:
        where = f"{cell['system']} at {cell['workers']} workers, {cell['work_ms']:g} ms"
        verified = cell.get("verified", {"ok": True})
        if "run" in verified:
            where += f" (run {verified['run']} of {len(cell['runs'])})"
        if "failed" in cell:
            found.append(f"{where}: {cell['failed']}")
        elif not verified["ok"]:
            problems = []
            if verified.get("handed_out_twice"):
                problems.append(f"{verified['handed_out_twice']} jobs handed out twice")
            if verified.get("claimed_twice"):
                problems.append(f"{verified['claimed_twice']} jobs claimed twice")
            if verified["succeeded"] != cell["jobs"]:
                problems.append(f"{verified['succeeded']} of {cell['jobs']} jobs finished")
            if verified.get("judge_ok") is False:
                problems.append("the judge refused the store")
            found.append(f"{where}: {', '.join(problems) or 'not verified'}")
    return found


def targets(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets for the default system, as ratios measured in this run (None where a cell
    is missing)."""

    def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
        if a is None or b is None or not b[key]:
            return None
        return float(a[key]) / float(b[key])

    book1 = _cell(cells, TEXTBOOK, 1, 0.0)
    single1 = _cell(cells, SINGLE, 1, 0.0)
    chained1 = _cell(cells, CHAINED, 1, 0.0)
    batched1 = _cell(cells, BATCHED, 1, 0.0)
    batched_chained1 = _cell(cells, BATCHED_CHAINED, 1, 0.0)
    book16 = _cell(cells, TEXTBOOK, 16, 1.0)
    result: dict[str, Any] = {
        "single_vs_textbook_1_worker": ratio(single1, book1, "jobs_per_s"),
        "chained_vs_textbook_1_worker": ratio(chained1, book1, "jobs_per_s"),
        "batched_vs_textbook_1_worker": ratio(batched1, book1, "jobs_per_s"),
        "batched_chained_vs_textbook_1_worker": ratio(batched_chained1, book1, "jobs_per_s"),
    }
    for system in PATHS:
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
        if "jobs_per_s" not in cell:
            why = (
                f"skipped: {cell['skipped']}" if "skipped" in cell else f"FAILED: {cell['failed']}"
            )
            lines.append(
                f"| {cell['system']} | {cell['workers']} | {cell['work_ms']:g} | {why} | | | | |"
            )
            continue
        spread = ""
        if len(cell.get("runs", ())) > 1:
            rates = [run["jobs_per_s"] for run in cell["runs"]]
            spread = f" ({min(rates):,.0f}-{max(rates):,.0f})"
        lines.append(
            f"| {cell['system']} | {cell['workers']} | {cell['work_ms']:g} |"
            f" {cell['jobs_per_s']:,.0f}{spread} | {cell['latency_p50_ms']:.2f} |"
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
