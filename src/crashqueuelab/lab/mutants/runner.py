"""``crashqueuelab mutants``: every mutant through the crash campaign in both crash modes
(with its probes) and a chaos run, once per seed; which evidence caught it, naming the
anomaly, or that nothing did. A mutant counts as caught only if every seed caught it: a
catch that depends on the seed is luck, not evidence."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.campaign.diskfaults import run_disk_faults
from crashqueuelab.lab.campaign.probes import PROBES as ALL_PROBES
from crashqueuelab.lab.campaign.run import run_campaign
from crashqueuelab.lab.chaos.run import run_chaos
from crashqueuelab.lab.faults.powerloss.disk import require_power_loss
from crashqueuelab.lab.mutants.catalog import (
    CHAOS,
    CRASH_CAMPAIGN,
    DISK_FAULT_RUNS,
    MODEL,
    MUTANTS,
    POWER_LOSS_CAMPAIGN,
    PROBES,
    Mutant,
)
from crashqueuelab.lab.reproducers.campaign import CASE, PROBE, SHRINK_SECONDS, add_reproducers
from crashqueuelab.lab.reproducers.campaign import MODEL as MODEL_KIND
from crashqueuelab.lab.runs import kinds
from crashqueuelab.lab.runs.interrupts import Interrupted
from crashqueuelab.lab.runs.modes import POWER_LOSS
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.systems.registry import resolve_system

MUTANTS_FILE = kinds.MUTANTS.record
#: Every kind of evidence, in the order reports list them.
EVIDENCE = (CRASH_CAMPAIGN, POWER_LOSS_CAMPAIGN, DISK_FAULT_RUNS, PROBES, MODEL, CHAOS)
#: The disk-fault evidence: one failed fsync per call (a retry then syncs nothing and is
#: answered success: fsyncgate), at a submission, a claim and a success (one of each
#: transition a job is told of first), which keeps it to a second or two a mutant.
DISK_FAULT = "eio-fsync"
DISK_FAULT_STEPS = (0, 1, 2)


def score(report: Mapping[str, Any]) -> str:
    """ "13 of 17 caught, 4 not run": a mutant that did not run is never counted as caught."""
    text = f"{report['caught']} of {report['total']} caught"
    not_run = report.get("not_run", [])
    return text + (f", {len(not_run)} not run" if not_run else "")


def _failures(lines: list[str], prefix: str, by: str) -> list[dict[str, str]]:
    failed = [line for line in lines if line.startswith(prefix)]
    return [{"by": by, "anomaly": failed[0], "count": str(len(failed))}] if failed else []


#: The failures of a campaign each kind of evidence is shrunk from.
_SHRUNK_AS = {CRASH_CAMPAIGN: CASE, POWER_LOSS_CAMPAIGN: CASE, PROBES: PROBE, MODEL: MODEL_KIND}


def _reproducer(
    mutant: Mutant,
    campaigns: Mapping[str, tuple[Path, dict[str, Any]]],
    caught: list[dict[str, str]],
    seconds: float,
) -> dict[str, Any] | None:
    """The mutant's smallest failing run: shrunk from the evidence the catalog names for it
    (or, when another caught it instead, the first that did), with each exported test run
    against the shipped system too, where it must pass."""
    if seconds <= 0:
        return None
    by = [entry["by"] for entry in caught if entry["by"] in campaigns]
    if not by:
        return None
    evidence = mutant.evidence if mutant.evidence in by else by[0]
    run_dir, report = campaigns[evidence]
    add_reproducers(run_dir, report, seconds, mutant.original, only=_SHRUNK_AS[evidence], most=1)
    records = report["shrink"]["reproducers"]
    return {"evidence": evidence, "directory": str(run_dir.name), **records[0]} if records else None


def _one_seed(
    output_dir: Path,
    mutant: Mutant,
    *,
    seed: int,
    kinds: Sequence[str],
    jobs: int,
    kills: int,
    pauses: int,
    cuts: int,
    shrink_seconds: float = 0,
) -> tuple[str, list[dict[str, str]], dict[str, Any] | None]:
    """Run the kinds of evidence asked for; what each one caught, and the reproducer shrunk
    from it (within ``shrink_seconds``; 0: none)."""
    system = resolve_system(mutant.spec)
    caught = []
    # Each campaign that ran, by the evidence it stands for: where a reproducer comes from.
    campaigns: dict[str, tuple[Path, dict[str, Any]]] = {}
    if CRASH_CAMPAIGN in kinds or PROBES in kinds:
        probes_only = CRASH_CAMPAIGN not in kinds
        directory = output_dir / ("probes" if probes_only else "campaign")
        campaign = run_campaign(
            directory,
            seed=seed,
            system=mutant.spec,
            probes=[name for name, _, _ in ALL_PROBES] if probes_only else None,
        )
        caught += _failures(campaign["anomalies"], "case ", CRASH_CAMPAIGN)
        caught += _failures(campaign["anomalies"], "probe ", PROBES)
        caught += _failures(campaign["anomalies"], "model workload: ", MODEL)
        campaigns.update(dict.fromkeys((CRASH_CAMPAIGN, PROBES, MODEL), (directory, campaign)))
    if POWER_LOSS_CAMPAIGN in kinds:
        directory = output_dir / "power-loss-campaign"
        power_loss = run_campaign(directory, seed=seed, system=mutant.spec, crash_mode=POWER_LOSS)
        caught += _failures(power_loss["anomalies"], "case ", POWER_LOSS_CAMPAIGN)
        campaigns[POWER_LOSS_CAMPAIGN] = (directory, power_loss)
    if DISK_FAULT_RUNS in kinds:
        disk = run_disk_faults(
            system, DISK_FAULT, output_dir / "disk-faults", count=1, seed=seed,
            steps=DISK_FAULT_STEPS, spec=mutant.spec,
        )  # fmt: skip
        if disk["anomalies"]:
            first, count = disk["anomalies"][0], str(len(disk["anomalies"]))
            caught.append({"by": DISK_FAULT_RUNS, "anomaly": first, "count": count})
    if CHAOS in kinds:
        chaos = run_chaos(
            output_dir / "chaos", seed=seed, jobs=jobs, workers=3, kills=kills, pauses=pauses,
            lease_ms=300, system=mutant.spec, crash_mode=POWER_LOSS, power_cuts=cuts,
        )  # fmt: skip
        if not chaos["ok"]:
            reasons = chaos.get("reasons") or chaos.get("anomalies") or ["not ok"]
            caught.append({"by": CHAOS, "anomaly": reasons[0], "count": str(len(reasons))})
    order = {kind: index for index, kind in enumerate(EVIDENCE)}
    caught.sort(key=lambda entry: order[entry["by"]])
    return system.name, caught, _reproducer(mutant, campaigns, caught, shrink_seconds)


def run_mutant(
    output_dir: Path,
    mutant: Mutant,
    *,
    seeds: Sequence[int],
    jobs: int,
    kills: int,
    pauses: int,
    cuts: int = 2,
    kinds: Sequence[str] = (),
    shrink_seconds: float = 0,
) -> dict[str, Any]:
    """One mutant through the evidence (all kinds unless named), once per seed; what caught
    it; and, within ``shrink_seconds``, its first seed's failure shrunk to a reproducer."""
    started = time.perf_counter()
    per_seed: list[dict[str, Any]] = []
    system = mutant.name
    reproducer = None
    for seed in seeds:
        system, caught_by, shrunk = _one_seed(
            output_dir / f"seed-{seed}",
            mutant,
            seed=seed,
            jobs=jobs,
            kills=kills,
            pauses=pauses,
            cuts=cuts,
            kinds=kinds or EVIDENCE,
            shrink_seconds=shrink_seconds if not per_seed else 0,
        )
        reproducer = reproducer or shrunk
        per_seed.append({"seed": seed, "caught_by": caught_by})
    # Evidence that caught it under every seed, with the first seed's anomaly as the example.
    always = set.intersection(*({e["by"] for e in run["caught_by"]} for run in per_seed))
    caught_by = [e for e in per_seed[0]["caught_by"] if e["by"] in always]
    sometimes = sorted({e["by"] for run in per_seed for e in run["caught_by"]} - always)
    because = None
    if not caught_by:
        because = "no evidence noticed it"
        if sometimes:
            because = f"only some seeds caught it ({', '.join(sometimes)})"
    return {
        "mutant": mutant.name,
        "system": system,
        "changes": mutant.changes,
        "caught": bool(caught_by),
        "caught_by": caught_by,
        "caught_by_some_seeds_only": sometimes,
        "per_seed": per_seed,
        "not_caught_because": because,
        "reproducer": reproducer,
        "seconds": round(time.perf_counter() - started, 3),
    }


