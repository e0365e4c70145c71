"""The page of a showcase: per system, its crash campaigns and the effect experiment,
each linked to its own page, and the mutants' score."""

from __future__ import annotations

from pathlib import Path

from crashqueuelab.lab.mutants.runner import score
from crashqueuelab.lab.pages.common import Verdict, View, read_json


def showcase_view(run_dir: Path) -> View:
    summary = read_json(run_dir / "showcase.json")
    sections = []
    for spec, section in summary["systems"].items():
        base = Path(section["artifacts"]["campaign_report"]).parent.parent
        sections.append(
            {
                "spec": spec,
                "section": section,
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
        f"{spec}: not ok" for spec, section in summary["systems"].items() if not section["ok"]
    ]
    mutants = summary["mutants"]
    reasons += [f"mutant {name} not caught" for name in mutants["missed"]]
    verdict = Verdict(
        ok=summary["ok"],
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
