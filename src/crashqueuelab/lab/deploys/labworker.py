"""The lab's own worker, for a system that has no worker of its own (the lab's queues, a
user's adapter): built on the contract's ``QueueClient`` alone, with a shutdown behaviour
the lab documents (docs/real-queues.md, "Deploys") and keeps:

- **SIGTERM or SIGINT**: finish the job in hand, acknowledge it, take no new one, exit 0.
  A second signal changes nothing. The lease is kept alive by heartbeats while the job
  works, so a worker that finishes within the grace period loses nothing, and one
  SIGKILLed at its end leaves a lease that runs out: the job runs again (at least once).
- **SIGQUIT**: no handler: the default action ends the process at once, as a SIGKILL.

**A scheduled job.** The lab's queues take no due time at submission: a job is claimable at
once, and the only way they hold a job until later is a failed attempt's retry delay. A
scheduled job carries its due time in its payload (``DUE_FIELD``, seconds since the epoch),
and this worker, when it claims one before it is due, runs none of its work: it reports the
attempt failed (``HOLD_ERROR``) through a client whose retry policy's delay is the time left
until the due time, so the queue itself keeps the job, in its store, until it is due; the
attempt counts among the job's attempts. A ``hold KEY T DUE`` line goes to the ledger.

Its work runs in a thread; the main thread heartbeats (where the system can) until the
work returns, then acknowledges; an acknowledgement the system answered ``succeeded`` is
written to the ledger as ``ack KEY T``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.runs.executions import append_line
from crashqueuelab.lab.workloads.shutdown import GRACEFUL, stop_on
from crashqueuelab.systems.contract import Claim, OpenRequest, OwnWorker, System, Verdict

#: How often an idle worker looks for work (and expires overdue leases).
POLL_S = 0.05
#: A job's work is heartbeaten this many times per lease.
BEATS_PER_LEASE = 4
#: The payload field of a scheduled job: when it is due (seconds since the epoch).
DUE_FIELD = "due_epoch_s"
#: What the attempt of a scheduled job claimed before it is due reports.
HOLD_ERROR = "held until due: a scheduled job claimed before its due time"
_RETRY = RetryPolicy(base_delay_us=10_000, max_delay_us=200_000)
SOURCE = "docs/real-queues.md#deploys"
SHUTDOWN = {
    "SIGTERM": f"{GRACEFUL}; a second SIGTERM changes nothing",
    "SIGINT": "as SIGTERM",
    "SIGQUIT": "no handler: the process ends at once, as at SIGKILL; its lease runs out"
    " and the job runs again",
}


def hold_until_due(system: System, directory: Path, claim: Claim, ledger: Path) -> bool:
    """Hand ``claim`` back to the queue with a retry due at its due time if it is not due
    yet; whether it was (its work must not run now)."""
    due = claim.payload.get(DUE_FIELD)
    if not isinstance(due, int | float):
        return False
    left_us = round((float(due) - time.time()) * 1_000_000)
    if left_us <= 0:
        return False
    # The retry delay is the failing client's policy: one whose every delay is the time left.
    policy = RetryPolicy(base_delay_us=left_us, max_delay_us=left_us)
    holder = system.open(OpenRequest(directory, SystemClock(), RandomIds(), policy))
    try:
        verdict = holder.fail(claim, HOLD_ERROR)
    finally:
        holder.close()
    append_line(ledger, f"hold {claim.key} {time.monotonic():.6f} {verdict.value}\n")
    return True


def serve_lab_worker(
    system: System,
    directory: Path,
    worker_id: str,
    work: Callable[[str], None],
    ledger: Path,
    lease_s: float,
) -> None:
    """Claim, work, acknowledge until SIGTERM or SIGINT; then finish the job in hand."""
    stop = stop_on(signal.SIGTERM, signal.SIGINT)
    lease_us = max(1, round(lease_s * 1_000_000))
    client = system.open(OpenRequest(directory, SystemClock(), RandomIds(), _RETRY))
    next_recovery = 0.0
    try:
        while not stop.is_set():
            if time.monotonic() >= next_recovery:
                client.recover()
                next_recovery = time.monotonic() + POLL_S
            claim = client.claim(worker_id, lease_us)
            if claim is None:
                stop.wait(POLL_S)
                continue
            if hold_until_due(system, directory, claim, ledger):
                continue
            runner = threading.Thread(target=work, args=(claim.key,), daemon=True)
            runner.start()
            while runner.is_alive():
                runner.join(lease_s / BEATS_PER_LEASE)
                if runner.is_alive() and system.capabilities.heartbeats:
                    client.heartbeat(claim, lease_us)
            if client.succeed(claim) is Verdict.SUCCEEDED:
                append_line(ledger, f"ack {claim.key} {time.monotonic():.6f}\n")
    finally:
        client.close()


def lab_worker(system: System, ledger: Path, lease_s: float) -> OwnWorker:
    """The lab's worker on ``system``, as an ``OwnWorker`` (its shutdown documented)."""
    beats = "heartbeating" if system.capabilities.heartbeats else "no heartbeats"
    return OwnWorker(
        serve=lambda directory, worker_id, work: serve_lab_worker(
            system, directory, worker_id, work, ledger, lease_s
        ),
        describe=f"the lab's own worker on the QueueClient: lease {lease_s:g} s ({beats});"
        " SIGTERM and SIGINT: finish and acknowledge the job in hand, take no new one",
        shutdown=SHUTDOWN,
        source=SOURCE,
    )
