"""Jepsen-style accounting of a finished chaos run, from the retained files alone.

Every submitted job must end succeeded (nothing lost from the store, nothing left
unfinished in it, nothing dead-lettered), every
succeeded job must have exactly one durable effect in the idempotent ledger (nothing
duplicated, nothing missing), no ledger may hold an effect for a job that was never
submitted, the store must pass its system's independent reader, no job may have been
acknowledged twice as far as the workers were told (a second accepted acknowledgement means
the system accepted a stale one), and no job may have had two live leases at once, as the
workers' logs prove it (``overlaps.py``), whatever the acknowledgements did afterwards.
Each anomaly is named: the job and what happened.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, inconsistent, texts, to_json
from crashqueuelab.judges.readonly import open_read_only
from crashqueuelab.lab.chaos.overlaps import overlapping_leases
from crashqueuelab.lab.chaos.poison import PoisonJob, judge_poison
from crashqueuelab.lab.chaos.worklog import (
    WorkerLog,
    accepted_per_key,
    read_logs,
    shared_commit_totals,
)
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.workloads.effects import LEDGER_SCHEMA
from crashqueuelab.systems.contract import JobStatus, System


def _ledger_rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = open_read_only(
        path,
        application_id=LEDGER_SCHEMA.application_id,
        versions=(LEDGER_SCHEMA.version,),
        what="crashqueuelab effect ledger",
    )
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _integrity(path: Path) -> bool:
    try:
        return _ledger_rows(path, "PRAGMA integrity_check") == [("ok",)]
    except sqlite3.DatabaseError:
        return False


def stale_rejections(logs: dict[str, WorkerLog]) -> int:
    """Acknowledgements the lease fencing refused, as the workers logged them."""
    return sum(len(log.stale) for log in logs.values())


def _double_acknowledgements(logs: dict[str, WorkerLog]) -> list[Anomaly]:
    accepted = accepted_per_key(logs)
    lines = []
    for key, count in sorted(accepted.items()):
        if count > 1:
            holders = [
                f"{worker} (lease {token})"
                for worker, log in sorted(logs.items())
                for acked, token in log.acks
                if acked == key
            ]
            lines.append(
                Anomaly(
                    Kind.ACKNOWLEDGED_TWICE,
                    f"job {key}: acknowledged {count} times, by {', '.join(holders)}",
                    job=key,
                    facts={"times": count},
                )
            )
    return lines


#: Where the workers' logs last saw a missing job (the fact ``last_seen`` of ``lost``):
#: held by a worker that never answered for it, taken by none while some workers' logs end
#: inside a claim call, or neither.
HELD, CLAIMING, UNSEEN = "held", "claiming", "unseen"


def _last_holders(logs: Mapping[str, WorkerLog], missing: list[str]) -> dict[str, tuple[str, str]]:
    """Why each missing job may be gone, as the workers' logs tell it (the words, and
    ``HELD`` or ``CLAIMING``): the worker whose log ends holding it (claimed, never answered
    for), or, for a job no log names, how many workers' logs end inside a claim call (one
    stopped there may have taken a job it never logged)."""
    holders: dict[str, list[str]] = {}
    for worker, log in sorted(logs.items()):
        unanswered = set(log.acking) - set(log.acks) - set(log.stale)
        for key, _ in sorted(log.held() | unanswered):
            holders.setdefault(key, []).append(worker)
    words = {
        key: (f"; claimed by {', '.join(workers)}, which never answered for it", HELD)
        for key, workers in holders.items()
    }
    unnamed = [key for key in missing if key not in words]
    inside = sum(1 for log in logs.values() if log.claim_open)
    if unnamed and inside >= len(unnamed):
        for key in unnamed:
            words[key] = (
                f"; in no worker's log, and {inside} workers' logs end inside a claim call,"
                f" for {len(unnamed)} such job{'' if len(unnamed) == 1 else 's'}",
                CLAIMING,
            )
    return words


def _lost(key: str, why: str, last_seen: str) -> Anomaly:
    return Anomaly(
        Kind.LOST,
        f"job {key}: missing from the store (lost{why})",
        job=key,
        facts={"last_seen": last_seen, "poison": False},
    )


def unknown_outcomes(logs: Mapping[str, WorkerLog]) -> list[tuple[str, str]]:
    """Each (key, token) a worker sent an acknowledgement for and never logged an answer to."""
    unknown = []
    for log in logs.values():
        answered = set(log.acks) | set(log.stale)
        unknown += sorted(set(log.acking) - answered)
    return unknown


def judge_run(
    *,
    system: System,
    store: Path,
    effects: Path,
    executions: Path,
    keys: list[str],
    log_dir: Path,
    poison: list[PoisonJob] | None = None,
    lease_s: float | None = None,
    started_s: float = 0.0,
) -> dict[str, Any]:
    """The accounting of one run; ``ok`` only when nothing was lost, duplicated or inconsistent.

    ``lease_s`` is the lease every claim asked for: with it, the workers' logs are searched
    for two live leases on one job (times said from ``started_s``).
    """
    submitted = set(keys)
    poisoned = list(poison or [])
    reading = read_store(system, store, keys + [job.key for job in poisoned])
    poison_anomalies = judge_poison(poisoned, reading.jobs)
    stored = {key: job for key, job in reading.jobs.items() if key in submitted}
    missing = sorted(submitted - set(stored))
    unfinished = sorted(key for key, job in stored.items() if not job.status.is_terminal)
    dead = sorted(key for key, job in stored.items() if job.status is JobStatus.DEAD)
    succeeded = [key for key, job in stored.items() if job.status is JobStatus.SUCCEEDED]
    effect_counts = Counter(
        str(row[0]) for row in _ledger_rows(effects, "SELECT effect_key FROM effects")
    )
    execution_counts = Counter(
        str(row[0]) for row in _ledger_rows(executions, "SELECT effect_key FROM effects")
    )
    absorbed = int(_ledger_rows(effects, "SELECT count(*) FROM absorbed")[0][0])
    duplicated = sorted(key for key, count in effect_counts.items() if count > 1)
    effects_missing = sorted(key for key in succeeded if effect_counts[key] == 0)
    unexpected = sorted((set(effect_counts) | set(execution_counts)) - submitted)
    executions_total = sum(execution_counts.values())
    logs = read_logs(log_dir)
    double_acks = _double_acknowledgements(logs)
    overlaps = (
        [] if lease_s is None else overlapping_leases(logs, lease_s=lease_s, started_s=started_s)
    )
    integrity = {"effects": _integrity(effects), "executions": _integrity(executions)}
    unknown = unknown_outcomes(logs)
    settled = Counter(
        "missing" if key not in stored else stored[key].status.value for key, _ in unknown
    )
    holders = _last_holders(logs, missing)
    anomalies = (
        [_lost(key, *holders.get(key, ("", UNSEEN))) for key in missing]
        + [
            Anomaly(
                Kind.UNFINISHED,
                f"job {key}: still {stored[key].native_state} after the run (unfinished, not"
                " lost: the store holds it)",
                job=key,
                attempt=stored[key].attempts,
                facts={"state": stored[key].native_state, "poison": False},
            )
            for key in unfinished
        ]
        + [Anomaly(Kind.DEAD_LETTERED, f"job {key}: dead-lettered", job=key) for key in dead]
        + [
            Anomaly(
                Kind.EFFECT_DUPLICATED,
                f"job {key}: {effect_counts[key]} durable effects in the idempotent ledger",
                job=key,
                facts={"effects": effect_counts[key]},
            )
            for key in duplicated
        ]
        + [
            Anomaly(Kind.EFFECT_MISSING, f"job {key}: succeeded with no durable effect", job=key)
            for key in effects_missing
        ]
        + [
            Anomaly(Kind.EFFECT_NOT_SUBMITTED, f"effect {key}: for a job never submitted", job=key)
            for key in unexpected
        ]
        + double_acks
        + overlaps
        + poison_anomalies
        + [inconsistent(problem, "judge: ") for problem in reading.problems]
    )
    # Lost is gone from the store; a job the store still holds that never finished is the
    # run's stall (liveness), never counted as lost.
    lost = len(missing)
    result = {
        "submitted": len(submitted),
        "succeeded": len(succeeded),
        "dead": len(dead),
        "lost": lost,
        "lost_keys": missing,
        "unfinished": len(unfinished),
        "unfinished_keys": unfinished,
        "unexpected": len(unexpected),
        "duplicated_effects": sum(effect_counts[key] - 1 for key in duplicated),
        "effects_missing": len(effects_missing),
        "durable_effects": sum(effect_counts.values()),
        "executions": executions_total,
        "redelivered_executions": executions_total - len(execution_counts),
        "absorbed_duplicates": absorbed,
        "stale_operations_rejected": stale_rejections(logs),
        "shared_commits": shared_commit_totals(logs),
        "acknowledged_twice": len(double_acks),
        # Acknowledgements sent whose answer never came (the worker died or was paused past
        # the run first): unknown, never counted as done or lost; the store settles each job.
        "unknown_outcomes": len(unknown),
        "unknown_outcomes_settled": dict(sorted(settled.items())),
        "poison": {
            "submitted": len(poisoned),
            "dead_lettered_at_their_limit": len(poisoned) - len(poison_anomalies),
            "anomalies": texts(poison_anomalies),
        },
        "overlapping_leases": len(overlaps),
        "overlapping_lease_proofs": texts(overlaps),
        "judge": reading.judge,
        "judge_ok": reading.ok,
        "judge_problems": list(reading.problems),
        "integrity_check_ok": integrity,
        "anomalies": texts(anomalies),
        "findings": to_json(anomalies),
    }
    result["ok"] = (
        lost == 0
        and not unfinished
        and not dead
        and not duplicated
        and not effects_missing
        and not unexpected
        and not double_acks
        and not overlaps
        and not poison_anomalies
        and reading.ok
        and all(integrity.values())
    )
    return result
