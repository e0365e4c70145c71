"""A chaos run's record, ``chaos.json``: what was asked, what was delivered, what the
accounting found and the verdict, with the artifacts the page and a replay read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, restored, texts, to_json
from crashqueuelab.lab.chaos.fleet import ChaosRun
from crashqueuelab.lab.chaos.verdict import promises, reasons, worker_exited
from crashqueuelab.lab.chaos.worklog import read_logs
from crashqueuelab.lab.faults.delivery import landed_count
from crashqueuelab.lab.faults.deploy import Rollout
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import NetworkPlan
from crashqueuelab.lab.runs.commands import import_path
from crashqueuelab.systems.contract import System


def claims_cut(run: ChaosRun, delivered: list[dict[str, Any]]) -> list[str]:
    """The workers whose log ends inside a claim call and that died there: SIGKILLed by the
    schedule, or exited by themselves. A claim may do more than take a job (dramatiq's
    adapter first moves due delayed messages to their queue): a store a death left between
    two of those steps reads as it was left, which the store-inconsistent findings of the
    run say (``claim_cut``)."""
    killed = {str(record["worker_id"]) for record in delivered
              if record.get("kind") == FaultKind.KILL.value and "at_s" in record}  # fmt: skip
    exited = {str(failure["worker_id"]) for failure in run.state.failures}
    logs = read_logs(run.logs)
    return sorted(
        worker for worker, log in logs.items() if log.claim_open and worker in killed | exited
    )


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
    cut = claims_cut(run, delivered)
    findings = [
        *(worker_exited(failure) for failure in run.state.failures),
        *(
            finding.within("", claim_cut=bool(cut))
            if finding.kind is Kind.STORE_INCONSISTENT
            else finding
            for finding in accounted
            if isinstance(finding, Anomaly)
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
