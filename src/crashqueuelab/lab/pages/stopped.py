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
    # A composed run (the showcase) names the part that was running: the counts below are
    # that part's.
    running = record.get("running")
    within = f" ({running})" if running else ""
    if "parts_done" in record:
        done = record["parts_done"]
        figures.append(("parts finished", str(len(done)), ", ".join(done) or "none"))
        figures.append(("running when it stopped", running or "nothing", ""))
    if "cases_planned" in record:
        cases = record["cases"]
        passed = sum(1 for case in cases if case["passed"])
        figures.append(
            (
                f"crash points run{within}",
                f"{record['cases_done']} of {record['cases_planned']}",
                f"{passed} passed, {len(cases) - passed} failed",
            )
        )
    if "disk_fault_cases_planned" in record:
        cases = record["disk_fault_cases"]
        verdicts = [case["verdict"] for case in cases]
        figures.append(
            (
                f"disk-fault cases run{within}",
                f"{len(cases)} of {record['disk_fault_cases_planned']}",
                ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts))) or "none",
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
                f"mutants run{within}",
                f"{record['mutants_done']} of {record['mutants_planned']}",
                f"{caught} caught",
            )
        )
    if "cells" in record:
        figures.append(("bench cells measured", str(record["cells_done"]), ""))
    return figures


def _system(record: dict[str, Any]) -> str:
    """The system(s) the run was on: its own, the one that raised, or a showcase's."""
    named = record.get("system", {}).get("name") or record.get("system_raised", {}).get("system")
    return str(named or ", ".join(record.get("systems") or []))


def fresh_directory(typed: str, run_dir: Path) -> str:
    """``typed`` (the output directory as the command named it) with the first suffix
    ``-2``, ``-3``, ... whose directory does not exist beside ``run_dir``: a run's directory
    must be new or empty, and this one is neither."""
    number = 2
    while (run_dir.parent / f"{run_dir.name}-{number}").exists():
        number += 1
    return f"{typed.rstrip('/')}-{number}"


def again(arguments: list[str], run_dir: Path) -> list[str]:
    """The run's arguments, into a new directory."""
    changed = list(arguments)
    for index, word in enumerate(changed):
        if word == "--output-directory" and index + 1 < len(changed):
            changed[index + 1] = fresh_directory(changed[index + 1], run_dir)
            return changed
        if word.startswith("--output-directory="):
            typed = word.partition("=")[2]
            changed[index] = f"--output-directory={fresh_directory(typed, run_dir)}"
            return changed
    return [*changed, "--output-directory", fresh_directory(str(run_dir), run_dir)]


def _parts(run_dir: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts a composed run finished, each with its page when it has one."""
    parts = []
    # A part's directory as the command that builds its page names it: from where the run
    # was started, as its --output-directory was typed.
    typed = Path(record.get("output_directory") or run_dir)
    for entry in record.get("parts", []):
        page = Path(entry["directory"]) / "report.html"
        parts.append(
            entry
            | {
                "page": str(page) if (run_dir / page).is_file() else None,
                "build": str(typed / entry["directory"]),
            }
        )
    return parts


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
        system=_system(record),
        durability=str(record.get("system", {}).get("durability", "")),
        seed=record.get("seed"),
        duration=record.get("stopped_after_s"),
        command="crashqueuelab " + shlex.join(again(arguments, run_dir)),
        reasons=record["reasons"],
        interrupted=interrupted,
    )
    cases = record.get("cases", [])
    faults = [fault for fault in record.get("faults", []) if "at_s" in fault]
    parts = _parts(run_dir, record)
    data = {
        "cases": cases[:SHOWN_ROWS],
        "cases_more": max(0, len(cases) - SHOWN_ROWS),
        "faults": faults[:SHOWN_ROWS],
        "faults_more": max(0, len(faults) - SHOWN_ROWS),
        "mutants": record.get("mutants", []),
        "parts": parts,
        "running": record.get("running"),
        "run_file": run_dir.name,
    }
    data["evidence"] = bool(cases or faults or data["mutants"] or parts)
    return View("stopped.html.j2", verdict, _figures(record), data)
