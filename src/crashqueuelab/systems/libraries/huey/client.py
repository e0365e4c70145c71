"""huey's client: the lab's calls, made through huey's public API.

The adapter does what huey's consumer does, through huey's public API, with the lab's
worker in the consumer's place: ``enqueue`` a task, ``dequeue`` it, run the work, then
``execute`` it, so that huey itself stores the result or, when the task raises, re-enqueues
it with one retry fewer or stores its error. Each task's id is the job's key; its
arguments are the job type, the payload and ``max_attempts`` (huey's ``retries`` is
``max_attempts - 1``); the task returns the attempt that ran it, which huey keeps as its
result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
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
)
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

#: What a task in the process that dequeued it is, in this adapter's words.
DEQUEUED = "dequeued"
#: Where a task stands (the reader's states, and ``DEQUEUED``), in the lab's words.
STATUS = {
    QUEUED: JobStatus.PENDING,
    SCHEDULED: JobStatus.PENDING,
    DEQUEUED: JobStatus.LEASED,
    DONE: JobStatus.SUCCEEDED,
    ERROR: JobStatus.DEAD,
}
#: The name of the lab's task, on the adapter's huey and on the consumer's (``worker``).
TASK_NAME = "crashqueuelab_job"


class JobFailed(Exception):
    """What the lab's task raises inside ``huey.execute`` when the lab's work failed."""


def served_task(work: Callable[[str], None]) -> Callable[..., int]:
    """The lab's task as huey's own consumer runs it (``worker.serve``): the served process's
    work for the task's id (the job's key), returning the attempt as the adapter's task
    does. It is made here because huey names a task by its function's module and name
    (``crashqueuelab...huey.client.crashqueuelab_job``), and a message holds that name."""

    def run(job_type: str, payload: dict[str, Any], max_attempts: int, task: Any) -> int:
        work(str(task.id))
        return int(max_attempts - task.retries)

    return run


class HueyClient(LibraryClient):
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

        self.task = self.huey.task(name=TASK_NAME, context=True)(run)

    def _attempt(self, task: Any) -> int:
        return int(task.args[2]) - int(task.retries)

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
        return tokenless_claim(
            job_id=task.id,
            key=task.id,
            job_type=task.args[0],
            payload=task.args[1],
            attempt=attempt,
            worker_id=worker_id,
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

    def job(self, key: str) -> JobView | None:
        if key in self._in_flight:
            task = self._in_flight[key]
            return JobView(key, JobStatus.LEASED, self._attempt(task), DEQUEUED)
        for state, tasks in ((QUEUED, self.huey.pending()), (SCHEDULED, self.huey.scheduled())):
            for task in tasks:
                if task.id == key:
                    return JobView(key, STATUS[state], self._attempt(task) - 1, state)
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
