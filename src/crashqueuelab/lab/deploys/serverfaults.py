"""What a deploy run's server faults did, for its record and its verdict: how soon the
workers took a job after each failover's promotion, each restart of the server and which
server it was, a restart that left the run without a server, and the fault kinds the
verdict weighs (``deploys --failovers``, ``--server-restarts``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from crashqueuelab.lab.deploys.plan import DeployPlan
from crashqueuelab.lab.deploys.rollout import Rollout
from crashqueuelab.lab.deploys.serverrestarts import RESTART_WAIT_S
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.runs.executions import Execution
from crashqueuelab.systems.contract import System


def _waits(
    keys: Sequence[str],
    submitted: dict[str, float],
    executions: Sequence[Execution],
) -> dict[str, Any]:
    """How long each of ``keys`` waited from its submission to its first start (those
    never started counted apart): the median and the longest."""
    waits, never = [], 0
    for key in keys:
        at = submitted[key]
        starts = [run.start_s for run in executions if run.key == key and run.start_s >= at]
        if starts:
            waits.append(min(starts) - at)
        else:
            never += 1
    return {
        "jobs": len(keys),
        "never_started": never,
        "wait_s": None
        if not waits
        else {"median": round(statistics.median(waits), 3), "max": round(max(waits), 3)},
    }


def failover_wakeups(
    failovers: Sequence[dict[str, Any]],
    submitted: dict[str, float],
    executions: Sequence[Execution],
    spread: Sequence[str] = (),
) -> dict[str, Any]:
    """How soon the workers took a job before the first failover and after each promotion
    (until the next failover): a worker woken by LISTEN/NOTIFY takes a job at once, one
    that lost its wake-ups waits for its poll. Only the jobs submitted one by one
    (``spread``: not the burst at the run's start, which waits behind itself) are
    counted."""
    first_at = failovers[0]["at_s"] if failovers else float("inf")
    before = [key for key in spread if key in submitted and submitted[key] < first_at]
    after = []
    for index, failover in enumerate(failovers):
        promoted = failover["promoted_at_s"]
        until = failovers[index + 1]["at_s"] if index + 1 < len(failovers) else float("inf")
        keys = [key for key in spread if key in submitted and promoted <= submitted[key] < until]
        first = [run.start_s for run in executions if run.start_s >= promoted]
        after.append(
            {
                "at_s": failover["at_s"],
                "promoted_at_s": promoted,
                "promoted_s": failover["promoted_s"],
                "lag_before": failover.get("before", {}),
                **_waits(keys, submitted, executions),
                "first_start_after_promotion_s": None
                if not first
                else round(min(first) - promoted, 3),
            }
        )
    return {"before_the_first": _waits(before, submitted, executions), "failovers": after}


def fault_kinds(system: System, restarted: Sequence[object]) -> list[str]:
    """The chaos fault kinds the run delivered to the system's store: a restart of its
    server, whose persistence explains what it took back (not a RabbitMQ node's: a library
    on it keeps its results in Redis, which a broker's crash does not touch)."""
    return [FaultKind.SERVER_RESTART.value] if restarted and system.broker != "rabbitmq" else []


def restart_failed(run: Rollout) -> None:
    """A restart that failed, or still ran, once the run ended is the run's error (its
    server is not serving what the judges read), even after the rollout stopped."""
    restarts = run.server_restarts
    if restarts is None or "server" in run.failed:
        return
    if restarts.busy():
        run.failed["server"] = (
            f"the server was still restarting {RESTART_WAIT_S:g} s after the rollout ended"
        )
    elif restarts.error is not None:
        run.failed["server"] = f"the server did not start again: {restarts.error}"


def server_faults(
    system: System,
    plan: DeployPlan,
    run: Rollout,
    executions: Sequence[Execution],
    planned: Sequence[tuple[float, str]],
) -> dict[str, Any]:
    """What the run's failovers or server restarts did, for its record (none: nothing)."""
    if not plan.failovers and run.server_restarts is None:
        return {}
    faults: dict[str, Any] = {
        "restarted_after_exit": run.restarted,
        "submissions_that_raised": run.submit_failures,
    }
    if run.server_restarts is not None:
        # A copy: a restart still under way (the run's error) must not change the record.
        restarts = [dict(each) for each in run.server_restarts.done]
        faults["server_restarts"] = {"server": server_name(system), "restarts": restarts}
    if plan.failovers:
        later = [key for at, key in planned if at > 0]
        faults["failovers"] = failover_wakeups(run.failovers, run.submitted, executions, later)
    return faults


def server_name(system: System) -> str:
    """The server a restart crashes: the broker, for a library on RabbitMQ."""
    if system.broker == "rabbitmq":
        return "its RabbitMQ node"
    return {"redis": "its Redis server", "postgres": "its PostgreSQL server"}.get(
        system.server or "", "its server"
    )
