"""``crashqueuelab mutants``: every mutant through the crash campaign (with its probes) and a
chaos run; which evidence caught it, naming the anomaly, or that nothing did."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.campaign import run_campaign
from crashqueuelab.lab.chaos.supervisor import run_chaos
from crashqueuelab.lab.mutants.catalog import MUTANTS, Mutant
from crashqueuelab.lab.reports import prepare_output_directory, write_json

MUTANTS_FILE = "mutants.json"
Progress = Callable[[str], None]


def _evidence(campaign: dict[str, Any], chaos: dict[str, Any]) -> list[dict[str, str]]:
    caught = []
    failed_cases = [line for line in campaign["anomalies"] if line.startswith("case ")]
    failed_probes = [line for line in campaign["anomalies"] if line.startswith("probe ")]
    if failed_cases:
        caught.append({"by": "crash campaign", "anomaly": failed_cases[0],
                       "count": str(len(failed_cases))})  # fmt: skip
    if failed_probes:
        caught.append({"by": "fencing probes", "anomaly": failed_probes[0],
                       "count": str(len(failed_probes))})  # fmt: skip
    if not chaos["ok"]:
        reasons = chaos.get("reasons") or chaos.get("anomalies") or ["not ok"]
        caught.append({"by": "chaos", "anomaly": reasons[0], "count": str(len(reasons))})
    return caught


def run_mutant(
    output_dir: Path, mutant: Mutant, *, seed: int, jobs: int, kills: int, pauses: int
) -> dict[str, Any]:
    """One mutant through the campaign and a chaos run; what caught it."""
    started = time.perf_counter()
    campaign = run_campaign(output_dir / "campaign", seed=seed, system=mutant.spec)
    chaos = run_chaos(
        output_dir / "chaos", seed=seed, jobs=jobs, workers=3, kills=kills, pauses=pauses,
        lease_ms=300, system=mutant.spec,
    )  # fmt: skip
    caught_by = _evidence(campaign, chaos)
    return {
        "mutant": mutant.name,
        "system": campaign["system"]["name"],
        "changes": mutant.changes,
        "caught": bool(caught_by),
        "caught_by": caught_by,
        "not_caught_because": None if caught_by else mutant.needs or "no evidence noticed it",
        "seconds": round(time.perf_counter() - started, 3),
    }


def run_mutants(
    output_dir: Path,
    *,
    seed: int,
    names: Sequence[str] | None = None,
    jobs: int = 300,
    kills: int = 15,
    pauses: int = 2,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every mutant (or the named ones); writes ``mutants.json``."""
    known = {mutant.name: mutant for mutant in MUTANTS}
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise InvalidInput("mutant", f"unknown {unknown}; known: {sorted(known)}")
    chosen = [known[name] for name in names] if names else list(MUTANTS)
    prepare_output_directory(output_dir)
    started = time.perf_counter()
    results = []
    for index, mutant in enumerate(chosen):
        result = run_mutant(
            output_dir / mutant.name, mutant, seed=seed, jobs=jobs, kills=kills, pauses=pauses
        )
        results.append(result)
        if progress is not None:
            verdict = "caught" if result["caught"] else "NOT caught"
            progress(f"{index + 1}/{len(chosen)} {mutant.name}: {verdict}")
    missed = [result["mutant"] for result in results if not result["caught"]]
    report = {
        "ok": not missed,
        "seed": seed,
        "seeds_used": 1,
        "caught": len(results) - len(missed),
        "total": len(results),
        "missed": missed,
        "reasons": [
            f"mutant {result['mutant']} not caught: {result['not_caught_because']}"
            for result in results
            if not result["caught"]
        ],
        "mutants": results,
        "parameters": {"chaos_jobs": jobs, "chaos_kills": kills, "chaos_pauses": pauses},
        "timings": {"total_s": round(time.perf_counter() - started, 3)},
    }
    write_json(output_dir / MUTANTS_FILE, report)
    return report
