"""A chaos run judged: why it is not ok, what each paused worker was told of its late
acknowledgements, how each deployed worker ended and what became of the jobs it held, and
the run against the system's own promises."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, restored
from crashqueuelab.lab.chaos.worklog import WorkerLog, read_logs
from crashqueuelab.lab.faults.delivery import landed_count
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.systems.contract import System


def reasons(
    accounting: dict[str, Any],
    failures: list[dict[str, Any]],
    pause_anomalies: list[str],
    delivered: list[dict[str, Any]],
    *,
    planned: dict[FaultKind, int],
    finished_in_time: bool,
    gave_up: Anomaly | None = None,
) -> list[str]:
    """Why a run is not ok, one line each (empty when it is)."""
    reasons = [worker_exited(failure).text for failure in failures]
    if not finished_in_time:
        reasons.append(unfinished_work(gave_up).text)
    for kind, count in planned.items():
        landed = landed_count(delivered, kind)
        if landed != count:
            reasons.append(
                f"{count - landed} of {count} planned {kind.value}s not delivered"
                " (the work ended first or no worker could be hit)"
            )
    for name in (
        "lost",
        "unfinished",
        "dead",
        "unexpected",
        "duplicated_effects",
        "effects_missing",
    ):
        if accounting[name]:
            reasons.append(f"{name.replace('_', ' ')}: {accounting[name]}")
    if accounting["acknowledged_twice"]:
        reasons.append(f"jobs acknowledged twice: {accounting['acknowledged_twice']}")
    poison = accounting.get("poison", {}).get("anomalies", [])
    if poison:
        reasons.append(
            f"poison jobs not dead-lettered at their limit: {len(poison)} (first: {poison[0]})"
        )
    if accounting.get("overlapping_leases"):
        reasons.append(
            f"second leases granted while another was live: {accounting['overlapping_leases']}"
            f" (first: {accounting['overlapping_lease_proofs'][0]})"
        )
    if not accounting["judge_ok"]:
        reasons.append(
            f"the reader found the store inconsistent: {accounting['judge_problems'][:3]}"
        )
    if not all(accounting["integrity_check_ok"].values()):
        reasons.append(f"ledger integrity: {accounting['integrity_check_ok']}")
    return reasons + pause_anomalies


def worker_exited(failure: dict[str, Any]) -> Anomaly:
    """A worker that exited by itself (a failure the run recorded), as a finding."""
    return Anomaly(
        Kind.WORKER_EXITED,
        f"{failure['worker_id']} exited with status {failure['exit_code']}: {failure['error']}",
        facts={
            "worker": str(failure["worker_id"]),
            "status": int(failure["exit_code"]),
            "error": str(failure["error"]),
        },
    )


def unfinished_work(gave_up: Anomaly | None) -> Anomaly:
    """Why the run's work did not finish: why it stopped waiting, or its deadline."""
    if gave_up is not None:
        return gave_up
    return Anomaly(Kind.DEADLINE_PASSED, "the work did not finish before the deadline")


def judge_pauses(delivered: list[dict[str, Any]], log_dir: Path) -> list[Anomaly]:
    """What each paused worker was told about the leases it held when it was stopped.

    It was continued only after its leases' deadlines had passed or other workers had
    claimed its jobs, so every one of its late acknowledgements must have been refused.
    """
    logs = read_logs(log_dir)
    anomalies = []
    for record in delivered:
        held = {(key, token) for key, token in record.get("held_leases", ())}
        if record["kind"] != FaultKind.PAUSE.value or not held:
            continue
        log = logs.get(record["worker_id"])
        refused = set(log.stale) & held if log else set()
        accepted = set(log.acks) & held if log else set()
        # A worker killed soon after it was continued may never have heard an answer.
        record["late_acknowledgements"] = {
            "refused": len(refused),
            "accepted": len(accepted),
            "unanswered": len(held - refused - accepted),
        }
        record["fenced"] = not accepted
        anomalies += [
            Anomaly(
                Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
                f"job {key}: {record['worker_id']}, stopped past its lease, had its late "
                "acknowledgement accepted",
                job=key,
                facts={"worker": str(record["worker_id"]), "paused": True},
            )
            for key, _ in sorted(accepted)
        ]
    return anomalies


def promises(
    chosen: System, crash_mode: str, report: dict[str, Any], gave_up: Anomaly | None
) -> dict[str, Any]:
    """The run against the system's own promises, judged job by job (the reasons' counts
    say "unfinished" of a job the store still holds) with the run's stall; a fault the
    schedule could not deliver says nothing of the system."""
    judged = restored(report["anomalies"], report.get("findings"))
    if not report["finished_in_time"]:
        judged.append(unfinished_work(gave_up))
    kinds = sorted({str(record["kind"]) for record in report["faults"] if "at_s" in record})
    return classify(chosen, crash_mode, judged, kinds)


def judge_deploys(
    delivered: list[dict[str, Any]], logs: dict[str, WorkerLog], accounting: dict[str, Any]
) -> dict[str, Any]:
    """Each deployed worker classed (exited within its grace, or SIGKILLed at its end), and
    what became of every job a SIGKILLed one held: acknowledged later by another worker,
    lost, unfinished, or done in the store with no acknowledgement heard (its own, sent
    before the SIGKILL, had committed). Written into each deploy's record; the counts."""
    lost, unfinished = set(accounting["lost_keys"]), set(accounting["unfinished_keys"])
    acknowledgers: dict[str, list[str]] = {}
    for worker, log in sorted(logs.items()):
        for key, _ in log.acks:
            acknowledgers.setdefault(key, []).append(worker)
    stopped = [
        worker
        for record in delivered
        if record["kind"] == FaultKind.DEPLOY.value and "at_s" in record
        for worker in record["workers"]
    ]
    for worker in stopped:
        held = [*worker.get("held_when_killed", ()), *worker.get("unanswered_when_killed", ())]
        worker["fates"] = {key: _fate(key, worker, lost, unfinished, acknowledgers) for key in held}
    killed = [worker for worker in stopped if worker.get("killed_at_s") is not None]
    return {
        "workers_stopped": len(stopped),
        "exited_within_grace": sum(1 for worker in stopped if worker.get("exited_within_grace")),
        "exit_codes_within_grace": dict(
            sorted(
                Counter(
                    str(worker["exit_code"])
                    for worker in stopped
                    if worker.get("exited_within_grace")
                ).items()
            )
        ),
        "sigkilled": len(killed),
        "sigkilled_holding_jobs": sum(1 for worker in killed if worker["fates"]),
        "ended_by_power_cut": sum(1 for worker in stopped if worker.get("ended_by_power_cut")),
        "jobs_held_when_killed": dict(
            sorted(Counter(fate for worker in killed for fate in worker["fates"].values()).items())
        ),
    }


def _fate(
    key: str,
    worker: dict[str, Any],
    lost: set[str],
    unfinished: set[str],
    acknowledgers: dict[str, list[str]],
) -> str:
    """What became of ``key``, held by the SIGKILLed ``worker``."""
    if key in lost:
        return "lost"
    if key in unfinished:
        return "unfinished"
    others = [name for name in acknowledgers.get(key, ()) if name != worker["worker_id"]]
    if others:
        return "acknowledged by another worker"
    if key in acknowledgers:
        return "acknowledged by this worker"
    return "done in the store, no acknowledgement heard"
