"""Process signals as faults: a SIGKILL, and a SIGSTOP that lands while its worker holds
leases; the one safe way to signal a worker, and SIGKILL of every process of a worker's
session (what a deploy's grace ends with).

A paused worker is left stopped: its run continues it (``SIGCONT``) once its jobs were taken
over or its leases ran out, and judges what it was told about its late acknowledgements.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Protocol

from crashqueuelab.lab.faults.delivery import Fault, Record, Worker
from crashqueuelab.lab.faults.kinds import FaultKind

#: How often a pause looks for a moment when its worker holds a lease.
PAUSE_TRIES = 250
#: How long a pause lets a worker found between batches run before it tries again.
PAUSE_RETRY_S = 0.002


def is_started(process: Any) -> bool:
    """Whether ``process`` was started (a run interrupted while launching may hold one that
    never was, which can be neither joined nor signalled)."""
    return process is not None and process.pid is not None


def send_signal(process: Any, signum: int) -> bool:
    """Signal a worker that is still running; False when it has already exited.

    Workers are children of the fork server, not of this process, so a worker that
    finished its work may already be gone; checking ``exitcode`` first also keeps a
    signal from reaching a recycled process id.
    """
    if not is_started(process) or process.exitcode is not None:
        return False
    try:
        os.kill(process.pid, signum)
    except ProcessLookupError:
        return False
    return True


def session_members(session: int) -> list[int]:
    """The processes of session ``session`` still there (zombies aside): the worker and all
    it forked, also into process groups of their own (RQ's work horse), as a container's or
    a systemd unit's stop reaches every process of its cgroup."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == session:
            members.append(int(entry.name))
    return sorted(members)


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` still there."""
    for pid in pids:
        # It may have exited since it was listed.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_session(pid: int) -> list[int]:
    """SIGKILL every process of the session worker ``pid`` leads; the processes found."""
    members = session_members(pid)
    kill_all(members)
    return members


class SignalTarget(Protocol):
    """A run's workers, as a signal sees them."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    def target_for(self, planned: int) -> Worker | None:
        """The worker to hit for the planned slot; None when none can be hit now."""
        ...

    def replace(self, slot: int) -> Worker:
        """Start a new worker in the slot of one found dead; the new one."""
        ...

    def leases_of(self, worker_id: str) -> set[tuple[str, str]]:
        """(key, lease token) of every lease the worker holds, as its log tells now."""
        ...

    def hold_paused(self, slot: int, record: Record, leases: set[tuple[str, str]]) -> None:
        """Keep the stopped worker in ``slot`` stopped until the run continues it."""
        ...


class Signals:
    """Kills and pauses: one planned signal to one worker, recorded when it really landed."""

    kinds = frozenset({FaultKind.KILL, FaultKind.PAUSE})

    def deliver(self, fault: Fault, target: SignalTarget) -> Record | None:
        slot = target.target_for(fault.worker_slot)
        if slot is None:
            return None
        time.sleep(fault.delay_ms / 1000)
        record: Record = {
            "index": fault.index,
            "kind": fault.kind.value,
            "planned_slot": fault.worker_slot,
            "worker_slot": slot.index,
            "after_finished": fault.after_finished,
        }
        process = slot.process
        if process.exitcode is not None:
            slot = target.replace(slot.index)
            process = slot.process
        record["worker_id"] = slot.worker_id
        record["pid"] = process.pid
        if fault.kind is FaultKind.KILL:
            if not send_signal(process, signal.SIGKILL):
                record["skipped"] = "worker exited before the signal"
                return record
            record["at_s"] = round(time.monotonic() - target.started, 6)
            record["worker_age_s"] = round(time.monotonic() - slot.started_at, 6)
            process.join(timeout=10)
            # What the dead worker left behind: leases that only expiry can free now.
            record["leases_held_at_death"] = len(target.leases_of(slot.worker_id))
            return record
        # Stop it at a moment when it holds leases (read while it is stopped, so they are
        # exactly what it holds); a worker between batches is continued and tried again.
        leases: set[tuple[str, str]] = set()
        for _ in range(PAUSE_TRIES):
            if not send_signal(process, signal.SIGSTOP):
                break
            record["at_s"] = round(time.monotonic() - target.started, 6)
            leases = target.leases_of(slot.worker_id)
            if leases:
                break
            send_signal(process, signal.SIGCONT)
            time.sleep(PAUSE_RETRY_S)
        if "at_s" not in record:
            record["skipped"] = "worker exited before the signal"
            return record
        record["leases_held"] = len(leases)
        record["held_leases"] = [list(lease) for lease in sorted(leases)]
        target.hold_paused(slot.index, record, leases)
        return record


SIGNALS = Signals()
