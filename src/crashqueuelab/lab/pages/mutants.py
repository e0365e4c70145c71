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


def _original(entry: dict[str, Any]) -> str:
    """The shipped system a mutant changes, as its change names it ("sqlite: ...")."""
    return str(entry["changes"]).split(":", 1)[0]


def mutants_of(report: dict[str, Any]) -> str:
    """The run's mutants in a few words: "21 mutants of sqlite and walqueue"; each one's
    own system is named in the table."""
    entries = report["mutants"] + report.get("not_run", [])
    originals = sorted({_original(entry) for entry in entries})
    systems = (
        " and ".join(originals)
        if len(originals) < 3
        else f"{', '.join(originals[:-1])} and {originals[-1]}"
    )
    return f"{len(entries)} mutant{'' if len(entries) == 1 else 's'} of {systems}"


def mutants_view(run_dir: Path) -> View:
    report = read_json(run_dir / "mutants.json")
    parameters = report["parameters"]
    chaos = (
        f"a chaos run ({parameters['chaos_jobs']} jobs, {parameters['chaos_kills']} kills,"
        f" {parameters['chaos_pauses']} pauses, {parameters.get('chaos_power_cuts', 0)} power cuts)"
    )
    evidence = (
        "only the kind of evidence the catalog names for each mutant (--named-evidence): the"
        f" crash campaign, the power-loss campaign, the probes, the model workload or {chaos}"
        if report.get("evidence") == "named"
        else f"the crash campaign, the power-loss campaign, the fencing probes, and {chaos}"
    )
    not_run = [f"mutant {m['mutant']}: {m['reason']}" for m in report.get("not_run", [])]
    verdict = Verdict(
        ok=report.get("passed_what_ran", report["ok"]),
        title=f"mutants: {score(report)}",
        system=mutants_of(report),
        system_heading="",
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
