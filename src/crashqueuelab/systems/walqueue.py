"""walqueue as a system under test, and everything the lab knows of its crash points.

walqueue has one owner per directory, so its workers live in the owning process; it has no
heartbeat (a lease runs to its deadline) and no separate recovery step (``reserve`` expires
overdue leases first). Its fencing token is the lease's generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.judges.readers.walqueue import read_walqueue_directory
from crashqueuelab.systems.contract import (
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
from walqueue import Lease, Queue, StaleLease

#: walqueue's directory inside a store directory.
QUEUE_DIRECTORY = "walqueue"
_STATUS = {
    "ready": JobStatus.PENDING,
    "leased": JobStatus.LEASED,
    "completed": JobStatus.SUCCEEDED,
    "dead": JobStatus.DEAD,
}


class WalqueueClient:
    """``QueueClient`` over one walqueue ``Queue``; task ids are the jobs' keys."""

    def __init__(self, request: OpenRequest) -> None:
        self.queue = Queue(request.directory / QUEUE_DIRECTORY, hook=request.hook)
        self._clock = request.clock
        self._retry = request.retry

    def submit(self, job: JobSpec) -> str:
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        return self.queue.put_many(
            [
                {
                    "task_id": job.key,
                    "payload": {"job_type": job.job_type, "body": job.payload},
                    "max_attempts": job.max_attempts,
                }
                for job in jobs
            ]
        )

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claims = self.claim_many(worker_id, lease_us, 1)
        return claims[0] if claims else None

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        leases = self.queue.reserve(
            worker_id, now=self._clock.now_us(), lease_seconds=lease_us, limit=limit
        )
        return [self._claim(lease) for lease in leases]

    @staticmethod
    def _claim(lease: Lease) -> Claim:
        payload: dict[str, Any] = lease.payload
        return Claim(
            job_id=lease.task_id,
            key=lease.task_id,
            job_type=str(payload["job_type"]),
            payload=dict(payload["body"]),
            attempt=lease.attempts,
            worker_id=lease.worker,
            token=str(lease.generation),
            handle=lease,
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("walqueue", "heartbeat")

    def succeed(self, claim: Claim) -> Verdict:
        try:
            self.queue.ack(self._lease(claim), now=self._clock.now_us())
        except StaleLease:
            return Verdict.STALE
        return Verdict.SUCCEEDED

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        return [self.succeed(claim) for claim in claims]

    def fail(self, claim: Claim, error: str) -> Verdict:
        delay = self._retry.delay_us(claim.attempt)
        try:
            self.queue.release(self._lease(claim), now=self._clock.now_us(), delay=delay)
        except StaleLease:
            return Verdict.STALE
        return Verdict.DEAD if self.queue.get(claim.job_id).status == "dead" else Verdict.RETRY

    @staticmethod
    def _lease(claim: Claim) -> Lease:
        if isinstance(claim.handle, Lease):
            return claim.handle
        raise TypeError("a walqueue claim carries its Lease")

    def recover(self) -> int:
        # Expiry happens inside reserve; walqueue has no step of its own for it.
        return 0

    def checkpoint(self) -> None:
        self.queue.compact()

    def job(self, key: str) -> JobView | None:
        try:
            task = self.queue.get(key)
        except KeyError:
            return None
        return JobView(key, _STATUS[task.status], task.attempts, task.status)

    def active_count(self) -> int:
        counts = self.queue.stats()["counts"]
        return int(counts["ready"] + counts["leased"])

    def close(self) -> None:
        self.queue.close()


def read_store(directory: Path) -> StoreReading:
    """The judges' independent reading of walqueue's segments, snapshot and CURRENT."""
    reading = read_walqueue_directory(directory / QUEUE_DIRECTORY)
    return StoreReading(
        exists=reading.exists,
        jobs={
            key: StoredJob(status, _STATUS.get(status, JobStatus.PENDING), attempts)
            for key, (status, attempts) in reading.tasks.items()
        },
        facts=reading.facts,
        ok=reading.ok,
        problems=reading.problems,
        judge="crashqueuelab.judges.readers.walqueue (its own parser and replay of the directory)",
        history=reading.history,
    )


def _expect(
    effect: tuple[str, int] | None,
    flaky: tuple[str, int] | None,
    effects: int,
    *,
    last: str | None,
    seq: int,
    segments: int,
    torn: bool = False,
    snapshots: int = 0,
    temporary: int = 0,
    published: int | None = None,
) -> ExpectedState:
    return ExpectedState(
        effect,
        flaky,
        effects,
        {
            "last_seq": seq,
            "last_transaction": last,
            "torn_tail": torn,
            "segments": segments,
            "snapshots": snapshots,
            "temporary_files": temporary,
            "published_snapshot": published,
        },
    )


_EMPTY = _expect(None, None, 0, last=None, seq=0, segments=1)
_READY = ("ready", 0)
_LEASED = ("leased", 1)
_DONE = ("completed", 1)
# The compaction runs while the vanished worker holds the flaky job (its 7th transaction).
_VANISHED = ("leased", 2)


def _compacting(
    *, segments: int = 2, snapshots: int = 0, temporary: int = 0, published: bool = False
) -> ExpectedState:
    return _expect(
        _DONE,
        _VANISHED,
        1,
        # Once the sealed segment is gone, only the snapshot tells of transaction 7.
        last="reserve" if segments == 2 else None,
        seq=7,
        segments=segments,
        snapshots=snapshots,
        temporary=temporary,
        published=7 if published else None,
    )


CRASH_POINTS = (
    CrashPoint(
        "rotate:before_create",
        "opening a fresh directory, before its first segment exists",
        _expect(None, None, 0, last=None, seq=0, segments=0),
    ),
    CrashPoint(
        "rotate:after_create",
        "the first segment created, its directory entry not yet synced",
        _EMPTY,
    ),
    CrashPoint("rotate:after_dir_sync", "the first segment durable", _EMPTY),
    CrashPoint("append:before_write", "the first put, before any byte of its frame", _EMPTY),
    CrashPoint(
        "append:mid_write",
        "half of the first put's frame written: a torn tail",
        _expect(None, None, 0, last=None, seq=0, segments=1, torn=True),
    ),
    CrashPoint(
        "append:after_write",
        "the first put's frame written, not synced",
        _expect(_READY, None, 0, last="put", seq=1, segments=1),
        unacknowledged=_EMPTY,
    ),
    CrashPoint(
        "append:after_sync",
        "the first put's frame synced, not applied in memory",
        _expect(_READY, None, 0, last="put", seq=1, segments=1),
    ),
    CrashPoint(
        "BEFORE_EFFECT_COMMIT",
        "inside the effect's ledger transaction",
        _expect(_LEASED, _READY, 0, last="reserve", seq=3, segments=1),
    ),
    CrashPoint(
        "AFTER_EFFECT_COMMIT",
        "the effect durable, the task not acknowledged",
        _expect(_LEASED, _READY, 1, last="reserve", seq=3, segments=1),
    ),
    CrashPoint("snapshot:before_write", "compaction: the WAL rotated", _compacting()),
    CrashPoint(
        "snapshot:after_sync",
        "compaction: the snapshot's .tmp written and synced",
        _compacting(temporary=1),
    ),
    CrashPoint(
        "snapshot:after_rename",
        "compaction: the snapshot renamed, CURRENT still old",
        _compacting(snapshots=1),
    ),
    CrashPoint(
        "snapshot:after_dir_sync",
        "compaction: the snapshot's name durable",
        _compacting(snapshots=1),
    ),
    CrashPoint(
        "current:before_write",
        "compaction: before CURRENT.tmp",
        _compacting(snapshots=1),
    ),
    CrashPoint(
        "current:after_sync",
        "compaction: CURRENT.tmp synced, CURRENT still old",
        _compacting(snapshots=1, temporary=1),
    ),
    CrashPoint(
        "current:after_rename",
        "compaction: CURRENT names the new snapshot",
        _compacting(snapshots=1, published=True),
    ),
    CrashPoint(
        "current:after_dir_sync",
        "compaction: the snapshot published",
        _compacting(snapshots=1, published=True),
    ),
    CrashPoint(
        "delete:before_unlink",
        "compaction: before the sealed segment goes",
        _compacting(snapshots=1, published=True),
    ),
    CrashPoint(
        "delete:after_unlink",
        "compaction: the sealed segment gone",
        _compacting(segments=1, snapshots=1, published=True),
    ),
    CrashPoint(
        "delete:after_dir_sync",
        "compaction: done",
        _compacting(segments=1, snapshots=1, published=True),
    ),
    CrashPoint(
        "recover:done",
        "recovered from a compaction that died before CURRENT named its snapshot",
        _compacting(snapshots=1),
        after="snapshot:after_dir_sync",
    ),
    CrashPoint(
        "truncate:before",
        "recovering from a torn first put, before the tail is cut",
        _expect(None, None, 0, last=None, seq=0, segments=1, torn=True),
        after="append:mid_write",
    ),
    CrashPoint(
        "truncate:after_truncate",
        "recovering: the torn tail cut off, not synced",
        _EMPTY,
        after="append:mid_write",
    ),
    CrashPoint(
        "truncate:after_sync",
        "recovering: the torn tail cut off and synced",
        _EMPTY,
        after="append:mid_write",
    ),
)

CAPABILITIES = Capabilities(
    fencing_tokens=True,
    heartbeats=False,
    several_processes=False,
    batching=False,
    single_owner=True,
    checkpoint=True,
)


def walqueue_system() -> System:
    """walqueue: the lab's second system, with its own write-ahead log."""
    from crashqueuelab import __version__

    return System(
        name="walqueue",
        version=f"walqueue (crashqueuelab {__version__})",
        durability=(
            "own WAL (the seed's format: frames appended to segments), fdatasync per"
            " transaction, directory fsync on create and rename"
        ),
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=WalqueueClient,
        reader=read_store,
    )
