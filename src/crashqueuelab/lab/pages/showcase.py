"""The page of a showcase: per system, its crash campaigns and the effect experiment,
each linked to its own page, and the mutants' score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashqueuelab.lab.mutants.runner import score
from crashqueuelab.lab.pages.common import Verdict, View, read_json


def counts_text(counts: dict[str, int]) -> str:
    """``{'SUCCEEDED': 26}`` as a reader writes it: "26 SUCCEEDED"."""
    return ", ".join(f"{count} {name}" for name, count in counts.items()) or "none"


def _section_verdict(section: dict[str, Any]) -> tuple[str, str]:
    """A system's word and its colour: what did not run is never shown as passed."""
    if section.get("ok"):
        return "passed", "good"
    if section.get("passed_what_ran"):
        return "passed what ran", ""
    return "FAILED", "bad"


def _probes(campaign: dict[str, Any]) -> dict[str, str]:
    not_run = campaign.get("probes_not_run", 0)
    not_applicable = campaign.get("probes_not_applicable", campaign.get("probes_skipped", 0))
    shown = f"{campaign['probes_passed']} passed, {campaign['probes_failed']} failed"
    if not_run:
        shown += f", {not_run} not run"
    note = (
        f"{not_applicable} not applicable: the system declares it lacks what they need"
        if not_applicable
        else ""
    )
    return {"probes": shown, "probes_note": note}


def showcase_view(run_dir: Path) -> View:
    summary = read_json(run_dir / "showcase.json")
    sections = []
    for spec, section in summary["systems"].items():
        base = Path(section["artifacts"]["campaign_report"]).parent.parent
        word, colour = _section_verdict(section)
        sections.append(
            {
                "spec": spec,
                "section": section,
                "verdict_word": word,
                "verdict_class": colour,
                "final_states": counts_text(
                    section["process_fault_campaign"]["recovered_final_states"]
                ),
                **_probes(section["process_fault_campaign"]),
                "campaign_link": str(
                    (base / "process-fault-campaign" / "report.html").relative_to(run_dir)
                ),
                "demo_link": str(
                    (base / "effect-commit-before-acknowledgement" / "report.html").relative_to(
                        run_dir
                    )
                ),
                "power_loss_link": str(
                    (base / "power-loss-campaign" / "report.html").relative_to(run_dir)
                ),
            }
        )
    reasons = [
        f"{spec}: not ok"
        for spec, section in summary["systems"].items()
        if not section.get("passed_what_ran", section["ok"])
    ]
    mutants = summary["mutants"]
    reasons += [f"mutant {name} not caught" for name in mutants["missed"]]
    verdict = Verdict(
        ok=summary.get("passed_what_ran", summary["ok"]),
        title=f"showcase: the effect experiment and the crash campaigns on {len(sections)}"
        f" systems; mutants {score(mutants)}",
        system=", ".join(summary["systems"]),
        durability="",
        seed=summary["seed"],
        duration=None,
        command=f"crashqueuelab showcase --seed {summary['seed']} "
        + " ".join(f"--system {spec}" for spec in summary["systems"])
        + f" --output-directory {run_dir}",
        reasons=reasons,
        not_run=summary.get("not_run", []),
    )
    campaign = summary["process_fault_campaign"]
    figures = [
        (
            f"{spec}: crash points passed",
            f"{s['section']['process_fault_campaign']['passed']} of "
            f"{s['section']['process_fault_campaign']['named_fault_points']}",
            "",
        )
        for s in sections
        for spec in [s["spec"]]
    ] + [
        ("mutants", score(mutants), mutants["line"]),
        ("power loss", summary["power_loss"], "campaigns that lose what nobody synced"),
        ("delivery semantics", summary["queue_delivery_semantics"], ""),
        ("exit codes", ", ".join(map(str, campaign["exit_codes"])), "86: killed by the crash hook"),
    ]
    return View(
        "showcase.html.j2",
        verdict,
        figures,
        {"sections": sections, "mutants": mutants, "mutants_link": "mutants/report.html"},
    )
