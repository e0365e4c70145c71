"""The scripted workloads that crash cases run on any system, and the recovery that finishes them.

``run_campaign_workload`` passes through every crash point a system declares, in this
order: submit the effect job, then the flaky job; claim the effect job, work one second and
heartbeat (where the system can: the deadline moves one second later), commit its effect,
acknowledge it; claim the flaky job, fail it; let its retry
come due; a worker claims it and vanishes; checkpoint (where the system has a step of its
own for it); the lease expires and is recovered; the retry comes due; claim and succeed.

Everything is driven by a ManualClock and seeded ids, so the same seed reproduces the same
job ids, lease tokens and times; only the place where the process dies varies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.runs.systemcalls import calling
from crashqueuelab.lab.workloads.effects import Destination, EffectLedger
from crashqueuelab.lab.workloads.handlers import (
    SYNTHETIC_EFFECT,
    SYNTHETIC_FLAKY,
    synthetic_handlers,
)
from crashqueuelab.lab.workloads.worker import Worker
from crashqueuelab.systems.contract import Hook, JobSpec, OpenRequest, QueueClient, System

#: The system's store directory inside a case directory.
STORE_DIRECTORY = "store"
LEDGER_FILE = "effects.sqlite"
#: The campaign clock starts here (microseconds), far from zero so times read as times.
START_US = 1_000_000_000
LEASE_US = 5_000_000
RETRY = RetryPolicy(base_delay_us=1_000_000, max_delay_us=8_000_000)
#: The scripted handler works this long before each heartbeat, so a heartbeat moves the
#: deadline and a crash state tells a durable heartbeat from a lost one.
HANDLER_WORK_US = 1_000_000
#: When the campaign workload claims the effect job, and the deadlines its claim and its
#: handler's heartbeat set.
EFFECT_CLAIMED_AT_US = START_US + 1_000
CLAIM_DEADLINE_US = EFFECT_CLAIMED_AT_US + LEASE_US
HEARTBEAT_DEADLINE_US = CLAIM_DEADLINE_US + HANDLER_WORK_US
#: Recovery starts this long after START_US: beyond every lease and retry of the workload.
RECOVERY_OFFSET_US = 3_600_000_000
#: Rounds of recover / work before recovery gives up (every loop is bounded).
MAX_RECOVERY_ROUNDS = 10
#: The roles of the workload's two jobs, in submission order.
ROLES = ("effect", "flaky")


def scenario_jobs(case_id: str) -> tuple[JobSpec, JobSpec]:
    """The effect job (heartbeats once, then commits its effect) and the flaky job."""
    return (
        JobSpec(
            key=f"{case_id}/effect",
            job_type=SYNTHETIC_EFFECT,
            payload={"effect_key": f"{case_id}/effect-1", "value": 7, "heartbeats": 1},
        ),
        JobSpec(
            key=f"{case_id}/flaky",
            job_type=SYNTHETIC_FLAKY,
            payload={"effect_key": f"{case_id}/flaky-1", "value": 11, "fail_attempts": 1},
        ),
    )


def effect_key(job: JobSpec) -> str:
    return str(job.payload["effect_key"])


def open_case(
    case_dir: Path,
    system: System,
    *,
    clock: ManualClock,
    ids: SeededIds,
    destination: Destination,
    hook: Hook | None = None,
) -> tuple[QueueClient, EffectLedger]:
    """The case's queue and ledger, sharing one clock and one hook."""
    request = OpenRequest(case_dir / STORE_DIRECTORY, clock=clock, ids=ids, retry=RETRY, hook=hook)
    with calling(system.name, "open"):
        client = system.open(request)
    try:
        ledger = EffectLedger(
            case_dir / LEDGER_FILE, destination=destination, clock=clock, hook=hook
        )
    except BaseException:
        client.close()
        raise
    return client, ledger


def deadline_label(deadline_us: int | None) -> str:
    """Which grant of the campaign workload set a lease deadline the store holds:
    ``claim``, ``heartbeat``, ``none`` (not leased), or the time itself."""
    names = {None: "none", CLAIM_DEADLINE_US: "claim", HEARTBEAT_DEADLINE_US: "heartbeat"}
    return names.get(deadline_us, f"{deadline_us} us")


