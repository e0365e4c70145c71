"""The bench run's table and record: the targets as ratios, the peers compared, the reasons a
run is not ok, and a Markdown table of every cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashqueuelab.lab.bench.plan import (
    BATCHED,
    BATCHED_CHAINED,
    CHAINED,
    PATHS,
    SINGLE,
    TEXTBOOK,
)
from crashqueuelab.lab.runs.kinds import BENCH

BENCH_FILE = BENCH.record


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
