"""Faults of the system's server: it restarts without a checkpoint, it fails over to its
standby, or it ends one worker's database sessions."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from crashqueuelab.lab.faults.delivery import Fault, Record, Worker
from crashqueuelab.lab.faults.kinds import FaultKind


class RestartTarget(Protocol):
    """A run that started the system's server itself."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    #: Crashes and restarts the server (None: the run did not start one).
    @property
    def restart_server(self) -> Callable[[], None] | None: ...


class FailoverTarget(Protocol):
    """A run on a replicated server it started itself."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    #: Fails the primary over to its standby; what it measured (None: the run has no
    #: standby).
    @property
    def fail_over(self) -> Callable[[], dict[str, Any]] | None: ...


class HoldTarget(Protocol):
    """A run on a replicated server it started itself."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    #: Holds the COMMITs made meanwhile open and resets every client connection while they
    #: wait; what it measured (None: the run has no standby).
    @property
    def hold_commits(self) -> Callable[[], dict[str, Any]] | None: ...


class SessionTarget(Protocol):
    """A run whose workers hold sessions on the system's server."""

    #: The run's start, on the monotonic clock.
    @property
    def started(self) -> float: ...

    @property
    def workers(self) -> Sequence[Worker]: ...

    def is_paused(self, slot: int) -> bool: ...

    #: Ends every session of a process id on the server; how many it ended.
    @property
    def terminate_sessions(self) -> Callable[[int], int] | None: ...


def _struck(fault: Fault, started: float, strike: Callable[[], Record]) -> Record:
    """What every server fault does around its strike: wait the fault's delay, strike, and
    keep when it struck and how long the server took to come back."""
    time.sleep(fault.delay_ms / 1000)
    record: Record = {
        "index": fault.index,
        "kind": fault.kind.value,
        "after_finished": fault.after_finished,
        "at_s": round(time.monotonic() - started, 6),
    }
    record |= strike()
    record["back_after_s"] = round(time.monotonic() - started - record["at_s"], 6)
    return record


class ServerRestart:
    """The server dies without a checkpoint and starts again; the workers live on and must
    reconnect, and every transition they were told was committed must still be there."""

    kinds = frozenset({FaultKind.SERVER_RESTART})

    def deliver(self, fault: Fault, target: RestartTarget) -> Record | None:
        restart = target.restart_server
        assert restart is not None

        def strike() -> Record:
            restart()
            return {}

        return _struck(fault, target.started, strike)


class Failover:
    """The primary dies while its standby lags, the standby is promoted, the clients
    follow it; the workers live on and must reconnect, and every transition they were told
    was committed must be on the promoted standby (``lab/failover/cluster.py``)."""

    kinds = frozenset({FaultKind.FAILOVER})

    def deliver(self, fault: Fault, target: FailoverTarget) -> Record | None:
        fail_over = target.fail_over
        assert fail_over is not None
        return _struck(fault, target.started, lambda: {"failover": fail_over()})


class HeldCommits:
    """COMMITs still in progress when their clients lose them: the standby stops answering,
    every client connection is reset while COMMITs wait for it, then it catches up. The
    workers live on and must reconnect; a queue that asks about its lost COMMIT is told "in
    progress", and every answer must match what the store then holds."""

    kinds = frozenset({FaultKind.HELD_COMMITS})

    def deliver(self, fault: Fault, target: HoldTarget) -> Record | None:
        hold_commits = target.hold_commits
        assert hold_commits is not None
        return _struck(fault, target.started, lambda: {"held_commits": hold_commits()})


class SessionKill:
    """Ends the database session of the planned worker (or the next one round the table
    that has a session); nothing is struck while no worker has one."""

    kinds = frozenset({FaultKind.SESSION_KILL})

    def deliver(self, fault: Fault, target: SessionTarget) -> Record | None:
        assert target.terminate_sessions is not None
        slots = target.workers
        for step in range(len(slots)):
            slot = slots[(fault.worker_slot + step) % len(slots)]
            if target.is_paused(slot.index) or slot.process.exitcode is not None:
                continue
            ended = target.terminate_sessions(slot.process.pid)
            if ended:
                return {
                    "index": fault.index,
                    "kind": fault.kind.value,
                    "planned_slot": fault.worker_slot,
                    "worker_slot": slot.index,
                    "worker_id": slot.worker_id,
                    "pid": slot.process.pid,
                    "after_finished": fault.after_finished,
                    "at_s": round(time.monotonic() - target.started, 6),
                    "sessions_ended": ended,
                }
        return None


SERVER_RESTART = ServerRestart()
FAILOVER = Failover()
HELD_COMMITS = HeldCommits()
SESSION_KILL = SessionKill()
