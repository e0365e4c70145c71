"""The page of a mutants run: each planted bug of the shipped systems, under every seed,
with the evidence that caught it or the reason it was not run, and the command that
runs the same mutants again."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from crashqueuelab.lab.mutants.catalog import MUTANTS
from crashqueuelab.lab.mutants.runner import score
from crashqueuelab.lab.pages.common import Verdict, View, read_json


def _mutants_command(report: dict[str, Any], run_dir: Path) -> str:
    """The command that runs these mutants again: the same ones, evidence and sizes."""
    parameters = report["parameters"]
    ran = [m["mutant"] for m in report["mutants"]]
    named = "".join(f" --mutant {name}" for name in ran) if len(ran) < len(MUTANTS) else ""
    sizes = "".join(
        f" --{option} {parameters[key]}"
        for option, key in (
            ("jobs", "chaos_jobs"), ("kills", "chaos_kills"), ("pauses", "chaos_pauses"),
            ("power-cuts", "chaos_power_cuts"), ("shrink-seconds", "shrink_seconds"),
        )
        if key in parameters
    )  # fmt: skip
    evidence = " --named-evidence" if report.get("evidence") == "named" else ""
    return (
        f"crashqueuelab mutants --seed {report['seed']} --seeds {len(report['seeds'])}"
        f"{evidence}{named}{sizes} --output-directory {shlex.quote(str(run_dir))}"
    )


def mutants_view(run_dir: Path) -> View:
    report = read_json(run_dir / "mutants.json")
    parameters = report["parameters"]
    evidence = (
        "the crash campaign, the power-loss campaign, the fencing probes, and a chaos run"
        f" ({parameters['chaos_jobs']} jobs, {parameters['chaos_kills']} kills,"
        f" {parameters['chaos_pauses']} pauses, {parameters.get('chaos_power_cuts', 0)} power cuts)"
    )
    not_run = [f"mutant {m['mutant']}: {m['reason']}" for m in report.get("not_run", [])]
    verdict = Verdict(
        ok=report.get("passed_what_ran", report["ok"]),
        title=f"mutants: {score(report)}",
        system=", ".join(sorted({m["system"] for m in report["mutants"]})),
        durability="",
        seed=report["seed"],
        duration=report["timings"]["total_s"],
        command=_mutants_command(report, run_dir),
        reasons=report["reasons"],
        not_run=not_run,
    )
    figures = [
        ("mutants caught", score(report), "under every seed; a mutant not run is not caught"),
        ("seeds", ", ".join(map(str, report["seeds"])), "a catch must hold for each"),
    ]
    data = {
        "mutants": report["mutants"],
        "not_run": report.get("not_run", []),
        "seeds": report["seeds"],
        "evidence": evidence,
    }
    return View("mutants.html.j2", verdict, figures, data)