def case_worker(
    client: QueueClient, ledger: EffectLedger, system: System, worker_id: str, clock: ManualClock
) -> Worker:
    return Worker(
        client,
        worker_id=worker_id,
        handlers=synthetic_handlers(ledger),
        lease_duration_us=LEASE_US,
        heartbeats=system.capabilities.heartbeats,
        before_heartbeat=lambda: _work(clock),
    )


def _work(clock: ManualClock) -> None:
    clock.advance(HANDLER_WORK_US)


def run_campaign_workload(
    case_dir: Path, system: System, *, case_id: str, seed: int, hook: Hook
) -> None:
    """The uninterrupted workload; a hook that ends the process stops it at its crash point."""
    clock = ManualClock(START_US)
    jobs = scenario_jobs(case_id)
    client, ledger = open_case(
        case_dir,
        system,
        clock=clock,
        ids=SeededIds(seed, f"{case_id}/workload"),
        destination=Destination.IDEMPOTENT,
        hook=hook,
    )
    try:
        worker = case_worker(client, ledger, system, "worker-a", clock)
        for job in jobs:
            client.submit(job)
        clock.advance(1_000)
        worker.run_once()  # the effect job: claim, heartbeat, effect, success
        clock.advance(1_000)
        worker.run_once()  # the flaky job: claim, failure -> retry in 1 s
        clock.advance(RETRY.delay_us(1))
        client.recover()
        if client.claim("worker-vanished", LEASE_US) is None:
            raise RuntimeError("the workload expected the flaky job to be ready")
        if system.capabilities.checkpoint:
            client.checkpoint()
        clock.advance(LEASE_US)
        client.recover()
        clock.advance(RETRY.delay_us(2))
        client.recover()
        worker.run_once()  # the flaky job's third attempt succeeds
    finally:
        ledger.close()
        client.close()


def run_single_worker_workload(
    case_dir: Path,
    system: System,
    *,
    case_id: str,
    seed: int,
    destination: Destination,
    start_us: int,
    hook: Hook,
) -> None:
    """One worker takes one already submitted job (the effect demo's first worker)."""
    clock = ManualClock(start_us)
    client, ledger = open_case(
        case_dir,
        system,
        clock=clock,
        ids=SeededIds(seed, f"{case_id}/worker-a"),
        destination=destination,
        hook=hook,
    )
    try:
        case_worker(client, ledger, system, "worker-a", clock).run_once()
    finally:
        ledger.close()
        client.close()


@dataclass(frozen=True)
class RecoveryResult:
    """Where recovery left every job (its system's word, or MISSING), and how long it took."""

    rounds: int
    terminal: bool
    states: dict[str, str]
    succeeded: bool


MISSING = "MISSING"


def recover_case(
    case_dir: Path,
    system: System,
    *,
    jobs: tuple[JobSpec, ...],
    seed: int,
    stream: str,
    destination: Destination,
    start_us: int,
) -> RecoveryResult:
    """What an operator's restart does: re-run the producer, recover, and work."""
    clock = ManualClock(start_us)
    client, ledger = open_case(
        case_dir, system, clock=clock, ids=SeededIds(seed, stream), destination=destination
    )
    try:
        # The producer may have died before its submission committed; submitting again is
        # safe because the idempotency key returns the job that already exists.
        for job in jobs:
            client.submit(job)
        worker = case_worker(client, ledger, system, "worker-recovery", clock)
        rounds, views = 0, [client.job(job.key) for job in jobs]
        while rounds < MAX_RECOVERY_ROUNDS and not all(
            view is not None and view.status.is_terminal for view in views
        ):
            rounds += 1
            clock.advance(LEASE_US + RETRY.max_delay_us)
            client.recover()
            worker.run_until_idle(max_jobs=10 * len(jobs))
            views = [client.job(job.key) for job in jobs]
    finally:
        ledger.close()
        client.close()
    return RecoveryResult(
        rounds=rounds,
        terminal=all(view is not None and view.status.is_terminal for view in views),
        states={
            role: MISSING if view is None else view.native_state
            for role, view in zip(ROLES, views, strict=True)
        },
        succeeded=all(view is not None and view.status == "succeeded" for view in views),
    )
