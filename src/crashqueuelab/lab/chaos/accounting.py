"""Jepsen-style accounting of a finished chaos run, from the retained databases alone.

Every submitted job must end SUCCEEDED (nothing lost, nothing dead-lettered), every
succeeded job must have exactly one durable effect in the idempotent ledger (nothing
duplicated, nothing missing), no ledger may hold an effect for a job that was never
submitted, and the queue database must pass replay and every invariant.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = _read_only(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _integrity(path: Path) -> bool:
    return _rows(path, "PRAGMA integrity_check") == [("ok",)]


def stale_rejections(log_dir: Path) -> int:
    """Acknowledgements the lease fencing rejected, as the workers logged them."""
    return sum(
        1
        for log in sorted(log_dir.glob("*.log"))
        for line in log.read_text().splitlines()
        if line.startswith("stale ")
    )


def judge_run(
    *, queue: Path, effects: Path, executions: Path, effect_keys: list[str], log_dir: Path
) -> dict[str, Any]:
    """The accounting of one run; ``ok`` only when nothing was lost, duplicated or inconsistent."""
    submitted = set(effect_keys)
    states: dict[str, str] = {}
    for payload, state in _rows(queue, "SELECT payload_json, state FROM jobs"):
        states[str(json.loads(payload).get("effect_key"))] = str(state)
    by_state = Counter(states[key] for key in submitted if key in states)
    missing = sorted(submitted - set(states))
    unfinished = sorted(
        key for key in submitted if states.get(key) in ("QUEUED", "LEASED", "RETRY_SCHEDULED")
    )
    effect_counts = Counter(str(row[0]) for row in _rows(effects, "SELECT effect_key FROM effects"))
    execution_counts = Counter(
        str(row[0]) for row in _rows(executions, "SELECT effect_key FROM effects")
    )
    absorbed = int(_rows(effects, "SELECT count(*) FROM absorbed")[0][0])
    succeeded = [key for key in submitted if states.get(key) == "SUCCEEDED"]
    duplicated = sum(count - 1 for count in effect_counts.values() if count > 1)
    effects_missing = sum(1 for key in succeeded if effect_counts[key] == 0)
    unexpected = sorted((set(effect_counts) | set(execution_counts)) - submitted)
    executions_total = sum(execution_counts.values())
    invariants = check_database(queue)
    replay = replay_database(queue)
    integrity = {
        "queue": _integrity(queue),
        "effects": _integrity(effects),
        "executions": _integrity(executions),
    }
    lost = len(missing) + len(unfinished)
    result = {
        "submitted": len(submitted),
        "succeeded": len(succeeded),
        "dead": by_state.get("DEAD", 0),
        "lost": lost,
        "lost_examples": (missing + unfinished)[:10],
        "unexpected": len(unexpected),
        "duplicated_effects": duplicated,
        "effects_missing": effects_missing,
        "durable_effects": sum(effect_counts.values()),
        "executions": executions_total,
        "redelivered_executions": executions_total - len(execution_counts),
        "absorbed_duplicates": absorbed,
        "stale_operations_rejected": stale_rejections(log_dir),
        "invariants_ok": invariants.ok,
        "invariants_failed": invariants.failed(),
        "replay_ok": replay.ok,
        "replay_mismatches": len(replay.mismatches),
        "integrity_check_ok": integrity,
    }
    result["ok"] = (
        lost == 0
        and result["dead"] == 0
        and duplicated == 0
        and effects_missing == 0
        and not unexpected
        and invariants.ok
        and replay.ok
        and all(integrity.values())
    )
    return result
