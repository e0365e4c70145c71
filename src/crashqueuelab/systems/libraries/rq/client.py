"""RQ's client: the lab's calls, made through RQ's own worker code.

The adapter runs RQ's own worker code with the lab's worker in charge of the work: a claim
is ``Queue.dequeue_any`` (what RQ's worker calls to take a job) and then
``SimpleWorker.execute_job`` in a thread of the adapter's, which marks the job started,
puts it in RQ's started registry, and calls the lab's job function; that function waits
there until the lab reports the outcome, and returns or raises, so that RQ itself records
the job finished, or retries it, or moves it to its failed registry. The thread's death
penalty is RQ's ``TimerDeathPenalty`` (the one for workers off the main thread).

Each job has the lab's key and ``max_attempts`` in its description, a job id derived from
both the store and the key, ``Retry(max=max_attempts - 1)``, and results and failures that
never expire. RQ has no idempotency key: a producer that submits again enqueues only when
no job has that id (RQ would overwrite it otherwise).

RQ's time is the wall clock of whoever runs its maintenance, and its ``cleanup`` takes that
time as an argument: ``recover`` runs RQ's maintenance (the started registry's cleanup, the
intermediate queue's) at the lab's time, counted from when the store was first opened, so
that an hour of the lab's clock is an hour to RQ.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import OperationUnsupported, OutcomeUnknown, SystemUnavailable
from crashqueuelab.judges.readers.rq import (
    DEQUEUED,
    DESCRIPTION_PREFIX,
    FAILED,
    FINISHED,
    QUEUE_FILE,
    QUEUED,
    SOCKET_VARIABLE,
    STARTED,
    attempts_made,
)
from crashqueuelab.servers.redis import MASTER_VARIABLE, SENTINELS_VARIABLE, WAIT_VARIABLE
from crashqueuelab.systems.boundary import around
from crashqueuelab.systems.contract import Claim, JobSpec, JobStatus, JobView, OpenRequest, Verdict
from crashqueuelab.systems.libraries.redisstore import kept_once, unique_suffix
from crashqueuelab.systems.libraries.skeleton import LibraryClient, tokenless_claim

#: RQ's job timeout for the lab's jobs: the longest a claim may be held before RQ's death
#: penalty ends it, and (plus 60 s) the heartbeat TTL after which a dead worker's job is
#: handed back.
JOB_TIMEOUT_S = 300
#: How long a claim waits for RQ's worker code to start the job in its thread.
START_TIMEOUT_S = 30.0
#: Where a job stands (the reader's states), in the lab's words.
STATUS = {
    QUEUED: JobStatus.PENDING,
    DEQUEUED: JobStatus.LEASED,
    STARTED: JobStatus.LEASED,
    FINISHED: JobStatus.SUCCEEDED,
    FAILED: JobStatus.DEAD,
    "scheduled": JobStatus.PENDING,
    "deferred": JobStatus.PENDING,
    "stopped": JobStatus.DEAD,
    "canceled": JobStatus.DEAD,
}


class JobFailed(Exception):
    """What the lab's job function raises inside RQ's worker when the lab's work failed."""


class OutcomeNotRecorded(RuntimeError):
    """RQ's worker code ended a job's execution without recording its end."""


class _Execution(threading.Thread):
    """RQ's ``execute_job`` for one claimed job, paused inside the job function until the
    lab says how the work ended."""

    def __init__(self, worker: Any, job: Any, queue: Any) -> None:
        super().__init__(name=f"rq-execution-{job.id}", daemon=True)
        self.worker, self.job, self.queue = worker, job, queue
        self.entered = threading.Event()
        self.decided = threading.Event()
        self.failure: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.worker.execute_job(self.job, self.queue)
        except BaseException as error:  # reported to the claim or the completion
            self.error = error
        finally:
            self.entered.set()

    def await_decision(self) -> int:
        self.entered.set()
        if not self.decided.wait(JOB_TIMEOUT_S):
            raise JobFailed("the lab never reported how the work ended")
        if self.failure is not None:
            raise JobFailed(self.failure)
        return 0

    def finish(self, failure: str | None) -> None:
        self.failure = failure
        self.decided.set()
        self.join(START_TIMEOUT_S + JOB_TIMEOUT_S)


