"""Judging a RabbitMQ failover run from its artifacts alone: the ledger (every confirm,
delivery and acknowledgement the clients were given) and the final reading of the queue
(``rabbitmqctl list_queues``, kept as a file). Nothing here imports a client or talks to a
server.

A message queue keeps no row per job to read at the end, as a database queue does: an
acknowledged message is gone from it. So each job is judged by its deliveries, and the final
reading says only whether anything is left:

- a **lost enqueue**: a copy of the job was confirmed to the publisher, no copy was ever
  delivered, and the queue was empty at the end (with messages left, an undelivered job is
  listed as ``undelivered``, not judged lost);
- a **resurrected completion**: a delivery was acknowledged (the channel answered a call
  made after the acknowledgement), and the same message was delivered again afterwards;
- a **duplicate effect**: the job was delivered again after one of its deliveries was
  acknowledged, of the same message or of another copy the producer published after a
  publish it was not told the outcome of.

Each is held against what the run's queue type promises (``promises.rabbit_promise``): a
quorum queue promises no confirmed message is lost while a majority of its nodes lives; a
mirrored queue loses what only its dead leader had when no mirror was synchronised
(documented where ``ha-promote-on-failure`` is ``always``, a broken promise otherwise or when
a synchronised mirror was there); a redelivery after an acknowledgement is documented for
both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from crashqueuelab.lab.failover.workload import COMPLETED, ENQUEUED, EXECUTED

KINDS = ("lost_enqueues", "resurrected_completions", "duplicate_effects")


def failover_of(failovers: Sequence[Mapping[str, Any]], at_s: float) -> int | None:
    """The failover an acknowledgement at ``at_s`` went into: the first whose new leader was
    named after it."""
    for index, failover in enumerate(failovers):
        if at_s <= failover.get("promoted_at_s", failover["killed_at_s"]):
            return index
    return None


def _loss_allowed(
    promise: Mapping[str, Any], failovers: Sequence[Mapping[str, Any]], index: int | None
) -> bool:
    """Whether the documentation allows losing a confirmed message at failover ``index``."""
    if not promise["allows_loss"] or index is None:
        return False
    if not promise.get("lost_only_unsynchronised"):
        return True
    before = failovers[index].get("before", {})
    return not before.get("synchronised_mirrors")


def judge_deliveries(
    *,
    promise: Mapping[str, Any],
    keys: Sequence[str],
    events: Sequence[Mapping[str, Any]],
    failovers: Sequence[Mapping[str, Any]],
    messages_left: int | None,
) -> dict[str, Any]:
    """The findings, their counts, and the verdict against ``promise``; ``messages_left``:
    the final reading's count of the queue's messages (None: it could not be read)."""
    confirmed: dict[str, float] = {}
    copies: dict[str, set[int]] = defaultdict(set)
    deliveries: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    acknowledged: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for event in events:
        key = event.get("key")
        if key is None:
            continue
        if event["event"] == ENQUEUED:
            confirmed.setdefault(key, event["at_s"])
            copies[key].add(event["copy"])
        elif event["event"] == EXECUTED:
            deliveries[key].append(event)
        elif event["event"] == COMPLETED:
            acknowledged[key].append(event)

    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    undelivered: list[str] = []
    for key in keys:
        if key in confirmed and not deliveries[key]:
            if messages_left == 0:
                at = confirmed[key]
                found["lost_enqueues"].append(
                    {"key": key, "acknowledged_at_s": at, "failover": failover_of(failovers, at)}
                )
            else:
                undelivered.append(key)
        if not acknowledged[key]:
            continue
        first = acknowledged[key][0]
        for ack in acknowledged[key]:
            again = [
                each
                for each in deliveries[key]
                if each["copy"] == ack["copy"] and each["at_s"] > ack["at_s"]
            ]
            if again:
                found["resurrected_completions"].append(
                    {
                        "key": key,
                        "copy": ack["copy"],
                        "acknowledged_at_s": ack["at_s"],
                        "delivered_again_at_s": again[0]["at_s"],
                        "redelivered_flag": again[0]["redelivered"],
                        "failover": failover_of(failovers, ack["at_s"]),
                    }
                )
                break
        later = [each for each in deliveries[key] if each["at_s"] > first["at_s"]]
        if later:
            found["duplicate_effects"].append(
                {
                    "key": key,
                    "deliveries": len(deliveries[key]),
                    "copies_delivered": len({each["copy"] for each in deliveries[key]}),
                    "acknowledged_at_s": first["at_s"],
                    "same_message_again": any(each["copy"] == first["copy"] for each in later),
                }
            )

    broken = sum(
        1
        for item in found["lost_enqueues"]
        if not _loss_allowed(promise, failovers, item["failover"])
    )
    anomalies = sum(len(found[kind]) for kind in KINDS)
    affected = sorted({item["key"] for kind in KINDS for item in found[kind]})
    return {
        "level": promise["setting"],
        "promise": dict(promise),
        "jobs": len(keys),
        "enqueues_acknowledged": len(confirmed),
        "completions_acknowledged": sum(1 for key in keys if acknowledged[key]),
        "executions": sum(len(each) for each in deliveries.values()),
        "copies_confirmed": sum(len(each) for each in copies.values()),
        "jobs_confirmed_twice": sorted(key for key, each in copies.items() if len(each) > 1),
        **found,
        "undelivered": undelivered,
        "messages_left": messages_left,
        "counts": {kind: len(found[kind]) for kind in KINDS}
        | {"undelivered": len(undelivered), "jobs_affected": len(affected)},
        "documented": anomalies - broken,
        "broken_promises": broken,
        "contract_held": anomalies == 0,
        "ok": broken == 0,
    }
