"""The power cut as a fault: every process of the run dies at once and the disk forgets
what nobody synced; the run boots the next disk and starts everything again."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from crashqueuelab.lab.faults.delivery import Fault, Record, Worker
from crashqueuelab.lab.faults.kinds import FaultKind


class PowerTarget(Protocol):
    """A run on a power-loss disk."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    @property
    def workers(self) -> Sequence[Worker]: ...

    def cut_power(self) -> Record:
        """Kill every process, cut the disk, start them all again; what the cut did."""
        ...


class PowerCut:
    """Cuts the power under every worker at once."""

    kinds = frozenset({FaultKind.POWER_CUT})

    def deliver(self, fault: Fault, target: PowerTarget) -> Record | None:
        time.sleep(fault.delay_ms / 1000)
        record: Record = {
            "index": fault.index,
            "kind": fault.kind.value,
            "after_finished": fault.after_finished,
            "at_s": round(time.monotonic() - target.started, 6),
            "workers_killed": [slot.worker_id for slot in target.workers],
        }
        record |= target.cut_power()
        return record


POWER_CUT = PowerCut()
