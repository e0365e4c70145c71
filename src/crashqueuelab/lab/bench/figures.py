"""The figures a bench run computes: percentiles, fairness, a cell's median run, the disk.

With ``repeat`` above one, every cell runs that many times, and the cell reports its
median run whole (throughput, latencies and fairness of that one run) with every run's
figures beside it: one slow moment of a shared disk then moves a spread, not a ratio.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
