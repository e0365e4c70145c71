"""Judging a failover run from its artifacts alone: the ledger (what the queue told its
callers), each failover's record and snapshot (the promoted standby's rows, read by the
judges' own SQL), and the final reading. Nothing here imports the queue or talks to a server.

Per job, four things a failover can do to acknowledged work:

- a **lost enqueue**: its submission was acknowledged, and the final store has no such job;
- a **resurrected completion**: its completion was acknowledged, and afterwards it was
  executed again, or it did not end succeeded;
- a **lease that came back**: the promoted standby holds the job leased under the very
  attempt whose completion had been acknowledged before the failover (the old holder has
  moved on; the job waits for that lease to run out);
- a **duplicate effect**: the job was executed again after one of its executions had been
  acknowledged (the effect happened twice where the queue promised once).

Each is held against what the run's ``synchronous_commit`` level promises (``promises``): a
loss the level allows is documented, any other is a broken promise. A job the restarted
primary showed (its commit waited for the standby when the primary died) and the promoted
standby no longer has is listed apart: PostgreSQL documents that such a commit "may not show
as committed on the standby"; the queue breaks its own promise only if it acknowledged it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from crashqueuelab.lab.failover.promises import MOST_ADVANCED, promise_of
from crashqueuelab.lab.failover.workload import COMPLETED, ENQUEUED, EXECUTED
from crashqueuelab.systems.contract import JobStatus

#: A store's jobs as a reading gives them: key -> [status in the lab's words, attempts].
Rows = Mapping[str, Sequence[Any]]
KINDS = ("lost_enqueues", "resurrected_completions", "leases_came_back", "duplicate_effects")


def _failover_at(failovers: Sequence[Mapping[str, Any]], at_s: float) -> int | None:
    """The failover an acknowledgement at ``at_s`` went into: the first one whose standby
    was promoted after it (an answer written down between the kill and the promotion came
    from the old primary)."""
    for index, failover in enumerate(failovers):
        if at_s <= failover.get("promoted_at_s", failover["killed_at_s"]):
            return index
    return None


def _demoted_at(failover: Mapping[str, Any]) -> float:
    """When a paused primary was seen demoted to a replica, on the run's clock."""
    began = failover["killed_at_s"] - failover["primary_killed_s"]
    return float(began + failover["demoted_s"])


def judge_failovers(
    *,
    level: str,
    keys: Sequence[str],
    events: Sequence[Mapping[str, Any]],
    failovers: Sequence[Mapping[str, Any]],
    final: Rows,
    standbys: int = 1,
    promote: str = MOST_ADVANCED,
) -> dict[str, Any]:
    """The findings, their counts, and the verdict against the level's promise (with
    ``standbys`` and the failover's ``promote`` rule, which bound it)."""
    enqueued: dict[str, float] = {}
    completions: dict[str, list[tuple[int, float]]] = defaultdict(list)
    executions: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for event in events:
        key = event.get("key")
        if key is None:
            continue
        if event["event"] == ENQUEUED:
            enqueued.setdefault(key, event["at_s"])
        elif event["event"] == COMPLETED:
            completions[key].append((event["attempt"], event["at_s"]))
        elif event["event"] == EXECUTED:
            executions[key].append((event["attempt"], event["at_s"]))

    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for key in keys:
        if key in enqueued and key not in final:
            at = enqueued[key]
            found["lost_enqueues"].append(
                {"key": key, "acknowledged_at_s": at, "failover": _failover_at(failovers, at)}
            )
        if not completions[key] or key not in final:
            # A job whose enqueue was lost took its acknowledged completion with it.
            continue
        attempt, acknowledged = completions[key][0]
        again = [at for _, at in executions[key] if at > acknowledged]
        state = final[key][0]
        if again or state != JobStatus.SUCCEEDED:
            found["resurrected_completions"].append(
                {
                    "key": key,
                    "attempt": attempt,
                    "acknowledged_at_s": acknowledged,
                    "executed_again_at_s": again[0] if again else None,
                    "final_state": state,
                    "failover": _failover_at(failovers, acknowledged),
                }
            )
        if again:
            found["duplicate_effects"].append(
                {"key": key, "executions": len(executions[key]), "acknowledged_at_s": acknowledged}
            )
        for index, failover in enumerate(failovers):
            row = failover.get("snapshot", {}).get(key)
            done_before = [a for a, at in completions[key] if at <= failover["killed_at_s"]]
            if row is not None and row[0] == JobStatus.LEASED and row[1] in done_before:
                found["leases_came_back"].append({"key": key, "attempt": row[1], "failover": index})

    visible_then_lost = []
    for index, failover in enumerate(failovers):
        shown = failover.get("restarted_primary_showed")
        if shown is None:
            continue
        after = failover.get("snapshot", {})
        for key, row in sorted(shown.items()):
            if key not in after or list(after[key]) != list(row):
                visible_then_lost.append(
                    {
                        "key": key,
                        "failover": index,
                        "restarted_primary_showed": list(row),
                        "promoted_standby_has": list(after[key]) if key in after else None,
                        "acknowledged_enqueue": key in enqueued,
                    }
                )

    # A primary paused or cut off (not killed) still answers as a primary once its clients
    # reach it, until a Sentinel demotes it: what it acknowledged after the fault struck,
    # no standby ever had (the replica is promoted, or cut off from it, from then on).
    resumed = [
        (failover["killed_at_s"], _demoted_at(failover))
        for failover in failovers
        if "demoted_s" in failover
    ]
    by_the_resumed = [
        item
        for item in found["lost_enqueues"]
        if any(after < item["acknowledged_at_s"] <= until for after, until in resumed)
    ]
    promise = promise_of(level, standbys, promote)
    anomalies = sum(len(found[kind]) for kind in KINDS)
    affected = sorted({item["key"] for kind in KINDS for item in found[kind]})
    broken = 0 if promise["allows_loss"] else anomalies
    return {
        "level": level,
        "promise": promise,
        "jobs": len(keys),
        "enqueues_acknowledged": len(enqueued),
        "completions_acknowledged": sum(1 for key in keys if completions[key]),
        "executions": sum(len(runs) for runs in executions.values()),
        **found,
        "visible_then_lost": visible_then_lost,
        "counts": {kind: len(found[kind]) for kind in KINDS}
        | {"visible_then_lost": len(visible_then_lost), "jobs_affected": len(affected)}
        | ({"lost_from_the_old_primary_after_the_fault": len(by_the_resumed)} if resumed else {}),
        "documented": anomalies - broken,
        "broken_promises": broken,
        "contract_held": anomalies == 0,
        "ok": broken == 0,
    }
