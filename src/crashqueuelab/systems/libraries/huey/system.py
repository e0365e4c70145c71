"""huey's ``SqliteHuey`` as a system under test (``pip install crashqueuelab[peers]``).

The adapter does what huey's consumer does, through huey's public API, with the lab's
worker in the consumer's place: ``enqueue`` a task, ``dequeue`` it, run the work, then
``execute`` it, so that huey itself stores the result or, when the task raises, re-enqueues
it with one retry fewer or stores its error. Each task's id is the job's key; its
arguments are the job type, the payload and ``max_attempts`` (huey's ``retries`` is
``max_attempts - 1``); the task returns the attempt that ran it, which huey keeps as its
result.

What huey does not have, the adapter does not pretend: no leases, no tokens, no
acknowledgement. A dequeued task exists only in the memory of the process that took it (as
in huey's consumer), so a death there loses it; an idempotent producer that submits again
finds nothing of it and enqueues it anew. huey documents both (``DOCUMENTED``).

Two systems: ``huey`` at the installed release's defaults, and ``huey-fsync`` with
``fsync=True``. Up to 3.2.x huey's default sets ``synchronous=OFF``; from 3.3.0 it leaves
SQLite's default (FULL), so which of the two a default run is depends on the release.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.judges.readers.huey import (
    DATABASE_FILE,
    DONE,
    ERROR,
    FAILED_ATTEMPT,
    QUEUED,
    SCHEDULED,
    failed_attempt,
    read_huey_file,
)
from crashqueuelab.systems.boundary import (
    OneAtATime,
    around,
    boundary_point,
    library_capabilities,
    library_reading,
)
from crashqueuelab.systems.contract import (
    Claim,
    Documented,
    JobSpec,
    JobStatus,
    JobView,
    OpenRequest,
    StoreReading,
    System,
    Verdict,
)

DISTRIBUTION = "huey"
#: The first release whose default leaves SQLite's own ``synchronous`` setting alone.
SYNCED_BY_DEFAULT_FROM = (3, 3, 0)
#: What a task in the process that dequeued it is, in this adapter's words.
DEQUEUED = "dequeued"
_STATUS = {
    QUEUED: JobStatus.PENDING,
    SCHEDULED: JobStatus.PENDING,
    DEQUEUED: JobStatus.LEASED,
    DONE: JobStatus.SUCCEEDED,
    ERROR: JobStatus.DEAD,
}
_TASK_NAME = "crashqueuelab_job"
_API_DOCS = "https://huey.readthedocs.io/en/latest/api.html"
_SQLITE_DOCS = _API_DOCS + "#SqliteHuey"
_CONSUMER_DOCS = "https://huey.readthedocs.io/en/latest/signals.html"


class JobFailed(Exception):
    """What the lab's task raises inside ``huey.execute`` when the lab's work failed."""


class HueyClient(OneAtATime):
    """``QueueClient`` over one ``SqliteHuey`` file."""

    def __init__(self, request: OpenRequest, *, fsync: bool | None) -> None:
        from huey import SqliteHuey

        request.directory.mkdir(parents=True, exist_ok=True)
        self.hook = request.hook
        # huey logs every task it runs and the traceback of every failure: the lab's own
        # logs say what happened, and a crash child's stderr is for its errors.
        logging.getLogger("huey").setLevel(logging.CRITICAL)
        settings: dict[str, Any] = {} if fsync is None else {"fsync": fsync}
        self.huey = SqliteHuey(
            "crashqueuelab", filename=str(request.directory / DATABASE_FILE), **settings
        )
        self._failure: str | None = None
        self._in_flight: dict[str, Any] = {}

        def run(job_type: str, payload: dict[str, Any], max_attempts: int, task: Any) -> int:
            attempt = int(max_attempts - task.retries)
            if self._failure is not None:
                # The attempt goes into the error huey stores: its Error keeps no count.
                raise JobFailed(f"{FAILED_ATTEMPT} {attempt}: {self._failure}")
            return attempt

        self.task = self.huey.task(name=_TASK_NAME, context=True)(run)

    def _attempt(self, task: Any) -> int:
        return int(task.args[2]) - int(task.retries)

    def submit(self, job: JobSpec) -> str:
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        for job in jobs:
            # huey has no idempotency key: what it can tell of a key is a waiting task or a
            # stored result under that id. A task a dead process had dequeued is neither.
            if self.job(job.key) is not None:
                continue
            task = self.task.task_class(
                args=(job.job_type, job.payload, job.max_attempts),
                id=job.key,
                retries=job.max_attempts - 1,
            )
            around(self.hook, "enqueue", partial(self.huey.enqueue, task))
        return [job.key for job in jobs]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        task = around(self.hook, "dequeue", self.huey.dequeue)
        if task is None:
            return None
        self._in_flight[task.id] = task
        attempt = self._attempt(task)
        return Claim(
            job_id=task.id,
            key=task.id,
            job_type=task.args[0],
            payload=task.args[1],
            attempt=attempt,
            worker_id=worker_id,
            # No token exists; the task id and attempt name the claim for the lab's logs.
            token=f"{task.id}.{attempt}",
            handle=task,
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("huey", "heartbeat")

    def _execute(self, claim: Claim, failure: str | None, point: str) -> None:
        task = claim.handle
        self._failure = failure
        try:
            around(self.hook, point, partial(self.huey.execute, task))
        finally:
            self._failure = None
            self._in_flight.pop(claim.key, None)

    def succeed(self, claim: Claim) -> Verdict:
        self._execute(claim, None, "execute")
        return Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        task: Any = claim.handle
        retries_left = int(task.retries)
        self._execute(claim, error, "execute-error")
        return Verdict.RETRY if retries_left > 0 else Verdict.DEAD

    def recover(self) -> int:
        # huey has no leases to expire. Retries wait in the schedule only with a
        # retry_delay, which the lab's tasks do not set.
        return 0

    def checkpoint(self) -> None:
        return None

    def job(self, key: str) -> JobView | None:
        if key in self._in_flight:
            task = self._in_flight[key]
            return JobView(key, JobStatus.LEASED, self._attempt(task), DEQUEUED)
        for state, tasks in ((QUEUED, self.huey.pending()), (SCHEDULED, self.huey.scheduled())):
            for task in tasks:
                if task.id == key:
                    return JobView(key, _STATUS[state], self._attempt(task) - 1, state)
        value = self.huey.get(key, peek=True)
        if value is None:
            return None
        if isinstance(value, int):
            return JobView(key, JobStatus.SUCCEEDED, value, DONE)
        return JobView(key, JobStatus.DEAD, failed_attempt(value.metadata), ERROR)

    def active_count(self) -> int:
        return int(self.huey.pending_count()) + int(self.huey.scheduled_count())

    def close(self) -> None:
        self.huey.storage.close()


def read_store(directory: Path) -> StoreReading:
    """The judges' reading of huey's file, without huey's code."""
    reading = read_huey_file(directory)
    return library_reading(
        exists=reading.exists,
        jobs=reading.jobs,
        problems=reading.problems,
        statuses=_STATUS,
        judge=f"crashqueuelab.judges.readers.huey (reads {DATABASE_FILE} directly)",
    )


