"""The two kinds of process a chaos run starts: workers (which get killed) and maintenance.

Both open their own connections after they start; nothing SQLite crosses a fork. A worker
records each acknowledgement its lease no longer covered in a line-buffered log, so the
count survives SIGKILL (the page cache keeps what was written).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.core.models import Acknowledgement
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.effects import Destination, EffectLedger

#: How long an idle worker or the maintenance loop waits before looking again.
POLL_S = 0.005
#: Retries come back quickly in a chaos run: leases are short and kills are frequent.
CHAOS_RETRY = RetryPolicy(base_delay_us=10_000, max_delay_us=200_000)


@dataclass(frozen=True)
class RunFiles:
    """Where a chaos run keeps its databases."""

    queue: str
    effects: str
    executions: str


@dataclass(frozen=True)
class WorkerSpec:
    files: RunFiles
    worker_id: str
    lease_us: int
    batch: int
    log: str


def worker_main(spec: WorkerSpec) -> None:
    """Claim a batch, execute each job against both ledgers, acknowledge; until no work is left.

    Every execution is written to the non-idempotent ledger (one row per execution) and to
    the idempotent one (one effect per job however often it runs).
    """
    queue = DurableQueue(spec.files.queue, create=False)
    effects = EffectLedger(spec.files.effects, destination=Destination.IDEMPOTENT, create=False)
    executions = EffectLedger(
        spec.files.executions, destination=Destination.NON_IDEMPOTENT, create=False
    )
    with queue, effects, executions, Path(spec.log).open("a", buffering=1) as log:
        while True:
            claimed = queue.claim_many(
                worker_id=spec.worker_id, lease_duration_us=spec.lease_us, limit=spec.batch
            )
            if not claimed:
                if queue.active_count() == 0:
                    return
                time.sleep(POLL_S)
                continue
            for job in claimed:
                payload = job.job.payload
                for ledger in (executions, effects):
                    ledger.apply(
                        effect_key=payload["effect_key"],
                        value=payload["value"],
                        job_id=job.job.job_id,
                        attempt=job.attempt,
                        worker_id=spec.worker_id,
                    )
            results = queue.succeed_many(
                [Acknowledgement(c.job.job_id, spec.worker_id, c.lease_token) for c in claimed]
            )
            for result in results:
                if not result.accepted:
                    log.write(f"stale {result.job_id} {result.stale_reason}\n")


def maintenance_main(queue_path: str, stop_file: str) -> None:
    """Recover expired leases and promote due retries until no work is left or told to stop."""
    with DurableQueue(queue_path, create=False, retry=CHAOS_RETRY) as queue:
        while not Path(stop_file).exists():
            queue.recover_expired()
            queue.promote_retries()
            if queue.active_count() == 0:
                return
            time.sleep(POLL_S * 4)