def run_mutants(
    output_dir: Path,
    *,
    seed: int,
    names: Sequence[str] | None = None,
    seeds: int = 2,
    jobs: int = 300,
    kills: int = 15,
    pauses: int = 2,
    power_cuts: int = 2,
    named_evidence: bool = False,
    not_run: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    shrink_seconds: float = SHRINK_SECONDS,
) -> dict[str, Any]:
    """Every mutant (or the named ones); writes ``mutants.json``.

    With ``named_evidence`` each mutant runs only through the evidence the catalog names for
    it (the showcase's quick pass); otherwise through all of it. ``not_run`` names mutants
    left out and why (the showcase's power-loss mutants where the machine cannot cut the
    power): they count in the total and are listed as not run, never as caught.
    """
    known = {mutant.name: mutant for mutant in MUTANTS}
    left_out = dict(not_run or {})
    unknown = sorted((set(names or ()) | set(left_out)) - set(known))
    if unknown:
        raise InvalidInput("mutant", f"unknown {unknown}; known: {sorted(known)}")
    chosen = [known[name] for name in names] if names else list(MUTANTS)
    chosen = [mutant for mutant in chosen if mutant.name not in left_out]
    if not named_evidence or any(mutant.needs_power_loss for mutant in chosen):
        require_power_loss()
    prepare_output_directory(output_dir)
    used = [seed + offset for offset in range(seeds)]
    started = time.perf_counter()
    results = []
    progress = labelled(progress, "mutants")
    try:
        for index, mutant in enumerate(chosen):
            result = run_mutant(
                output_dir / mutant.name,
                mutant,
                seeds=used,
                jobs=jobs,
                kills=kills,
                pauses=pauses,
                cuts=power_cuts,
                kinds=(mutant.evidence,) if named_evidence else EVIDENCE,
                shrink_seconds=shrink_seconds,
            )
            results.append(result)
            if progress is not None:
                verdict = "caught" if result["caught"] else "NOT caught"
                progress(f"{index + 1}/{len(chosen)} {mutant.name}: {verdict}")
    except Interrupted as interruption:
        interruption.partial["mutants"] = results
        interruption.partial["mutants_done"] = len(results)
        interruption.partial["mutants_planned"] = len(chosen)
        raise
    missed = [result["mutant"] for result in results if not result["caught"]]
    skipped = [
        {"mutant": name, "changes": known[name].changes, "reason": reason}
        for name, reason in left_out.items()
    ]
    report = {
        # A mutant that did not run is neither caught nor missed: never ok.
        "ok": not missed and not skipped,
        "passed_what_ran": not missed,
        "complete": not skipped,
        "seed": seed,
        "seeds": used,
        "evidence": "named" if named_evidence else "all",
        "caught": len(results) - len(missed),
        "total": len(results) + len(skipped),
        "ran": len(results),
        "not_run": skipped,
        "missed": missed,
        "reasons": [
            f"mutant {result['mutant']} not caught: {result['not_caught_because']}"
            for result in results
            if not result["caught"]
        ],
        "mutants": results,
        "parameters": {
            "chaos_jobs": jobs,
            "chaos_kills": kills,
            "chaos_pauses": pauses,
            "chaos_power_cuts": power_cuts,
            "shrink_seconds": shrink_seconds,
        },
        "timings": {"total_s": round(time.perf_counter() - started, 3)},
    }
    write_json(output_dir / MUTANTS_FILE, report)
    return report
