"""The scripted workloads that crash cases run, and the recovery that finishes them.

``run_campaign_workload`` passes through all 13 fault points, in this order of first
occurrence: submit (the effect job, then the flaky job), claim the effect job, heartbeat,
commit its effect, acknowledge it; claim the flaky job, fail it; promote its retry; claim it
with a worker that then vanishes; recover the expired lease; promote; claim and succeed.

Everything is driven by a ManualClock and seeded ids, so the same seed reproduces the same
job ids, lease tokens and times; only the place where the process dies varies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.hooks import Hook
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.models import JobState
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.effects import Destination, EffectLedger
from crashqueuelab.lab.handlers import SYNTHETIC_EFFECT, SYNTHETIC_FLAKY, synthetic_handlers
from crashqueuelab.lab.worker import Worker

QUEUE_FILE = "queue.sqlite"
LEDGER_FILE = "effects.sqlite"
#: The campaign clock starts here (microseconds), far from zero so times read as times.
START_US = 1_000_000_000
LEASE_US = 5_000_000
RETRY = RetryPolicy(base_delay_us=1_000_000, max_delay_us=8_000_000)
#: Recovery starts this long after START_US: beyond every lease and retry of the workload.
RECOVERY_OFFSET_US = 3_600_000_000
#: Rounds of recover / promote / work before recovery gives up (every loop is bounded).
MAX_RECOVERY_ROUNDS = 10


@dataclass(frozen=True)
class ScenarioJob:
    """One job the workload submits (and recovery re-submits: submission is idempotent)."""

    role: str
    idempotency_key: str
    job_type: str
    payload: dict[str, Any] = field(hash=False)
    max_attempts: int = 3

    @property
    def effect_key(self) -> str:
        return str(self.payload["effect_key"])


def scenario_jobs(case_id: str) -> tuple[ScenarioJob, ScenarioJob]:
    """The effect job (heartbeats once, then commits its effect) and the flaky job."""
    return (
        ScenarioJob(
            role="effect",
            idempotency_key=f"{case_id}/effect",
            job_type=SYNTHETIC_EFFECT,
            payload={"effect_key": f"{case_id}/effect-1", "value": 7, "heartbeats": 1},
        ),
        ScenarioJob(
            role="flaky",
            idempotency_key=f"{case_id}/flaky",
            job_type=SYNTHETIC_FLAKY,
            payload={"effect_key": f"{case_id}/flaky-1", "value": 11, "fail_attempts": 1},
        ),
    )


def open_case(
    case_dir: Path,
    *,
    clock: ManualClock,
    ids: SeededIds,
    destination: Destination,
    hook: Hook | None = None,
) -> tuple[DurableQueue, EffectLedger]:
    """The case's queue and ledger, sharing one clock and one hook."""
    queue = DurableQueue(case_dir / QUEUE_FILE, clock=clock, ids=ids, retry=RETRY, hook=hook)
    try:
        ledger = EffectLedger(
            case_dir / LEDGER_FILE, destination=destination, clock=clock, hook=hook
        )
    except BaseException:
        queue.close()
        raise
    return queue, ledger


def submit_all(queue: DurableQueue, jobs: tuple[ScenarioJob, ...]) -> None:
    for job in jobs:
        queue.submit(
            idempotency_key=job.idempotency_key,
            job_type=job.job_type,
            payload=job.payload,
            max_attempts=job.max_attempts,
        )


def run_campaign_workload(case_dir: Path, *, case_id: str, seed: int, hook: Hook) -> None:
    """The uninterrupted workload; a hook that ends the process stops it at its fault point."""
    clock = ManualClock(START_US)
    jobs = scenario_jobs(case_id)
    queue, ledger = open_case(
        case_dir,
        clock=clock,
        ids=SeededIds(seed, f"{case_id}/workload"),
        destination=Destination.IDEMPOTENT,
        hook=hook,
    )
    with queue, ledger:
        worker = Worker(
            queue,
            worker_id="worker-a",
            handlers=synthetic_handlers(ledger),
            lease_duration_us=LEASE_US,
        )
        submit_all(queue, jobs)
        clock.advance(1_000)
        worker.run_once()  # the effect job: claim, heartbeat, effect, success
        clock.advance(1_000)
        worker.run_once()  # the flaky job: claim, failure -> retry in 1 s
        clock.advance(RETRY.delay_us(1))
        queue.promote_retries()
        vanished = queue.claim(worker_id="worker-vanished", lease_duration_us=LEASE_US)
        if vanished is None:
            raise RuntimeError("the workload expected the flaky job to be ready")
        clock.advance(LEASE_US)
        queue.recover_expired()
        clock.advance(RETRY.delay_us(2))
        queue.promote_retries()
        worker.run_once()  # the flaky job's third attempt succeeds


def run_single_worker_workload(
    case_dir: Path,
    *,
    case_id: str,
    seed: int,
    destination: Destination,
    start_us: int,
    hook: Hook,
) -> None:
    """One worker takes one already submitted job (the effect demo's first worker)."""
    clock = ManualClock(start_us)
    queue, ledger = open_case(
        case_dir,
        clock=clock,
        ids=SeededIds(seed, f"{case_id}/worker-a"),
        destination=destination,
        hook=hook,
    )
    with queue, ledger:
        Worker(
            queue,
            worker_id="worker-a",
            handlers=synthetic_handlers(ledger),
            lease_duration_us=LEASE_US,
        ).run_once()


@dataclass(frozen=True)
class RecoveryResult:
    """Where recovery left every job, and how long it had to try."""

    rounds: int
    terminal: bool
    states: dict[str, str]


def recover_case(
    case_dir: Path,
    *,
    jobs: tuple[ScenarioJob, ...],
    seed: int,
    stream: str,
    destination: Destination,
    start_us: int,
) -> RecoveryResult:
    """What an operator's restart does: re-run the producer, recover, promote, and work."""
    clock = ManualClock(start_us)
    queue, ledger = open_case(
        case_dir, clock=clock, ids=SeededIds(seed, stream), destination=destination
    )
    with queue, ledger:
        # The producer may have died before its submission committed; submitting again is
        # safe because the idempotency key returns the job that already exists.
        submit_all(queue, jobs)
        worker = Worker(
            queue,
            worker_id="worker-recovery",
            handlers=synthetic_handlers(ledger),
            lease_duration_us=LEASE_US,
        )
        rounds, states = 0, _states(queue, jobs)
        while rounds < MAX_RECOVERY_ROUNDS and not all(s.is_terminal for s in states.values()):
            rounds += 1
            clock.advance(LEASE_US + RETRY.max_delay_us)
            queue.recover_expired()
            queue.promote_retries()
            worker.run_until_idle(max_jobs=10 * len(jobs))
            states = _states(queue, jobs)
    return RecoveryResult(
        rounds=rounds,
        terminal=all(state.is_terminal for state in states.values()),
        states={role: state.value for role, state in states.items()},
    )


def _states(queue: DurableQueue, jobs: tuple[ScenarioJob, ...]) -> dict[str, JobState]:
    return {job.role: queue.get_by_key(job.idempotency_key).state for job in jobs}