_NO_ACKNOWLEDGEMENT = Documented(
    "no acknowledgement: a task leaves huey's store when a consumer dequeues it, so a"
    " consumer that dies while the task runs loses it (SIGNAL_INTERRUPTED is sent only on"
    " a clean shutdown)",
    _CONSUMER_DOCS,
    points=(
        "dequeue:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "execute:before",
        "execute-error:before",
    ),
    explains=(
        "probe stale_holder_after_expiry: *the queue offered nothing",
        "probe batched_acknowledgement_fences_each_item: *the queue offered nothing",
        "probe expired_attempts_run_out: *yet it is dequeued (leased)*",
        # Chaos: a consumer killed holding a task took it with it.
        "job *: missing from the store (lost; claimed by *, which never answered for it)",
        "job *: missing from the store (lost; in no worker's log, and * workers' logs end"
        " inside a claim call, for * such job*)",
        "job * (poison): missing from the store (lost)",
    ),
)
_NO_LEASES = Documented(
    "no leases: huey has no deadline, visibility timeout or token, so a late or repeated"
    " completion is accepted like any other, and a repeated failure runs huey's retry"
    " again, which enqueues the task once more",
    _API_DOCS,
    explains=(
        "probe acknowledgement_at_the_deadline: *was accepted*",
        "model workload: *was accepted (at *",
        # The second copy a stale holder's repeated failure enqueued, claimed in its turn.
        "model workload: job *: claimed by * after an accepted acknowledgement (at *",
        "model workload: job *: claimed by * while *'s lease * was live until *",
        "job *: *, stopped past its lease, had its late acknowledgement accepted",
    ),
)


_point = partial(boundary_point, "huey")


_NEW, _DONE = (QUEUED, 0), (DONE, 1)
#: The first occurrence of each point in the lab's workload: enqueue both jobs, run the
#: effect job (dequeue, work, execute), run the flaky job once (dequeue, execute: it raises
#: and huey enqueues it again with one retry fewer). A dequeued task is in no table.
CRASH_POINTS = (
    _point("enqueue:before", None, None, 0),
    _point("enqueue:after", _NEW, None, 0),
    _point("dequeue:before", _NEW, _NEW, 0),
    _point("dequeue:after", None, _NEW, 0),
    _point("BEFORE_EFFECT_COMMIT", None, _NEW, 0),
    _point("AFTER_EFFECT_COMMIT", None, _NEW, 1),
    _point("execute:before", None, _NEW, 1),
    _point("execute:after", _DONE, _NEW, 1),
    _point("execute-error:before", _DONE, None, 1),
    _point("execute-error:after", _DONE, (QUEUED, 1), 1),
)

CAPABILITIES = library_capabilities(heartbeats=False)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def _system(name: str, fsync: bool | None) -> System:
    # Imported here, once: the lab opens systems from several threads at a time.
    import huey  # noqa: F401

    installed = version(DISTRIBUTION)
    documented = [_NO_ACKNOWLEDGEMENT, _NO_LEASES]
    if fsync is True:
        durability = "fsync=True: synchronous=FULL, WAL (set by huey)"
    elif _release(installed) >= SYNCED_BY_DEFAULT_FROM:
        durability = "huey's default: SQLite's own synchronous (FULL), WAL (set by huey)"
    else:
        durability = "huey's default: fsync=False, synchronous=OFF, WAL (set by huey)"
        documented.append(
            Documented(
                f"huey {installed}'s default is fsync=False (synchronous=OFF): nothing is"
                " synced, so a power cut may take back what huey had answered;"
                " 3.3.0 changed the default to SQLite's own (FULL)",
                _SQLITE_DOCS,
                crash_modes=("power-loss",),
            )
        )
    return System(
        name=name,
        version=f"huey {installed} (SqliteHuey)",
        durability=durability,
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=partial(HueyClient, fsync=fsync),
        reader=read_store,
        documented=tuple(documented),
        distribution=DISTRIBUTION,
    )


def huey_system() -> System:
    """huey's SqliteHuey at the installed release's defaults."""
    return _system("huey", None)


def huey_fsync_system() -> System:
    """huey's SqliteHuey with ``fsync=True``."""
    return _system("huey-fsync", True)