#: The work of the worker process RQ's own worker runs in (``worker.serve`` sets it): the
#: work horse RQ forks for each job is a copy of that process, and a context variable set
#: in its main thread before ``Worker.work`` is the value the horse's main thread sees. RQ
#: hands a job function nothing of the worker that runs it (no context, no worker object;
#: only the job, through ``get_current_job``, and a job holds no callable), so a holder
#: the job function reads is the only way in; a context variable, not a module's mutable
#: global, so that nothing outside ``serve``'s context sees it.
SERVED_WORK: contextvars.ContextVar[Callable[[str], None]] = contextvars.ContextVar(
    "crashqueuelab_rq_served_work"
)


def lab_job(key: str, job_type: str, payload: dict[str, Any]) -> int:
    """The function every lab job names. Run by the adapter's thread, it waits for the
    lab's outcome; run by RQ's own worker (``worker.serve``, in the work horse it forks), it
    does the worker process's work for ``key``."""
    execution = threading.current_thread()
    if isinstance(execution, _Execution):
        return execution.await_decision()
    work = SERVED_WORK.get(None)
    if work is None:
        raise JobFailed(f"job {key} runs only under crashqueuelab (its adapter or its worker)")
    work(key)
    return 0


def _store(directory: Path, now_us: int) -> dict[str, Any]:
    """The store's queue name and the time it was first opened on both clocks."""
    return kept_once(
        directory / QUEUE_FILE,
        lambda: {
            "queue": f"lab-{unique_suffix(directory)}",
            "lab_us": now_us,
            "wall_s": time.time(),
        },
    )


def job_id(queue: str, key: str) -> str:
    """The RQ job id of the lab's job ``key`` on ``queue``."""
    digest = hashlib.sha256(f"{queue}/{key}".encode()).hexdigest()
    return f"{queue}-{digest[:24]}"


def enqueue_options(queue: str, job: JobSpec) -> dict[str, Any]:
    """What every lab job is enqueued with besides ``lab_job`` and its arguments: its id,
    its key and ``max_attempts`` in its description, RQ's retries, its timeout, and results
    and failures that never expire."""
    from rq import Retry

    description = DESCRIPTION_PREFIX + json.dumps(
        {"key": job.key, "max_attempts": job.max_attempts}
    )
    return {
        "job_id": job_id(queue, job.key),
        "description": description,
        "retry": Retry(max=job.max_attempts - 1) if job.max_attempts > 1 else None,
        "job_timeout": JOB_TIMEOUT_S,
        "result_ttl": -1,
        "failure_ttl": -1,
    }


#: The key each WAIT follows (one per store's queue; the judges' reader reads no other).
WAIT_BARRIER_PREFIX = "crashqueuelab:wait-barrier:"


def _wait_setting(text: str | None) -> tuple[int, int] | None:
    """``WAIT_VARIABLE``'s "REPLICAS,TIMEOUT_MS", or None."""
    if not text:
        return None
    replicas, timeout_ms = (int(part) for part in text.split(","))
    return replicas, timeout_ms


