"""The SQLite-WAL ``DurableQueue`` as a system under test, and everything the lab knows of
its crash points: the one place where that knowledge lives (docs/fault-model.md explains it).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import JobNotFound, StaleLease
from crashqueuelab.core.models import Acknowledgement, AckResult, ClaimedJob, JobState
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.records import filler
from crashqueuelab.judges.readers.sqlite import QUEUE_FILE, read_queue_store
from crashqueuelab.systems.contract import (
    AttemptView,
    Capabilities,
    Claim,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    StoredJob,
    StoreReading,
    System,
    Verdict,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
    ExpectedState,
)
from crashqueuelab.systems.sqlite_carrier import behind_a_carrier

_STATUS = {
    JobState.QUEUED: JobStatus.PENDING,
    JobState.RETRY_SCHEDULED: JobStatus.PENDING,
    JobState.LEASED: JobStatus.LEASED,
    JobState.SUCCEEDED: JobStatus.SUCCEEDED,
    JobState.DEAD: JobStatus.DEAD,
}
_VERDICT = {
    JobState.SUCCEEDED: Verdict.SUCCEEDED,
    JobState.RETRY_SCHEDULED: Verdict.RETRY,
    JobState.DEAD: Verdict.DEAD,
}


_make_claim = filler(Claim)
_make_acknowledgement = filler(Acknowledgement)


def _claim(claimed: ClaimedJob, worker_id: str) -> Claim:
    job = claimed.job
    # Made without Claim's frozen __init__ (core/records.py): one claim a job on every path.
    return _make_claim(
        {
            "job_id": job.job_id,
            "key": job.idempotency_key,
            "job_type": job.job_type,
            "payload": job.payload,
            "attempt": claimed.attempt,
            "worker_id": worker_id,
            "token": claimed.lease_token,
            "handle": None,
        }
    )


def _acknowledgements(claims: Sequence[Claim]) -> list[Acknowledgement]:
    return [
        _make_acknowledgement(
            {"job_id": claim.job_id, "worker_id": claim.worker_id, "lease_token": claim.token}
        )
        for claim in claims
    ]


def _verdicts(results: Sequence[AckResult]) -> list[Verdict]:
    return [
        Verdict.STALE if result.job is None else _VERDICT[result.job.state] for result in results
    ]


class SqliteClient:
    """``QueueClient`` over one ``DurableQueue``."""

    def __init__(self, queue: DurableQueue) -> None:
        self.queue = queue

    def submit(self, job: JobSpec) -> str:
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        results = self.queue.submit_many(
            [
                {
                    "idempotency_key": job.key,
                    "job_type": job.job_type,
                    "payload": job.payload,
                    "max_attempts": job.max_attempts,
                }
                for job in jobs
            ]
        )
        return [result.job.job_id for result in results]

    def behind_a_carrier(self, call: Callable[[], Any], fate: str) -> Any:
        return behind_a_carrier(self.queue, call, fate)

    def shared_commits(self) -> dict[str, int]:
        return dataclasses.asdict(self.queue.shared_commits)

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claimed = self.queue.claim(worker_id=worker_id, lease_duration_us=lease_us)
        return None if claimed is None else _claim(claimed, worker_id)

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        claimed = self.queue.claim_many(
            worker_id=worker_id, lease_duration_us=lease_us, limit=limit
        )
        return [_claim(one, worker_id) for one in claimed]

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        try:
            self.queue.heartbeat(
                job_id=claim.job_id,
                worker_id=claim.worker_id,
                lease_token=claim.token,
                lease_duration_us=lease_us,
            )
        except StaleLease:
            return False
        return True

    def succeed(self, claim: Claim) -> Verdict:
        try:
            self.queue.succeed(
                job_id=claim.job_id, worker_id=claim.worker_id, lease_token=claim.token
            )
        except StaleLease:
            return Verdict.STALE
        # The queue answers an acknowledgement it refuses with StaleLease; any other answer
        # tells the caller the job succeeded, whatever the returned row says.
        return Verdict.SUCCEEDED

    def succeed_and_claim(self, claim: Claim, lease_us: int) -> tuple[Verdict, Claim | None]:
        try:
            _, claimed = self.queue.succeed_and_claim(
                job_id=claim.job_id,
                worker_id=claim.worker_id,
                lease_token=claim.token,
                lease_duration_us=lease_us,
            )
        except StaleLease:
            return Verdict.STALE, None
        # As for succeed: not refused means the caller is told the job succeeded.
        return Verdict.SUCCEEDED, None if claimed is None else _claim(claimed, claim.worker_id)

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        return _verdicts(self.queue.succeed_many(_acknowledgements(claims)))

    def succeed_many_and_claim(
        self, claims: Sequence[Claim], worker_id: str, lease_us: int, limit: int
    ) -> tuple[list[Verdict], list[Claim]]:
        results, claimed = self.queue.succeed_many_and_claim(
            _acknowledgements(claims), worker_id=worker_id, lease_duration_us=lease_us, limit=limit
        )
        return _verdicts(results), [_claim(one, worker_id) for one in claimed]

    def fail(self, claim: Claim, error: str) -> Verdict:
        try:
            job = self.queue.fail(
                job_id=claim.job_id, worker_id=claim.worker_id, lease_token=claim.token, error=error
            )
        except StaleLease:
            return Verdict.STALE
        return _VERDICT[job.state]

    def recover(self) -> int:
        return len(self.queue.recover_expired()) + len(self.queue.promote_retries())

    def checkpoint(self) -> None:
        # SQLite checkpoints its WAL by itself; no step of the queue's is a crash point here.
        return None

    def job(self, key: str) -> JobView | None:
        try:
            job = self.queue.get_by_key(key)
        except JobNotFound:
            return None
        return JobView(key, _STATUS[job.state], job.attempts, job.state.value)

    def attempts(self, key: str) -> list[AttemptView] | None:
        try:
            attempts = self.queue.attempts(self.queue.get_by_key(key).job_id)
        except JobNotFound:
            return None
        return [
            AttemptView(
                one.attempt,
                one.worker_id,
                one.lease_token,
                one.lease_deadline_us,
                None if one.outcome is None else one.outcome.value.lower(),
            )
            for one in attempts
        ]

    def active_count(self) -> int:
        return self.queue.active_count()

    def close(self) -> None:
        self.queue.close()


def open_sqlite(
    request: OpenRequest, queue_class: type[DurableQueue] = DurableQueue
) -> SqliteClient:
    """The queue file of a store directory, opened with the request's clock, ids and hook
    (``queue_class``: a variant of the queue, as the lab's mutants are)."""
    request.directory.mkdir(parents=True, exist_ok=True)
    return SqliteClient(
        queue_class(
            request.directory / QUEUE_FILE,
            clock=request.clock,
            ids=request.ids,
            retry=request.retry,
            hook=request.hook,
        )
    )


def read_store(directory: Path) -> StoreReading:
    """The judges' reading of a store directory: observation, replay and invariants."""
    reading = read_queue_store(directory)
    return StoreReading(
        exists=reading.exists,
        jobs={
            key: StoredJob(state, _STATUS[JobState(state)], attempts, reading.deadlines.get(key))
            for key, (state, attempts) in reading.jobs.items()
        },
        facts={"last_event": reading.last_event},
        ok=reading.ok,
        problems=reading.problems,
        judge="crashqueuelab.judges (replay + invariants over the SQLite file)",
        history=reading.history,
        checks={"replay": reading.replay_ok, "invariants": reading.invariants_ok},
    )


def _expect(
    effect: tuple[str, int] | None,
    flaky: tuple[str, int] | None,
    effects: int,
    last: str | None,
    deadline: str = "none",
) -> ExpectedState:
    # Every deadline is durable once its claim or heartbeat committed: declared everywhere.
    return ExpectedState(effect, flaky, effects, {"last_event": last}, effect_deadline=deadline)


_QUEUED = ("QUEUED", 0)
_LEASED = ("LEASED", 1)
_DONE = ("SUCCEEDED", 1)

#: Every point of ``core.hooks.Phase`` where a death leaves a state of its own; the three
#: ``BEFORE_*`` phases left out (heartbeat, recovery, promotion) leave exactly the state of
#: the point before them (docs/fault-model.md).
CRASH_POINTS = (
    CrashPoint(
        "BEFORE_SUBMIT_COMMIT",
        "inside the first submit, before COMMIT",
        _expect(None, None, 0, None),
    ),
    CrashPoint(
        "AFTER_SUBMIT_COMMIT",
        "the first submit committed, the producer not told",
        _expect(_QUEUED, None, 0, "SUBMITTED"),
    ),
    CrashPoint(
        "BEFORE_CLAIM_COMMIT",
        "inside the first claim, before COMMIT",
        _expect(_QUEUED, _QUEUED, 0, "SUBMITTED"),
    ),
    CrashPoint(
        "AFTER_CLAIM_COMMIT",
        "the effect job claimed, the worker not told",
        _expect(_LEASED, _QUEUED, 0, "CLAIMED", "claim"),
    ),
    CrashPoint(
        "AFTER_HEARTBEAT_COMMIT",
        "the effect job's lease extended",
        _expect(_LEASED, _QUEUED, 0, "HEARTBEAT", "heartbeat"),
    ),
    CrashPoint(
        "BEFORE_EFFECT_COMMIT",
        "inside the effect's ledger transaction",
        _expect(_LEASED, _QUEUED, 0, "HEARTBEAT", "heartbeat"),
    ),
    CrashPoint(
        "AFTER_EFFECT_COMMIT",
        "the effect durable, the job not acknowledged",
        _expect(_LEASED, _QUEUED, 1, "HEARTBEAT", "heartbeat"),
    ),
    CrashPoint(
        "BEFORE_SUCCESS_COMMIT",
        "inside the acknowledgement, before COMMIT",
        _expect(_LEASED, _QUEUED, 1, "HEARTBEAT", "heartbeat"),
    ),
    CrashPoint(
        "AFTER_SUCCESS_COMMIT",
        "the effect job acknowledged",
        _expect(_DONE, _QUEUED, 1, "SUCCEEDED"),
    ),
    CrashPoint(
        "BEFORE_FAILURE_COMMIT",
        "inside the flaky job's failure, before COMMIT",
        _expect(_DONE, ("LEASED", 1), 1, "CLAIMED"),
    ),
    CrashPoint(
        "AFTER_FAILURE_COMMIT",
        "the flaky job's first failure committed",
        _expect(_DONE, ("RETRY_SCHEDULED", 1), 1, "FAILED"),
    ),
    CrashPoint(
        "AFTER_PROMOTION_COMMIT",
        "the flaky job's retry promoted",
        _expect(_DONE, ("QUEUED", 1), 1, "PROMOTED"),
    ),
    CrashPoint(
        "AFTER_RECOVERY_COMMIT",
        "the vanished worker's lease recovered",
        _expect(_DONE, ("RETRY_SCHEDULED", 2), 1, "LEASE_EXPIRED"),
    ),
)

CAPABILITIES = Capabilities(
    fencing_tokens=True,
    heartbeats=True,
    several_processes=True,
    batching=True,
    single_owner=False,
    checkpoint=False,
    chained=True,
    carried=True,
)


def sqlite_system() -> System:
    """The default system: crashqueuelab's own SQLite-WAL queue."""
    from crashqueuelab import __version__

    return System(
        name="sqlite",
        version=f"crashqueuelab {__version__} (SQLite {sqlite3.sqlite_version})",
        durability="WAL, synchronous=FULL",
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=open_sqlite,
        reader=read_store,
    )
