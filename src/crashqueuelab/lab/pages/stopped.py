"""The page of a run that stopped before its end, whatever kind of run it was: interrupted
by SIGINT or SIGTERM (``"interrupted": true``), or stopped because the system under test
raised (``"system_raised"``). It shows what the run had done by then, from the record the
command line kept."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.common import Verdict, View

#: Long lists on the page show this many rows; the record keeps them all.
SHOWN_ROWS = 50


def _figures(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    if record.get("interrupted"):
        stop = ("interrupted by", record["signal"], "")
    else:
        raised = record["system_raised"]
        stop = ("the system under test raised", f"from {raised['call']}", raised["error"])
    figures = [
        stop,
        ("stopped after", f"{record['stopped_after_s']} s", "nothing after that point ran"),
    ]
    if "parts_done" in record:
        done = record["parts_done"]
        figures.append(("parts finished", str(len(done)), ", ".join(done) or "none"))
    if "cases_planned" in record:
        cases = record["cases"]
        passed = sum(1 for case in cases if case["passed"])
        figures.append(
            (
                "crash points run",
                f"{record['cases_done']} of {record['cases_planned']}",
                f"{passed} passed, {len(cases) - passed} failed",
            )
        )
    if "jobs" in record:
        figures.append(
            (
                "jobs acknowledged",
                f"{record['jobs_acknowledged']:,} of {record['jobs']:,}",
                "as the workers' logs say; the store was not judged",
            )
        )
    if "faults" in record:
        landed = [fault for fault in record["faults"] if "at_s" in fault]
        kinds = sorted({fault["kind"] for fault in landed})
        counts = ", ".join(f"{sum(1 for f in landed if f['kind'] == k)} {k}" for k in kinds)
        figures.append(("faults delivered", str(len(landed)), counts or "none"))
    if "mutants_planned" in record:
        caught = sum(1 for mutant in record["mutants"] if mutant["caught"])
        figures.append(
            (
                "mutants run",
                f"{record['mutants_done']} of {record['mutants_planned']}",
                f"{caught} caught",
            )
        )
    if "cells" in record:
        figures.append(("bench cells measured", str(record["cells_done"]), ""))
    return figures


def stopped_view(run_dir: Path, record: dict[str, Any]) -> View:
    arguments = record.get("arguments") or [record["command"]]
    interrupted = bool(record.get("interrupted"))
    verdict = Verdict(
        ok=False,
        title=f"{record['command']}: "
        + (
            "interrupted before it finished"
            if interrupted
            else f"the system under test raised from {record['system_raised']['call']}"
        ),
        system=str(
            record.get("system", {}).get("name")
            or record.get("system_raised", {}).get("system", "")
        ),
        durability=str(record.get("system", {}).get("durability", "")),
        seed=record.get("seed"),
        duration=record.get("stopped_after_s"),
        command="crashqueuelab " + shlex.join(arguments) + "  # into a new or empty directory",
        reasons=record["reasons"],
        interrupted=interrupted,
    )
    cases = record.get("cases", [])
    faults = [fault for fault in record.get("faults", []) if "at_s" in fault]
    data = {
        "cases": cases[:SHOWN_ROWS],
        "cases_more": max(0, len(cases) - SHOWN_ROWS),
        "faults": faults[:SHOWN_ROWS],
        "faults_more": max(0, len(faults) - SHOWN_ROWS),
        "mutants": record.get("mutants", []),
        "run_file": run_dir.name,
    }
    return View("stopped.html.j2", verdict, _figures(record), data)
