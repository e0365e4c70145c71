"""The seeded fault schedule: which worker, at what progress, after how many milliseconds.

Faults are tied to progress (finished jobs) rather than to wall time, so every fault lands
while work is pending however fast the machine is. The seed fixes the schedule; the
instants the signals really land are recorded by the supervisor.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

#: The share of the jobs over which the faults are spread.
SPAN = 0.85


class FaultKind(StrEnum):
    KILL = "SIGKILL"
    PAUSE = "SIGSTOP"
    #: Every process dies and the disk loses what nobody synced (power-loss mode only).
    POWER_CUT = "power cut"
    #: The system's server dies (pg_ctl stop -m immediate) and starts again.
    SERVER_RESTART = "server restart"
    #: A worker's database session is ended by the server (pg_terminate_backend).
    SESSION_KILL = "session terminated"


@dataclass(frozen=True)
class PlannedFault:
    """One signal to deliver once ``after_finished`` jobs are done, ``delay_ms`` later."""

    index: int
    kind: FaultKind
    worker_slot: int
    after_finished: int
    delay_ms: float


def plan(
    *,
    seed: int,
    jobs: int,
    workers: int,
    kills: int,
    pauses: int,
    cuts: int = 0,
    restarts: int = 0,
    session_kills: int = 0,
) -> list[PlannedFault]:
    """Spread ``kills``, ``pauses``, power ``cuts``, server ``restarts`` and ``session_kills``
    over the run's progress, seeded."""
    rng = random.Random(seed)
    kinds = [FaultKind.KILL] * kills + [FaultKind.PAUSE] * pauses + [FaultKind.POWER_CUT] * cuts
    kinds += [FaultKind.SERVER_RESTART] * restarts + [FaultKind.SESSION_KILL] * session_kills
    rng.shuffle(kinds)
    total = len(kinds)
    # Faults land within the first SPAN of the work, so the last ones still find work.
    span = int(jobs * SPAN)
    faults = []
    for index, kind in enumerate(kinds):
        # Evenly spaced progress marks, each nudged within its own interval.
        low = index * span // (total + 1)
        high = max(low, (index + 1) * span // (total + 1))
        faults.append(
            PlannedFault(
                index=index,
                kind=kind,
                worker_slot=rng.randrange(workers),
                after_finished=rng.randint(low, high),
                delay_ms=round(rng.uniform(0.0, 5.0), 3),
            )
        )
    return sorted(faults, key=lambda fault: (fault.after_finished, fault.index))
