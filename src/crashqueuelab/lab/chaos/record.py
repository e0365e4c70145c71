"""A chaos run's record, ``chaos.json``: what was asked, what was delivered, what the
accounting found and the verdict, with the artifacts the page and a replay read."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, restored, texts, to_json
from crashqueuelab.lab.chaos.fleet import ChaosRun
from crashqueuelab.lab.chaos.verdict import promises, reasons, worker_exited
from crashqueuelab.lab.chaos.worklog import WorkerLog, read_logs
from crashqueuelab.lab.faults.delivery import landed_count
from crashqueuelab.lab.faults.deploy import Rollout
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import NetworkPlan
from crashqueuelab.lab.runs.commands import import_path
from crashqueuelab.systems.contract import System

#: The job a reader's problem is about.
_JOB = re.compile(r"^job (\S+):")


def _deaths(run: ChaosRun, delivered: list[dict[str, Any]]) -> dict[str, float]:
    """Each worker the schedule's SIGKILL hit or that exited by itself, and when it died
    (monotonic seconds; an exit's moment is not known: infinity)."""
    died = {
        str(record["worker_id"]): run.state.started + float(record["at_s"])
        for record in delivered
        if record.get("kind") == FaultKind.KILL.value and "at_s" in record
    }
    for failure in run.state.failures:
        died.setdefault(str(failure["worker_id"]), math.inf)
    return died


def claims_cut(
    run: ChaosRun, delivered: list[dict[str, Any]], logs: dict[str, WorkerLog] | None = None
) -> dict[str, float]:
    """Each worker whose log ends inside a claim call (or its run of empty polls) and that
    died there (``_deaths``), and when it died. A claim may do more than take a job
    (dramatiq's adapter first moves due delayed messages to their queue), and a death
    between two of its steps leaves the store as it was."""
    died = _deaths(run, delivered)
    logs = read_logs(run.logs) if logs is None else logs
    return {worker: died[worker] for worker, log in sorted(logs.items())
            if log.claim_open and worker in died}  # fmt: skip


def chaos_findings_cut(
    run: ChaosRun, delivered: list[dict[str, Any]], findings: list[Anomaly]
) -> list[Anomaly]:
    """``findings``, each store-inconsistent one with what the run's deaths may have left
    of its job (``_cut_facts``)."""
    logs = read_logs(run.logs)
    cut = claims_cut(run, delivered, logs)
    dead = set(_deaths(run, delivered))
    return [
        _cut_facts(finding, cut, logs, dead) if finding.kind is Kind.STORE_INCONSISTENT else finding
        for finding in findings
    ]


def _cut_facts(finding: Anomaly, cut: dict[str, float], logs: dict[str, WorkerLog],
               dead: set[str]) -> Anomaly:  # fmt: skip
    """A store-inconsistent finding about one job, with what the deaths of the run may
    have left of it: ``claim_cut``, a worker died inside a claim call after an attempt of
    the job failed with a retry (a retry due then may have been half moved);
    ``report_cut``, a worker died with its report on the job begun and unanswered."""
    found = _JOB.match(str(finding.value("problem") or ""))
    if found is None:
        return finding.within("", claim_cut=False, report_cut=False)
    key = found.group(1)
    retries = [at for log in logs.values() for retried, at in log.retried if retried == key]
    claim = any(at < death for at in retries for death in cut.values())
    report = any(logs[worker].reporting == key for worker in dead if worker in logs)
    return finding.within("", claim_cut=claim, report_cut=report)


def chaos_record(
    run: ChaosRun,
    *,
    system: str,
    chosen: System,
    seed: int,
    crash_mode: str,
    notes: list[str],
    jobs: int,
    workers: int,
    kills: int,
    pauses: int,
    power_cuts: int,
    server_restarts: int,
    session_kills: int,
    failovers: int = 0,
    held_commits: int = 0,
    deploys: tuple[int, Rollout, dict[str, Any]],
    network: NetworkPlan,
    poison_count: int,
    long_jobs: set[int],
    lease_ms: int,
    batch: int,
    counts: dict[FaultKind, int],
    accounting: dict[str, Any],
    pause_anomalies: list[Anomaly],
    finished_in_time: bool,
    schedule_record: list[dict[str, Any]],
    replay_of: str | None,
    store: Path,
    output_dir: Path,
    elapsed: float,
) -> dict[str, Any]:
    """What ``run_chaos`` returns and writes to ``chaos.json`` for the finished ``run``:
    what it was asked, what landed, what the accounting found and the verdict."""
    started = run.state.started
    delivered = run.state.delivered
    kills_delivered = landed_count(delivered, FaultKind.KILL)
    pauses_delivered = landed_count(delivered, FaultKind.PAUSE)
    cuts_delivered = landed_count(delivered, FaultKind.POWER_CUT)
    restarts_delivered = landed_count(delivered, FaultKind.SERVER_RESTART)
    session_kills_delivered = landed_count(delivered, FaultKind.SESSION_KILL)
    deploy_count, rollout, deployed = deploys
    accounted = restored(accounting["anomalies"], accounting["findings"])
    findings = [
        *(worker_exited(failure) for failure in run.state.failures),
        *chaos_findings_cut(
            run, delivered, [finding for finding in accounted if isinstance(finding, Anomaly)]
        ),
        *pause_anomalies,
    ]
    report = {
        "system": chosen.describe(),
        "system_spec": system,
        "system_import_path": import_path(system),
        "seed": seed,
        "crash_mode": crash_mode,
        "notes": notes,
        "parameters": {
            "jobs": jobs,
            "workers": workers,
            "kills": kills,
            "pauses": pauses,
            "power_cuts": power_cuts,
            "server_restarts": server_restarts,
            "session_kills": session_kills,
            # Recorded where the run had them (a replicated server it started).
            **({"failovers": failovers} if failovers else {}),
            **({"held_commits": held_commits} if held_commits else {}),
            "deploys": deploy_count,
            # How a deploy stops workers, recorded where the run had deploys.
            **(rollout.to_json() if deploy_count else {}),
            **{
                name: value
                for name, value in network.to_json(lease_ms).items()
                if network.active or name != "window_ms"
            },
            "poison_jobs": poison_count,
            "long_jobs": len(long_jobs),
            "lease_ms": lease_ms,
            "batch": batch,
        },
        "kills_delivered": kills_delivered,
        "pauses_delivered": pauses_delivered,
        "power_cuts_delivered": cuts_delivered,
        "server_restarts_delivered": restarts_delivered,
        "session_kills_delivered": session_kills_delivered,
        "failovers_delivered": landed_count(delivered, FaultKind.FAILOVER),
        **(
            {"held_commits_delivered": landed_count(delivered, FaultKind.HELD_COMMITS)}
            if held_commits
            else {}
        ),
        "deploys_delivered": landed_count(delivered, FaultKind.DEPLOY),
        # Each deployed worker's end, and what became of the jobs the SIGKILLed ones held.
        "deploys": deployed,
        "network_faults_delivered": {
            kind.value: landed_count(delivered, kind) for kind in network.counts()
        },
        "network": run.network.report() if run.network is not None else None,
        "pauses_with_takeover": sum(1 for record in delivered if record.get("taken_over")),
        "pauses_fenced": sum(1 for record in delivered if record.get("fenced")),
        "respawns": run.state.respawns,
        "accounting": accounting,
        "worker_failures": run.state.failures,
        "anomalies": texts(findings),
        "findings": to_json(findings),
        "ok": (
            accounting["ok"]
            and not run.state.failures
            and not pause_anomalies
            and all(landed_count(delivered, kind) == count for kind, count in counts.items())
        ),
        "reasons": reasons(
            accounting,
            run.state.failures,
            texts(pause_anomalies),
            delivered,
            planned=counts,
            finished_in_time=finished_in_time,
            gave_up=run.state.gave_up,
        ),
        "finished_in_time": finished_in_time,
        # What was planned, as data: ``chaos --replay`` delivers it again.
        "schedule": schedule_record,
        "replay_of": replay_of,
        "faults": delivered,
        "artifacts": {
            "store_directory": str(store.relative_to(output_dir)),
            "idempotent_ledger": "effects-idempotent.sqlite",
            "non_idempotent_ledger": "executions-non-idempotent.sqlite",
            "worker_logs": "worker-logs",
        },
        "workers_started": run.state.workers,
        # The run's start on the machine's monotonic clock, which the worker logs also use.
        "started_monotonic_s": started,
        "timings": {"elapsed_s": round(elapsed, 3)},
    }
    report["promises"] = promises(chosen, crash_mode, report, run.state.gave_up)
    return report
