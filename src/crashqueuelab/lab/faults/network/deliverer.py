"""The network faults' deliverer: which paths on the run's fault proxy a planned network
fault strikes (``plan.py`` says what each does there)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from crashqueuelab.lab.faults.delivery import Fault, Record, Worker
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.network.plan import WINDOW_OF, RunNetwork, worker_path


class NetworkTarget(Protocol):
    """A run whose processes reach the server through a fault proxy."""

    #: The run's fault proxy (None: it has none).
    @property
    def network(self) -> RunNetwork | None: ...

    @property
    def workers(self) -> Sequence[Worker]: ...

    def target_for(self, planned: int) -> Worker | None:
        """The worker to hit for the planned slot; None when none can be hit now."""
        ...


class NetworkFault:
    """Starts a network fault on the planned worker's path (or the next worker's round the
    table, if that one is paused or too fresh); a partition cuts every path, or those of
    the plan's ``partition_workers`` workers."""

    kinds = frozenset(WINDOW_OF)

    def deliver(self, fault: Fault, target: NetworkTarget) -> Record | None:
        assert target.network is not None
        record: Record = {
            "index": fault.index,
            "kind": fault.kind.value,
            "after_finished": fault.after_finished,
        }
        paths: list[str] | None = None
        partial = target.network.plan.partition_workers is not None
        if fault.kind is not FaultKind.PARTITION or partial:
            slot = target.target_for(fault.worker_slot)
            if slot is None:
                return None
            record |= {"planned_slot": fault.worker_slot, "worker_slot": slot.index,
                       "worker_id": slot.worker_id}  # fmt: skip
            paths = [worker_path(slot.index)]
            if fault.kind is FaultKind.PARTITION:
                paths = target.network.plan.partition_paths(slot.index, len(target.workers))
        time.sleep(fault.delay_ms / 1000)
        record |= target.network.strike(fault.kind, paths)
        return record


NETWORK_FAULT = NetworkFault()
