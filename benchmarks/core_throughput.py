"""Single-process throughput at synchronous=FULL: crashqueuelab against a textbook queue.

    python benchmarks/core_throughput.py [--jobs 2000] [--runs 3] [--json out.json] [--sync-off]

Both queues run on the same disk in the same run, alternating, so their ratio is
meaningful on a shared, noisy machine. The textbook queue writes one row per job:
claim = BEGIN IMMEDIATE; SELECT oldest queued; UPDATE leased; COMMIT, and
complete = BEGIN IMMEDIATE; UPDATE succeeded; COMMIT. crashqueuelab also writes one
history event per transition, fenced by worker id and lease token.

``--sync-off`` runs both at synchronous=OFF (set on crashqueuelab's open connection, which
the queue itself never allows): not durable, it shows what a transition costs besides its
fsync.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crashqueuelab import DurableQueue, ManualClock, SeededIds

LEASE_US = 60_000_000


def textbook(path: Path, jobs: int, synchronous: str) -> tuple[float, float]:
    """(submits/s, claim+complete cycles/s) of the textbook queue."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL,"
            " payload TEXT NOT NULL, lease_until INTEGER)"
        )
        conn.execute("CREATE INDEX jobs_state ON jobs (state, id)")
        started = time.perf_counter()
        for index in range(jobs):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO jobs (state, payload) VALUES ('queued', ?)",
                (json.dumps({"value": index}),),
            )
            conn.execute("COMMIT")
        submit_rate = jobs / (time.perf_counter() - started)
        started = time.perf_counter()
        done = 0
        while True:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1"
            ).fetchone()
            if row is None:
                conn.execute("COMMIT")
                break
            conn.execute(
                "UPDATE jobs SET state = 'leased', lease_until = ? WHERE id = ?", (1, row[0])
            )
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ?", (row[0],))
            conn.execute("COMMIT")
            done += 1
        cycle_rate = done / (time.perf_counter() - started)
    finally:
        conn.close()
    return submit_rate, cycle_rate


def _submit_all(queue: DurableQueue, jobs: int) -> float:
    """Submit ``jobs`` jobs one transaction each; returns submissions per second."""
    started = time.perf_counter()
    for index in range(jobs):
        queue.submit(idempotency_key=f"k{index}", job_type="bench", payload={"value": index})
    return jobs / (time.perf_counter() - started)


def _open(path: Path, synchronous: str) -> DurableQueue:
    queue = DurableQueue(path, clock=ManualClock(1_000_000), ids=SeededIds(1, "bench"))
    queue.connection.execute(f"PRAGMA synchronous = {synchronous}")
    return queue


def crashqueuelab(path: Path, jobs: int, synchronous: str) -> tuple[float, float]:
    """(submits/s, claim+succeed cycles/s) of DurableQueue's single-job path."""
    with _open(path, synchronous) as queue:
        submit_rate = _submit_all(queue, jobs)
        started = time.perf_counter()
        done = 0
        while (claimed := queue.claim(worker_id="w", lease_duration_us=LEASE_US)) is not None:
            queue.succeed(job_id=claimed.job.job_id, worker_id="w", lease_token=claimed.lease_token)
            done += 1
        cycle_rate = done / (time.perf_counter() - started)
    return submit_rate, cycle_rate


def crashqueuelab_chained(path: Path, jobs: int, synchronous: str) -> tuple[float, float]:
    """(submits/s, cycles/s) when each acknowledgement also leases the next job (one commit)."""
    with _open(path, synchronous) as queue:
        submit_rate = _submit_all(queue, jobs)
        started = time.perf_counter()
        done = 0
        claimed = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
        while claimed is not None:
            _, claimed = queue.succeed_and_claim(
                job_id=claimed.job.job_id,
                worker_id="w",
                lease_token=claimed.lease_token,
                lease_duration_us=LEASE_US,
            )
            done += 1
        cycle_rate = done / (time.perf_counter() - started)
    return submit_rate, cycle_rate


SYSTEMS = {
    "textbook": textbook,
    "crashqueuelab": crashqueuelab,
    "crashqueuelab-chained": crashqueuelab_chained,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--sync-off", action="store_true", help="synchronous=OFF, not durable")
    args = parser.parse_args()
    synchronous = "OFF" if args.sync_off else "FULL"
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in SYSTEMS}
    with tempfile.TemporaryDirectory(prefix="cql-bench-") as scratch:
        for run in range(args.runs):
            for name, measure in SYSTEMS.items():
                rates = measure(Path(scratch) / f"{name}-{run}.sqlite", args.jobs, synchronous)
                samples[name].append(rates)
                print(
                    f"run {run + 1} {name:>21}: submit {rates[0]:8.0f}/s"
                    f"  claim+succeed {rates[1]:8.0f}/s",
                    file=sys.stderr,
                )
    medians: dict[str, dict[str, Any]] = {
        name: {
            "submit_per_s": statistics.median(rate[0] for rate in rates),
            "cycles_per_s": statistics.median(rate[1] for rate in rates),
            "runs": [{"submit_per_s": r[0], "cycles_per_s": r[1]} for r in rates],
        }
        for name, rates in samples.items()
    }
    result = {
        "jobs": args.jobs,
        "runs": args.runs,
        "synchronous": synchronous,
        "sqlite": sqlite3.sqlite_version,
        "python": sys.version.split()[0],
        "medians": medians,
        "ratios_to_textbook": {
            name: {
                "submit": medians[name]["submit_per_s"] / medians["textbook"]["submit_per_s"],
                "cycles": medians[name]["cycles_per_s"] / medians["textbook"]["cycles_per_s"],
            }
            for name in SYSTEMS
        },
    }
    print("| queue | submit/s | x textbook | claim+succeed cycles/s | x textbook |")
    print("|---|---|---|---|---|")
    for name in SYSTEMS:
        figures, ratio = medians[name], result["ratios_to_textbook"][name]
        print(
            f"| {name} | {figures['submit_per_s']:,.0f} | {ratio['submit']:.2f} |"
            f" {figures['cycles_per_s']:,.0f} | {ratio['cycles']:.2f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
