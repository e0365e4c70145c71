"""The page of a benchmark: per amount of work per job, jobs per second and p99 latency
against the number of workers, one line per system beside the disk's own fsync rate,
with the machine it ran on and what failed."""

from __future__ import annotations

from pathlib import Path

from crashqueuelab.lab.pages.charts import Chart, Rule, Series
from crashqueuelab.lab.pages.common import PALETTE, Verdict, View, read_json


def bench_view(run_dir: Path) -> View:
    report = read_json(run_dir / "bench.json")
    cells = [cell for cell in report["cells"] if "jobs_per_s" in cell]
    lanes = list(report.get("systems", {}))
    charts = []
    for work in sorted({cell["work_ms"] for cell in cells}):
        series, latency = [], []
        for index, lane in enumerate(lanes):
            own = sorted(
                (c for c in cells if c["system"] == lane and c["work_ms"] == work),
                key=lambda c: c["workers"],
            )
            if own:
                color = PALETTE[index % len(PALETTE)]
                series.append(Series(lane, [(c["workers"], c["jobs_per_s"]) for c in own], color))
                latency.append(
                    Series(lane, [(c["workers"], c["latency_p99_ms"]) for c in own], color)
                )
        charts.append(
            Chart(
                f"Jobs per second, {work:g} ms of work per job",
                "workers",
                "jobs/s",
                series,
                rules=[Rule(report["disk"]["fsyncs_per_s"], "fsyncs/s of this disk")],
                log_x=True,
            )
        )
        charts.append(
            Chart(
                f"p99 claim-to-acknowledgement latency, {work:g} ms of work",
                "workers",
                "ms",
                latency,
                log_x=True,
            )
        )
    # The run's own account of what failed; a bench.json from before it kept one is read
    # cell by cell.
    failed = report.get("reasons") or [
        f"{c['system']} at {c['workers']} workers: {c['failed']}"
        for c in report["cells"]
        if "failed" in c
    ] + [
        f"{c['system']} at {c['workers']} workers, {c['work_ms']:g} ms:"
        f" not verified ({c['verified']})"
        for c in cells
        if not c["verified"]["ok"]
    ]
    every = report["cells"]
    workers = ",".join(str(n) for n in sorted({c["workers"] for c in every}))
    work = ",".join(f"{ms:g}" for ms in sorted({c["work_ms"] for c in every}))
    verdict = Verdict(
        ok=report["ok"],
        title=f"benchmark: {', '.join(lanes)}",
        system=", ".join(lanes),
        durability="; ".join(
            f"{name}: {d.get('durability', '')}" for name, d in report.get("systems", {}).items()
        ),
        seed=None,
        duration=None,
        command="crashqueuelab bench "
        + " ".join(f"--system {spec}" for spec in report.get("system_specs", []))
        + "".join(f" --peer {peer}" for peer in report.get("peers", []))
        + f" --jobs {report['jobs_per_cell']} --workers {workers} --work-ms {work}"
        + (f" --repeat {report['repeat']}" if report.get("repeat", 1) > 1 else "")
        + f" --batch {report['batch']} --output-directory {run_dir}",
        reasons=failed,
    )
    figures = [
        (
            "disk",
            f"{report['disk']['fsyncs_per_s']:,.0f} fsyncs/s",
            f"p50 {report['disk']['p50_us']:.0f} µs",
        ),
        (
            "jobs per cell",
            f"{report['jobs_per_cell']:,}",
            "pre-submitted; workers released together",
        ),
        (
            "runs per cell",
            f"{report.get('repeat', 1)}",
            "each cell shows its median run; the range of every run beside it"
            if report.get("repeat", 1) > 1
            else "one run each",
        ),
        (
            "machine",
            f"{report['machine']['cpus']} CPUs",
            f"Python {report['machine']['python']}, SQLite {report['machine']['sqlite']}",
        ),
    ]
    return View("bench.html.j2", verdict, figures, {"charts": charts, "cells": report["cells"]})
