"""The page of a release matrix: releases down, the evidence across, each row linked to
that release's own page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.common import Verdict, View
from crashqueuelab.lab.runs.commands import runnable


def _verdict_word(row: dict[str, Any]) -> str:
    if row.get("not_judged"):
        return "not judged here"
    if row["ok"]:
        return "passed"
    if row["keeps_its_promises"]:
        return "weaker than the lab's contract, as documented"
    if row["keeps_its_promises"] is False:
        return "BREAKS ITS OWN PROMISE"
    return "FAILED"


def versions_view(run_dir: Path) -> View:
    report = json.loads((run_dir / "versions.json").read_text(encoding="utf-8"))
    rows = [
        row | {"word": _verdict_word(row), "not_judged": row.get("not_judged")}
        for row in report["rows"]
    ]
    bisection = report["bisection"]
    evidence = " ".join(report["evidence"])
    releases = report["releases"]
    # The releases the range held, each named: A..B would take whatever the index holds
    # between them when run again.
    at_once = report.get("at_once", 1)
    command = runnable(
        f"crashqueuelab versions --system {report['system']} --releases {','.join(releases)}"
        + (" --bisect" if bisection is not None else "")
        + (
            f" --bisect-on {report['criterion']}"
            if bisection is not None or report["criterion"] != "ok"
            else ""
        )
        + (f" --upgrade-from {report['upgrade_from']}" if report.get("upgrade_from") else "")
        + (f" --at-once {at_once}" if at_once > 1 else "")
        + f" --output-directory {run_dir} {evidence}",
        report,
    )
    # The colour follows the releases: a change the bisection found is no pass.
    reasons = [
        f"{row['release']}: " + str(row["first_reason"])
        for row in rows
        if not row["passes"] and not row["not_judged"]
    ]
    not_run = [
        f"{row['release']}: not judged here: {row['not_judged']}"
        for row in rows
        if row["not_judged"]
    ]
    not_run += [f"{release}: the bisection did not need it" for release in report["not_run"]]
    verdict = Verdict(
        ok=report["passed_what_ran"],
        title=report["headline"],
        system=report.get("library") or report["system"],
        durability="" if report.get("library") in (None, report["system"]) else report["system"],
        seed=report.get("seed"),
        duration=None,
        command=command,
        reasons=reasons,
        not_run=not_run,
    )
    figures = [
        ("releases run", f"{len(rows)} of {len(releases)}", "each in its own environment"),
        (
            "passing means",
            report["criterion"],
            "ok: the lab's verdict; promises: the library's own; cases: every crash case",
        ),
    ]
    if report.get("upgrade_from"):
        figures.append(
            (
                "upgraded from",
                report["upgrade_from"],
                "each release ran on the Redis server and store a run of this release left"
                " (that run's page is named beside it)",
            )
        )
    if bisection is not None:
        figures.append(("bisection", bisection["detail"], ""))
    return View("versions.html.j2", verdict, figures, {"rows": rows, "bisection": bisection})
