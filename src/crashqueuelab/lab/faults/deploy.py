"""A deploy as a fault: a batch of ``surge`` workers gets SIGTERM, each to its own process as
a process manager's stop reaches the main process; a worker still there ``grace_s`` later
gets SIGKILL, every process of its session (as a container's or a systemd unit's stop
reaches its whole cgroup); a replacement starts at once or once the old one is gone.

The deliverer sends the SIGTERMs, every one of the batch before any replacement starts,
and hands each stopped worker to its run (``DeployTarget.hold_stopping``), which watches
its grace, SIGKILLs it at the grace's end and records how it ended.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.core.validation import require_int
from crashqueuelab.lab.faults.delivery import Fault, Record, Worker
from crashqueuelab.lab.faults.kinds import FaultKind
from crashqueuelab.lab.faults.signals import send_signal


class Replace(StrEnum):
    """When a stopped worker's replacement starts."""

    AT_ONCE = "at-once"  # with the stop signal: the rollout's surge runs beside the old one
    AFTER_EXIT = "after-exit"  # once the old process exited or was killed


@dataclass(frozen=True)
class Rollout:
    """How a run's deploys stop workers: ``surge`` at a time, SIGKILL ``grace_s`` after the
    SIGTERM, the replacement started as ``replace`` says."""

    grace_s: float = 1.0
    surge: int = 1
    replace: Replace = Replace.AT_ONCE

    def check(self, workers: int) -> None:
        """Refuse a rollout the run's ``workers`` cannot carry out."""
        if not self.grace_s > 0 or self.grace_s == float("inf"):
            raise InvalidInput("grace_s", f"{self.grace_s} is not a finite number above zero")
        require_int("surge", self.surge, minimum=1)
        if self.surge > workers:
            raise InvalidInput(
                "surge", f"{self.surge} workers at a time, but the run has only {workers}"
            )
        try:
            Replace(self.replace)
        except ValueError:
            raise InvalidInput("replace", f"{self.replace!r}: at-once or after-exit") from None

    def to_json(self) -> dict[str, Any]:
        return {"grace_s": self.grace_s, "surge": self.surge, "replace": str(self.replace)}


class DeployTarget(Protocol):
    """A run's workers, as a deploy sees them."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    @property
    def rollout(self) -> Rollout: ...

    def ready_for(self, planned: int) -> Worker | None:
        """The worker to stop for the planned slot, one that has begun its work (its
        SIGTERM handler is in place: a process manager's stop during the interpreter's
        start would meet the default action); None when none can be stopped now."""
        ...

    def hold_stopping(self, slot: int, stopped: Record) -> None:
        """Watch the SIGTERMed worker in ``slot`` through its grace (``stopped``: what the
        record says of it, which the run completes); start its replacement as the rollout
        says."""
        ...


class Deploy:
    """One deploy: SIGTERM to a batch of workers, each then watched through its grace."""

    kinds = frozenset({FaultKind.DEPLOY})

    def deliver(self, fault: Fault, target: DeployTarget) -> Record | None:
        batch = self._batch(fault.worker_slot, target)
        if batch is None:
            return None
        time.sleep(fault.delay_ms / 1000)
        rollout = target.rollout
        record: Record = {
            "index": fault.index,
            "kind": fault.kind.value,
            "planned_slot": fault.worker_slot,
            "after_finished": fault.after_finished,
            **rollout.to_json(),
            "workers": [],
        }
        for worker in batch:
            at = round(time.monotonic() - target.started, 6)
            if not send_signal(worker.process, signal.SIGTERM):
                continue
            record.setdefault("at_s", at)
            record["workers"].append(
                {
                    "worker_id": worker.worker_id,
                    "worker_slot": worker.index,
                    "pid": worker.process.pid,
                    "sigterm_at_s": at,
                    "grace_end_s": round(at + rollout.grace_s, 6),
                }
            )
        if "at_s" not in record:
            record["skipped"] = "every worker of the batch exited before the signal"
            return record
        # Every worker of the batch has its SIGTERM before any replacement starts.
        for stopped in record["workers"]:
            target.hold_stopping(stopped["worker_slot"], stopped)
        return record

    @staticmethod
    def _batch(planned: int, target: DeployTarget) -> list[Worker] | None:
        """``surge`` distinct workers from the planned slot round the table; None while
        fewer can be hit (paused, being stopped, not yet begun, or gone: the run starts its
        replacement, which begins before it is stopped): the run tries again."""
        batch: list[Worker] = []
        for _ in range(target.rollout.surge):
            worker = target.ready_for(planned)
            if worker is None or any(worker.index == chosen.index for chosen in batch):
                return None
            if worker.process.exitcode is not None:
                return None
            batch.append(worker)
            planned = worker.index + 1
        return batch


DEPLOY = Deploy()
