"""The seeded fault schedule: which worker, at what progress, after how many milliseconds.

Faults are tied to progress (finished jobs) rather than to wall time, so every fault lands
while work is pending however fast the machine is. The seed fixes the schedule; the
instants the signals really land are recorded by the supervisor.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.faults.kinds import FaultKind

#: The share of the jobs over which the faults are spread.
SPAN = 0.85


@dataclass(frozen=True)
class PlannedFault:
    """One signal to deliver once ``after_finished`` jobs are done, ``delay_ms`` later."""

    index: int
    kind: FaultKind
    worker_slot: int
    after_finished: int
    delay_ms: float

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind.value, "worker_slot": self.worker_slot,
                "after_finished": self.after_finished, "delay_ms": self.delay_ms}  # fmt: skip


def recorded(records: Sequence[Mapping[str, Any]]) -> list[PlannedFault]:
    """A schedule a run recorded (``chaos.json``'s ``schedule``), to deliver again."""
    try:
        faults = [
            PlannedFault(
                index=int(record["index"]),
                kind=FaultKind(record["kind"]),
                worker_slot=int(record["worker_slot"]),
                after_finished=int(record["after_finished"]),
                delay_ms=float(record["delay_ms"]),
            )
            for record in records
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidInput("schedule", f"not a recorded fault schedule ({error!r})") from None
    return sorted(faults, key=lambda fault: (fault.after_finished, fault.index))


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
    others: Mapping[FaultKind, int] | None = None,
    deploys: int = 0,
) -> list[PlannedFault]:
    """Spread ``kills``, ``pauses``, power ``cuts``, server ``restarts``, ``session_kills``,
    ``others`` (network faults, by kind) and ``deploys`` over the run's progress, seeded (a
    deploy's ``worker_slot`` is the first of its batch)."""
    rng = random.Random(seed)
    kinds = [FaultKind.KILL] * kills + [FaultKind.PAUSE] * pauses + [FaultKind.POWER_CUT] * cuts
    kinds += [FaultKind.SERVER_RESTART] * restarts + [FaultKind.SESSION_KILL] * session_kills
    for kind, count in (others or {}).items():
        kinds += [kind] * count
    kinds += [FaultKind.DEPLOY] * deploys
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