class RqClient(LibraryClient):
    """``QueueClient`` over one RQ queue."""

    def __init__(self, request: OpenRequest) -> None:
        import redis
        from rq import Queue, SimpleWorker
        from rq.timeouts import TimerDeathPenalty

        socket = os.environ.get(SOCKET_VARIABLE)
        sentinels = os.environ.get(SENTINELS_VARIABLE)
        if not socket and not sentinels:
            raise SystemUnavailable(
                "rq", f"no Redis server: the command line starts one; {SOCKET_VARIABLE} is unset"
            )
        self.hook = request.hook
        self.clock = request.clock
        # RQ's worker logs every job and the traceback of every failure (its module sets
        # the level at import): the lab's own logs say what happened, and a crash child's
        # stderr is for its errors.
        for name in ("rq", "rq.worker", "rq.queue", "rq.job"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.store = _store(request.directory, request.clock.now_us())
        if sentinels:
            # A replicated Redis: the primary is whichever the Sentinels name now, as
            # RQ's documentation has it for Sentinel (redis-py's Sentinel.master_for).
            from redis.sentinel import Sentinel

            addresses = [
                (host, int(port))
                for host, port in (entry.rsplit(":", 1) for entry in sentinels.split(","))
            ]
            master = os.environ.get(MASTER_VARIABLE, "mymaster")
            self.connection = Sentinel(addresses, socket_timeout=5.0).master_for(
                master, socket_timeout=5.0
            )
        else:
            self.connection = redis.Redis(unix_socket_path=socket)
        self.queue = Queue(self.store["queue"], connection=self.connection)
        #: Redis's WAIT after each enqueue (replicas, timeout in ms), where the run asks.
        self.wait = _wait_setting(os.environ.get(WAIT_VARIABLE))

        class LabWorker(SimpleWorker):
            death_penalty_class = TimerDeathPenalty

        self.worker_class = LabWorker
        self.workers: dict[str, Any] = {}
        self.executions: dict[str, _Execution] = {}

    def _job_id(self, key: str) -> str:
        return job_id(self.store["queue"], key)

    def _fetch(self, key: str) -> Any:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        try:
            return Job.fetch(self._job_id(key), connection=self.connection)
        except NoSuchJobError:
            return None

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        for job in jobs:
            if self._fetch(job.key) is None:
                around(
                    self.hook,
                    "enqueue",
                    partial(
                        self.queue.enqueue,
                        lab_job,
                        job.key,
                        job.job_type,
                        job.payload,
                        **enqueue_options(self.store["queue"], job),
                    ),
                )
            # A job found already (a retry of a submission whose answer was lost) is
            # answered as submitted too: it waits for the replicas the same way.
            self._replicated(job.key)
        return [self._job_id(job.key) for job in jobs]

    def _replicated(self, key: str) -> None:
        """Redis's WAIT, where the run asks for it, before a submission is acknowledged.

        WAIT waits for the writes its own connection made, and RQ writes a job through
        whichever of its pool's connections (a Lua script for a job with an id); so a
        barrier key is written first, on WAIT's own connection, in the same batch (not a
        transaction: WAIT inside MULTI does not block). The replication stream is the
        primary's order of execution: a replica that acknowledged the barrier holds the job
        written before it. Fewer replicas than asked within the timeout: the caller is told
        the outcome is unknown (the job may be on the primary alone, which a failover can
        take away)."""
        if self.wait is None:
            return
        replicas, timeout_ms = self.wait
        pipe = self.connection.pipeline(transaction=False)
        pipe.set(f"{WAIT_BARRIER_PREFIX}{self.store['queue']}", key)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        acknowledged = int(pipe.execute()[-1])
        if acknowledged < replicas:
            raise OutcomeUnknown(
                "rq",
                f"WAIT {replicas} {timeout_ms}: {acknowledged} replica(s) acknowledged job"
                f" {key} in time",
            )

    def _worker(self, worker_id: str) -> Any:
        if worker_id not in self.workers:
            # RQ's worker names are global to the server: each client's are its own, as
            # each of RQ's worker processes has a name of its own.
            name = f"{worker_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            worker: Any = self.worker_class([self.queue], connection=self.connection, name=name)
            worker.register_birth()
            self.workers[worker_id] = worker
        return self.workers[worker_id]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        from rq import Queue

        worker = self._worker(worker_id)
        taken = around(
            self.hook,
            "dequeue",
            partial(Queue.dequeue_any, [self.queue], None, connection=self.connection),
        )
        if taken is None:
            return None
        job, queue = taken
        execution = _Execution(worker, job, queue)
        if self.hook is not None:
            self.hook("start:before")
        execution.start()
        if not execution.entered.wait(START_TIMEOUT_S) or execution.error is not None:
            raise SystemUnavailable(
                "rq", f"RQ's worker did not start job {job.id}: {execution.error}"
            )
        if self.hook is not None:
            self.hook("start:after")
        key = str(job.args[0])
        self.executions[key] = execution
        spec = json.loads(str(job.description)[len(DESCRIPTION_PREFIX) :])
        attempt = attempts_made(STARTED, int(spec["max_attempts"]), job.retries_left)
        return tokenless_claim(
            job_id=job.id,
            key=key,
            job_type=str(job.args[1]),
            payload=dict(job.args[2]),
            attempt=attempt,
            worker_id=worker_id,
            handle=execution,
        )

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("rq", "heartbeat")

    def _finish(self, claim: Claim, failure: str | None, point: str) -> bool:
        """Hand the claim's outcome to RQ's worker code; False when its execution has ended
        already (a first report, or RQ's own death penalty): RQ recorded that outcome, and
        nothing of this report reaches it."""
        execution: _Execution = claim.handle  # type: ignore[assignment]
        if execution.decided.is_set() or not execution.is_alive():
            return False
        around(self.hook, point, partial(execution.finish, failure))
        if self.executions.get(claim.key) is execution:
            del self.executions[claim.key]
        self._recorded(execution, claim.key)
        return True

    @staticmethod
    def _recorded(execution: _Execution, key: str) -> None:
        """Raise unless RQ recorded the end of ``execution``. RQ's worker code catches an
        error while it records a job's end (``perform_job`` logs it and returns), so a
        Redis that refused or went away then leaves the job ``started`` with nobody told:
        read back (RQ's own ``get_status``, which raises when Redis is gone), that is what
        the caller is told instead of an outcome RQ never wrote."""
        status = str(execution.job.get_status(refresh=True)).rsplit(".", 1)[-1].lower()
        if status == STARTED:
            raise OutcomeNotRecorded(
                f"RQ's worker code did not record the end of job {key}: it holds it started"
            )

    def succeed(self, claim: Claim) -> Verdict:
        return Verdict.SUCCEEDED if self._finish(claim, None, "finish") else Verdict.STALE

    def fail(self, claim: Claim, error: str) -> Verdict:
        execution: _Execution = claim.handle  # type: ignore[assignment]
        retries_left = execution.job.retries_left or 0
        if not self._finish(claim, error, "fail"):
            return Verdict.STALE
        return Verdict.RETRY if retries_left > 0 else Verdict.DEAD

    def _rq_now(self) -> float:
        """The lab's time as RQ's: the wall time the store was first opened, plus what the
        lab's clock has run since."""
        elapsed_s = (self.clock.now_us() - int(self.store["lab_us"])) / 1e6
        return max(time.time(), float(self.store["wall_s"]) + elapsed_s)

    def recover(self) -> int:
        # RQ's maintenance, as its worker runs it (``clean_registries``), at the lab's time.
        before = len(self.queue)
        self.queue.started_job_registry.cleanup(timestamp=self._rq_now())
        intermediate = getattr(self.queue, "intermediate_queue", None)
        if intermediate is not None:
            intermediate.cleanup(self._worker("maintenance"), self.queue)
        return max(0, len(self.queue) - before)

    def job(self, key: str) -> JobView | None:
        job = self._fetch(key)
        if job is None:
            return None
        status = str(job.get_status(refresh=False))
        status = status.rsplit(".", 1)[-1].lower()
        spec = json.loads(job.description[len(DESCRIPTION_PREFIX) :])
        attempts = attempts_made(status, int(spec["max_attempts"]), job.retries_left)
        if status == QUEUED and job.id not in self.queue.job_ids:
            status = DEQUEUED
        return JobView(key, STATUS.get(status, JobStatus.PENDING), attempts, status)

    def active_count(self) -> int:
        return len(self.queue) + len(self.queue.started_job_registry)

    def close(self) -> None:
        for worker in self.workers.values():
            worker.register_death()
        self.workers.clear()
        self.connection.close()
