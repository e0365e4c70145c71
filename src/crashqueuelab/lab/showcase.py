"""The showcase: the effect experiment and the process-fault campaign, summarised.

Every value in the summary is read back from the retained artifacts (the comparison and
campaign reports, and the effect and queue databases themselves), never carried over from
memory or written as a constant.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from crashqueuelab.lab.campaign import CAMPAIGN_FILE, Progress, run_campaign
from crashqueuelab.lab.demo import COMPARISON_FILE, run_demo
from crashqueuelab.lab.effects import Destination
from crashqueuelab.lab.observe import observe_ledger, observe_queue
from crashqueuelab.lab.reports import prepare_output_directory, read_json, write_json
from crashqueuelab.lab.scenario import LEDGER_FILE, QUEUE_FILE

EFFECT_DIR = "effect-commit-before-acknowledgement"
CAMPAIGN_DIR = "process-fault-campaign"
SHOWCASE_FILE = "showcase.json"


def _effect_summary(effect_dir: Path) -> dict[str, Any]:
    comparison = read_json(effect_dir / COMPARISON_FILE)
    attempts, effects, finals, executions = {}, {}, {}, {}
    invariants_ok = True
    for destination in Destination:
        scenario_dir = effect_dir / destination.value
        # Recount from the databases rather than trusting the comparison file.
        ledger = observe_ledger(scenario_dir / LEDGER_FILE)
        jobs = observe_queue(scenario_dir / QUEUE_FILE)["jobs"]
        job = next(iter(jobs.values()))
        effects[destination.value] = ledger["effects"]
        executions[destination.value] = ledger["effects"] + ledger["absorbed"]
        attempts[destination.value] = job["attempts"]
        finals[destination.value] = job["state"]
        invariants_ok = invariants_ok and comparison[destination.value]["invariants_ok"]
    idempotent, non_idempotent = Destination.IDEMPOTENT.value, Destination.NON_IDEMPOTENT.value
    agrees = all(
        comparison[name]["effect_count"] == effects[name]
        and comparison[name]["attempt_count"] == attempts[name]
        for name in (idempotent, non_idempotent)
    )
    ok = (
        agrees
        and invariants_ok
        and all(count >= 2 for count in attempts.values())
        and all(state == "SUCCEEDED" for state in finals.values())
        and effects[idempotent] == 1
        and effects[non_idempotent] == executions[non_idempotent]
    )
    return {
        "attempts_per_scenario": attempts,
        "durable_effects": effects,
        "executions": executions,
        "final_states": finals,
        "fault_point": comparison["fault_point"],
        "invariants_ok": invariants_ok,
        "ok": ok,
    }


def _campaign_summary(campaign_dir: Path) -> dict[str, Any]:
    report = read_json(campaign_dir / CAMPAIGN_FILE)
    summary = dict(report["summary"])
    final_states: Counter[str] = Counter()
    for case in report["cases"]:
        queue = observe_queue(campaign_dir / case["artifacts"]["queue_database"])
        final_states.update(job["state"] for job in queue["jobs"].values())
    summary["recovered_final_states"] = dict(sorted(final_states.items()))
    summary["execution_order"] = report["execution_order"]
    return summary


def summarize(output_dir: Path, *, seed: int) -> dict[str, Any]:
    """The showcase summary, from the artifacts below ``output_dir``."""
    effect = _effect_summary(output_dir / EFFECT_DIR)
    campaign = _campaign_summary(output_dir / CAMPAIGN_DIR)
    campaign_ok = (
        campaign["failed"] == 0
        and campaign["timeouts"] == 0
        and campaign["passed"] == campaign["named_fault_points"]
        and campaign["crash_time_replay_all_ok"]
        and campaign["crash_time_invariants_all_ok"]
        and campaign["recovery_all_succeeded"]
    )
    return {
        "seed": seed,
        "ok": effect["ok"] and campaign_ok,
        "queue_delivery_semantics": read_json(output_dir / EFFECT_DIR / COMPARISON_FILE)[
            "queue_delivery_semantics"
        ],
        "effect_commit_before_acknowledgement": effect,
        "process_fault_campaign": campaign,
        "artifacts": {
            "output_directory": str(output_dir),
            "effect_comparison": str(output_dir / EFFECT_DIR / COMPARISON_FILE),
            "campaign_report": str(output_dir / CAMPAIGN_DIR / CAMPAIGN_FILE),
            "case_directories": str(output_dir / CAMPAIGN_DIR / "cases"),
            "showcase_report": str(output_dir / SHOWCASE_FILE),
        },
    }


def run_showcase(
    output_dir: Path, *, seed: int, progress: Progress | None = None
) -> dict[str, Any]:
    """Run both experiments into ``output_dir`` (new or empty) and return the summary."""
    prepare_output_directory(output_dir)
    run_demo(output_dir / EFFECT_DIR, seed=seed)
    if progress is not None:
        progress("effect experiment done")
    run_campaign(output_dir / CAMPAIGN_DIR, seed=seed, progress=progress)
    summary = summarize(output_dir, seed=seed)
    write_json(output_dir / SHOWCASE_FILE, summary)
    return summary
