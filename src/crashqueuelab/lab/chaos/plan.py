"""A chaos run planned: the parameters checked and the faults scheduled, before anything
starts, so a run that could not deliver what it plans is refused up front."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.validation import require_int
from crashqueuelab.lab.chaos.schedule import SPAN, PlannedFault, plan, recorded
from crashqueuelab.lab.faults.crashmodes import check_crash_mode
from crashqueuelab.lab.faults.deploy import Rollout
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import WINDOW_OF, NetworkPlan
from crashqueuelab.lab.runs.modes import POWER_LOSS
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.registry import resolve_system

#: More worker processes than this would only measure the machine's process table.
MAX_WORKERS = 64


def runnable(
    system: str,
    crash_mode: str,
    counts: Mapping[FaultKind, int],
    *,
    jobs: int,
    workers: int,
    network: NetworkPlan,
    restart_server: Callable[[], None] | None,
    rollout: Rollout | None = None,
    fail_over: Callable[[], Any] | None = None,
    hold_commits: Callable[[], Any] | None = None,
) -> System:
    """The system, once every planned fault is known to be deliverable in this run."""
    network.check()
    deploys = counts.get(FaultKind.DEPLOY, 0)
    check_parameters(
        jobs=jobs,
        workers=workers,
        kills=counts[FaultKind.KILL],
        pauses=counts[FaultKind.PAUSE],
        cuts=counts[FaultKind.POWER_CUT],
        server_faults=sum(counts.values())
        - counts[FaultKind.KILL]
        - counts[FaultKind.PAUSE]
        - counts[FaultKind.POWER_CUT]
        - deploys,
        deploys=deploys,
    )
    if counts[FaultKind.POWER_CUT] and crash_mode != POWER_LOSS:
        raise InvalidInput("power_cuts", "a power cut needs --crash-mode power-loss")
    if counts[FaultKind.SERVER_RESTART] and restart_server is None:
        raise InvalidInput(
            "server_restarts", "needs a server this run started (not one given with --dsn)"
        )
    if counts.get(FaultKind.FAILOVER, 0) and fail_over is None:
        raise InvalidInput(
            "failovers", "needs a primary and a standby this run started (not one given with --dsn)"
        )
    if counts.get(FaultKind.HELD_COMMITS, 0) and hold_commits is None:
        raise InvalidInput(
            "held_commits",
            "needs a primary and a standby this run started (not one given with --dsn)",
        )
    chosen = resolve_system(system)
    if counts[FaultKind.SESSION_KILL] and chosen.terminate_sessions is None:
        raise InvalidInput("session_kills", f"{chosen.name} has no server sessions to end")
    if network.active and chosen.server not in ("postgres", "redis"):
        raise InvalidInput(
            "network", f"{chosen.name} talks to no server: there is no connection to fault"
        )
    check_crash_mode(crash_mode, chosen, experiment="chaos")
    # A single owner runs as one worker, whatever the run asked.
    (rollout or Rollout()).check(1 if chosen.capabilities.single_owner else workers)
    return chosen


def planned_faults(
    schedule: Sequence[Mapping[str, Any]] | None,
    *,
    seed: int,
    jobs: int,
    workers: int,
    counts: Mapping[FaultKind, int],
) -> list[PlannedFault]:
    """The seed's schedule, or the recorded one given, which must hold the counts asked."""
    if schedule is None:
        return plan(
            seed=seed,
            jobs=jobs,
            workers=workers,
            kills=counts[FaultKind.KILL],
            pauses=counts[FaultKind.PAUSE],
            cuts=counts[FaultKind.POWER_CUT],
            restarts=counts[FaultKind.SERVER_RESTART],
            session_kills=counts[FaultKind.SESSION_KILL],
            others={
                kind: count
                for kind, count in counts.items()
                if kind in WINDOW_OF or kind in (FaultKind.FAILOVER, FaultKind.HELD_COMMITS)
            },
            deploys=counts.get(FaultKind.DEPLOY, 0),
        )
    planned = recorded(schedule)
    for kind in FaultKind:
        found = sum(fault.kind == kind for fault in planned)
        if found != counts.get(kind, 0):
            raise InvalidInput(
                "schedule",
                f"it holds {found} faults of kind {kind.value}, not {counts.get(kind, 0)}",
            )
    return planned


def check_parameters(
    *,
    jobs: int,
    workers: int,
    kills: int,
    pauses: int,
    cuts: int,
    server_faults: int = 0,
    deploys: int = 0,
) -> None:
    """Refuse, before anything starts, a run that could not deliver what it plans."""
    require_int("jobs", jobs, minimum=1)
    require_int("workers", workers, minimum=1, maximum=MAX_WORKERS)
    require_int("kills", kills, minimum=0)
    require_int("pauses", pauses, minimum=0)
    require_int("power_cuts", cuts, minimum=0)
    require_int("server_faults", server_faults, minimum=0)
    require_int("deploys", deploys, minimum=0)
    # Faults fire at progress marks spread over the first SPAN of the jobs, one mark each.
    room = int(jobs * SPAN)
    faults = kills + pauses + cuts + server_faults + deploys
    if faults > room:
        raise InvalidInput(
            "kills",
            (
                f"{kills} kills, {pauses} pauses and {cuts} power cuts"
                if cuts
                else f"{kills} kills and {pauses} pauses"
            )
            + (f" beside {deploys} deploys" if deploys else "")
            + f" need at least {math.ceil(faults / SPAN)} jobs; {jobs} jobs leave room for"
            f" {room} faults",
        )
