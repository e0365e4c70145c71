"""The showcase: the effect experiment and the crash campaign in both crash modes on every
shipped system, and the mutant score, summarised.

Where this machine cannot cut the power (no Linux FUSE), the power-loss campaigns and the
mutants that only a power cut catches are skipped, and the summary says why.

Every value in the summary is read back from the retained artifacts (the comparison and
campaign reports, and the effect and queue databases themselves), never carried over from
memory or written as a constant.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.lab.campaign.run import CAMPAIGN_FILE, run_campaign
from crashqueuelab.lab.demo import COMPARISON_FILE, IDEMPOTENCY_KEY, run_demo
from crashqueuelab.lab.faults.crashmodes import power_loss_refusal
from crashqueuelab.lab.faults.powerloss.disk import unavailable_reason
from crashqueuelab.lab.mutants.catalog import MUTANTS
from crashqueuelab.lab.mutants.runner import MUTANTS_FILE, run_mutants, score
from crashqueuelab.lab.reproducers.campaign import SHRINK_SECONDS, shrink_if_failed
from crashqueuelab.lab.runs.interrupts import Interrupted
from crashqueuelab.lab.runs.kinds import SHOWCASE
from crashqueuelab.lab.runs.modes import POWER_LOSS
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, read_json, write_json
from crashqueuelab.lab.runs.systemcalls import SystemRaised
from crashqueuelab.lab.workloads.effects import Destination
from crashqueuelab.lab.workloads.observe import observe_ledger
from crashqueuelab.lab.workloads.scenario import LEDGER_FILE, STORE_DIRECTORY, scenario_jobs
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.registry import SHIPPED, resolve_system

EFFECT_DIR = "effect-commit-before-acknowledgement"
CAMPAIGN_DIR = "process-fault-campaign"
POWER_LOSS_DIR = "power-loss-campaign"
MUTANTS_DIR = "mutants"
SHOWCASE_FILE = SHOWCASE.record
#: The systems a showcase ran, in order (the first one's sections are also the top level).
SYSTEMS_FILE = "systems.json"


def _effect_summary(system: System, effect_dir: Path) -> dict[str, Any]:
    comparison = read_json(effect_dir / COMPARISON_FILE)
    attempts, effects, finals, executions = {}, {}, {}, {}
    invariants_ok, succeeded = True, True
    for destination in Destination:
        scenario_dir = effect_dir / destination.value
        # Recount from the retained stores rather than trusting the comparison file.
        ledger = observe_ledger(scenario_dir / LEDGER_FILE)
        reading = read_store(system, scenario_dir / STORE_DIRECTORY, [IDEMPOTENCY_KEY])
        job = reading.jobs.get(IDEMPOTENCY_KEY)
        effects[destination.value] = ledger["effects"]
        executions[destination.value] = ledger["effects"] + ledger["absorbed"]
        attempts[destination.value] = 0 if job is None else job.attempts
        finals[destination.value] = None if job is None else job.native_state
        succeeded = succeeded and job is not None and job.status.value == "succeeded"
        invariants_ok = (
            invariants_ok and reading.ok and comparison[destination.value]["invariants_ok"]
        )
    idempotent, non_idempotent = Destination.IDEMPOTENT.value, Destination.NON_IDEMPOTENT.value
    agrees = all(
        comparison[name]["effect_count"] == effects[name]
        and comparison[name]["attempt_count"] == attempts[name]
        for name in (idempotent, non_idempotent)
    )
    ok = (
        agrees
        and invariants_ok
        and succeeded
        and all(count >= 2 for count in attempts.values())
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


def _campaign_summary(system: System, campaign_dir: Path) -> dict[str, Any]:
    report = read_json(campaign_dir / CAMPAIGN_FILE)
    summary = dict(report["summary"])
    final_states: Counter[str] = Counter()
    for case in report["cases"]:
        keys = [job.key for job in scenario_jobs(case["case_id"])]
        reading = read_store(system, campaign_dir / case["artifacts"]["store_directory"], keys)
        final_states.update(job.native_state for job in reading.jobs.values())
    summary["recovered_final_states"] = dict(sorted(final_states.items()))
    summary["execution_order"] = report["execution_order"]
    return summary


def _power_loss_summary(campaign_dir: Path, unavailable: str | None) -> dict[str, Any]:
    if unavailable is not None:
        # Evidence that did not run is never ok: ``ran`` and ``unavailable`` say why.
        return {"ran": False, "ok": False, "unavailable": unavailable}
    report = read_json(campaign_dir / CAMPAIGN_FILE)
    # ``ok``: nothing it judged failed. The crash states a bound left unjudged (on
    # RabbitMQ) make the system's evidence incomplete, never failed.
    return {
        "ran": True,
        "ok": report.get("passed_what_ran", report["ok"]),
        "crash_states_per_case": report.get("crash_states_per_case"),
        **report["summary"],
    }


def _mutant_summary(mutants_dir: Path) -> dict[str, Any]:
    report = read_json(mutants_dir / MUTANTS_FILE)
    not_run = report.get("not_run", [])
    line = (
        f"mutants: {score(report)} by the evidence each is named for (seed {report['seed']},"
        f" {report['timings']['total_s']:.0f} s)"
    )
    if not_run:
        # Which and why are in the mutants' record; the reason (an install hint) is said
        # once, in the showcase's verdict line.
        line += f"; why not run: {MUTANTS_FILE}"
    line += "; all evidence, two seeds: crashqueuelab mutants"
    return {
        "ok": report["ok"],
        "passed_what_ran": report["passed_what_ran"],
        "complete": not not_run,
        "caught": report["caught"],
        "total": report["total"],
        "not_run": not_run,
        "missed": report["missed"],
        "seeds": report["seeds"],
        "evidence": report["evidence"],
        "seconds": report["timings"]["total_s"],
        "line": line,
    }


def _system_summary(spec: str, system_dir: Path, unavailable: str | None) -> dict[str, Any]:
    system = resolve_system(spec)
    effect = _effect_summary(system, system_dir / EFFECT_DIR)
    campaign = _campaign_summary(system, system_dir / CAMPAIGN_DIR)
    power_loss = _power_loss_summary(system_dir / POWER_LOSS_DIR, unavailable)
    campaign_ok = (
        campaign["failed"] == 0
        and campaign["timeouts"] == 0
        and campaign["passed"] == campaign["named_fault_points"]
        and campaign["crash_time_judgement_all_ok"]
        and campaign["recovery_all_succeeded"]
        and campaign["probes_failed"] == 0
    )
    passed_what_ran = effect["ok"] and campaign_ok and (power_loss["ok"] or not power_loss["ran"])
    complete = (
        power_loss["ran"]
        and not power_loss.get("crash_state_choices_unstarted")
        and campaign["probes_not_run"] == 0
    )
    return {
        "system": read_json(system_dir / CAMPAIGN_DIR / CAMPAIGN_FILE)["system"],
        "ok": passed_what_ran and complete,
        "passed_what_ran": passed_what_ran,
        "complete": complete,
        "effect_commit_before_acknowledgement": effect,
        "process_fault_campaign": campaign,
        "power_loss_campaign": power_loss,
        "artifacts": {
            "effect_comparison": str(system_dir / EFFECT_DIR / COMPARISON_FILE),
            "campaign_report": str(system_dir / CAMPAIGN_DIR / CAMPAIGN_FILE),
            "case_directories": str(system_dir / CAMPAIGN_DIR / "cases"),
        },
    }


def _named(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


#: Why a campaign's probes did not run: the lab could not open the system for them.
PROBES_NOT_OPENED = "the lab could not open the system for them (its campaign page says why)"


def not_run_of(
    systems: dict[str, dict[str, Any]], mutants: dict[str, Any], unavailable: str | None
) -> tuple[list[str], str | None]:
    """What the showcase did not run: each part with its reason (the record's ``not_run``),
    and one line that says each reason once (the ``headline``; None when everything ran)."""
    parts: list[tuple[str, str, str]] = []  # (system or "", what, why)
    for spec, section in systems.items():
        power_loss = section["power_loss_campaign"]
        if not power_loss["ran"]:
            parts.append((spec, "the power-loss campaign", power_loss["unavailable"]))
        left = power_loss.get("crash_state_choices_unstarted")
        if left:
            what = f"{left} crash-state choices of the power-loss campaign"
            bound = power_loss["crash_states_per_case"]
            parts.append((spec, what, f"at most {bound} crash states judged per case"))
        probes = section["process_fault_campaign"].get("probes_not_run", 0)
        if probes:
            what = f"{probes} probe{'s' if probes > 1 else ''} of the crash campaign"
            parts.append((spec, what, PROBES_NOT_OPENED))
    if mutants["not_run"]:
        # Each needs a power cut: the machine's reason, said with the campaigns'.
        reason = unavailable or mutants["not_run"][0]["reason"]
        parts.append(("", f"{len(mutants['not_run'])} of {mutants['total']} mutants", reason))
    if not parts:
        return [], None
    listed = [
        f"{spec}: {what} ({why})" if spec else f"{what} ({mutants['not_run'][0]['reason']})"
        for spec, what, why in parts
    ]
    by_reason: dict[str, dict[str, list[str]]] = {}
    for spec, what, why in parts:
        by_reason.setdefault(why, {}).setdefault(what, []).append(spec)
    said = []
    for why, whats in by_reason.items():
        pieces = []
        for what, specs in whats.items():
            named = [spec for spec in specs if spec]
            if not named:
                pieces.append(what)
            elif what == "the power-loss campaign":
                plural = "s" if len(named) > 1 else ""
                pieces.append(f"power-loss campaign{plural} ({', '.join(named)})")
            else:
                pieces.append(f"{what} ({', '.join(named)})")
        said.append(f"{_named(pieces)}: {why}")
    return listed, "not run: " + "; ".join(said)


def _directory_name(spec: str) -> str:
    """A system's section directory: its name, or its import path made a file name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", spec)


def summarize(output_dir: Path, *, seed: int) -> dict[str, Any]:
    """The showcase summary, from the artifacts below ``output_dir``.

    ``systems`` has one section per system, in the order ``systems.json`` records; the
    top-level sections are the first system's.
    """
    recorded = read_json(output_dir / SYSTEMS_FILE)
    specs: list[str] = recorded["systems"]
    unavailable: str | None = recorded["power_loss_unavailable"]
    systems = {
        spec: _system_summary(
            spec,
            output_dir / _directory_name(spec),
            unavailable or power_loss_refusal(resolve_system(spec)),
        )
        for spec in specs
    }
    mutants = _mutant_summary(output_dir / MUTANTS_DIR)
    first = systems[specs[0]]
    not_run, headline = not_run_of(systems, mutants, unavailable)
    passed_what_ran = (
        all(section["passed_what_ran"] for section in systems.values())
        and mutants["passed_what_ran"]
    )
    return {
        "seed": seed,
        # Skipped evidence is part of the verdict: ok only when everything ran and passed;
        # passed_what_ran when what ran passed; not_run says what did not, and why.
        "ok": passed_what_ran and not not_run,
        "passed_what_ran": passed_what_ran,
        "complete": not not_run,
        "not_run": not_run,
        **({"headline": headline} if headline else {}),
        "mutants": mutants,
        "power_loss": "ran" if unavailable is None else f"unavailable: {unavailable}",
        "queue_delivery_semantics": read_json(
            output_dir / _directory_name(specs[0]) / EFFECT_DIR / COMPARISON_FILE
        )["queue_delivery_semantics"],
        "effect_commit_before_acknowledgement": first["effect_commit_before_acknowledgement"],
        "process_fault_campaign": first["process_fault_campaign"],
        "systems": systems,
        "artifacts": {
            "output_directory": str(output_dir),
            **first["artifacts"],
            "showcase_report": str(output_dir / SHOWCASE_FILE),
        },
    }


#: Called with each part's directory as soon as the part has finished (its page is written
#: there, so a run stopped later still links every part it finished).
Finished = Callable[[Path], object]


def run_showcase(
    output_dir: Path,
    *,
    seed: int,
    systems: Sequence[str] = tuple(SHIPPED),
    progress: Progress | None = None,
    shrink_seconds: float = SHRINK_SECONDS,
    finished: Finished | None = None,
) -> dict[str, Any]:
    """Run both experiments on each system (every shipped one unless told) into
    ``output_dir`` (new or empty) and return the summary. Each failing campaign, and each
    mutant, is shrunk to a reproducer for up to ``shrink_seconds``; ``finished`` is told of
    each part as it ends."""
    chosen = list(dict.fromkeys(systems))
    for spec in chosen:
        resolve_system(spec)  # an unusable system is refused before anything is written
    prepare_output_directory(output_dir)
    unavailable = unavailable_reason()
    write_json(
        output_dir / SYSTEMS_FILE, {"systems": chosen, "power_loss_unavailable": unavailable}
    )
    done: list[dict[str, str]] = []
    running = ""

    def part(name: str, directory: Path) -> None:
        """``name`` has finished in ``directory``."""
        nonlocal running
        done.append({"part": name, "directory": str(directory.relative_to(output_dir))})
        running = ""
        if finished is not None:
            finished(directory)

    try:
        for spec in chosen:
            section = output_dir / _directory_name(spec)
            running = f"{spec}: effect experiment"
            run_demo(section / EFFECT_DIR, seed=seed, system=spec)
            part(running, section / EFFECT_DIR)
            said = labelled(progress, f"effect experiment {spec}")
            if said is not None:
                said("done")
            running = f"{spec}: crash campaign"
            campaign = run_campaign(
                section / CAMPAIGN_DIR, seed=seed, system=spec, progress=progress
            )
            shrink_if_failed(section / CAMPAIGN_DIR, campaign, shrink_seconds)
            part(running, section / CAMPAIGN_DIR)
            if unavailable is None and power_loss_refusal(resolve_system(spec)) is None:
                running = f"{spec}: power-loss campaign"
                power_loss = run_campaign(
                    section / POWER_LOSS_DIR,
                    seed=seed,
                    system=spec,
                    crash_mode=POWER_LOSS,
                    progress=progress,
                )
                shrink_if_failed(section / POWER_LOSS_DIR, power_loss, shrink_seconds)
                part(running, section / POWER_LOSS_DIR)
        not_run = {
            m.name: f"it needs a power cut, and {unavailable}"
            for m in MUTANTS
            if unavailable is not None and m.needs_power_loss
        }
        running = "mutants"
        run_mutants(
            output_dir / MUTANTS_DIR,
            seed=seed,
            seeds=1,
            names=[m.name for m in MUTANTS],
            named_evidence=True,
            not_run=not_run,
            progress=progress,
            shrink_seconds=shrink_seconds,
        )
        part(running, output_dir / MUTANTS_DIR)
    except (Interrupted, SystemRaised) as stop:
        # Each part finished so far has its own record and page below the directory; the
        # part that was running names the progress the stop carries (its crash points...).
        stop.partial["systems"] = chosen
        stop.partial["parts_done"] = [entry["part"] for entry in done]
        stop.partial["parts"] = done
        stop.partial["running"] = running or None
        raise
    summary = summarize(output_dir, seed=seed)
    write_json(output_dir / SHOWCASE_FILE, summary)
    return summary
