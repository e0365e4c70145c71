"""RQ's own worker (``rq worker --with-scheduler``), for the deploy experiment.

``serve`` runs what ``rq worker`` runs (``rq.cli.workers.worker``): a ``Worker`` on the
store's queue, its ``work(burst=False, with_scheduler=True)`` in this process's main
thread, which installs RQ's own SIGINT and SIGTERM handlers, forks a work horse for each
job (``lab_job``, which calls the process's work) and a scheduler process that moves due
scheduled jobs onto the queue. ``schedule`` is RQ's ``Queue.enqueue_at``.
"""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.rq import SOCKET_VARIABLE, queue_name
from crashqueuelab.systems.contract import OwnWorker
from crashqueuelab.systems.libraries.rq.client import SERVED_WORK, enqueue_options, lab_job
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users, scheduled_job

#: RQ's documentation of taking workers down, and of what a killed worker leaves.
SOURCE = "https://python-rq.org/docs/workers/#taking-down-workers"
SHUTDOWN = {
    "SIGTERM": "If, at any time, the worker receives `SIGINT` (via Ctrl+C) or `SIGTERM` (via"
    " `kill`), the worker wait until the currently running task is finished, stop the work"
    " loop and gracefully register its own death.",
    "SIGINT": "If, at any time, the worker receives `SIGINT` (via Ctrl+C) or `SIGTERM` (via"
    " `kill`), the worker wait until the currently running task is finished, stop the work"
    " loop and gracefully register its own death.",
    "second SIGTERM": "If, during this takedown phase, `SIGINT` or `SIGTERM` is received"
    " again, the worker will forcefully terminate the child process (sending it `SIGKILL`),"
    " but will still try to register its own death.",
    "SIGKILL": "workers can be killed forcefully by `kill -9`, which will not give the workers"
    " a chance to finish the job gracefully [...] If the worker gets killed while a job is"
    " running, it will eventually end up in `FailedJobRegistry` because a cleanup task will"
    " raise an `AbandonedJobError`. (https://python-rq.org/docs/results/)",
}


def _queue(directory: Path) -> Any:
    import redis
    from rq import Queue

    socket = os.environ.get(SOCKET_VARIABLE)
    if not socket:
        raise SystemUnavailable("rq", f"no Redis server: {SOCKET_VARIABLE} is unset")
    name = queue_name(directory)
    if name is None:
        raise SystemUnavailable("rq", f"no RQ store in {directory}: open it (System.open) first")
    return Queue(name, connection=redis.Redis(unix_socket_path=socket))


def serve(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    """``rq worker --with-scheduler --quiet <the store's queue>``, with ``work`` as each job's
    work; returns when RQ's worker exits (``work`` returns)."""
    from rq import Worker

    queue = _queue(directory)
    # RQ's worker names are global to the server, as the adapter's are.
    worker = Worker(
        [queue],
        connection=queue.connection,
        name=f"{worker_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
    )
    as_started_by_its_users()
    token = SERVED_WORK.set(work)
    try:
        worker.work(burst=False, logging_level="WARNING", with_scheduler=True)
    finally:
        SERVED_WORK.reset(token)
        queue.connection.close()


def schedule(directory: Path, key: str, due_s: float) -> None:
    """``Queue.enqueue_at`` of the lab's job ``key``, due at ``due_s`` (seconds since the
    epoch). RQ keeps whole seconds: its scheduled registry scores a job by ``calendar.timegm``
    of the time, dropping the fraction, and its scheduler moves every job whose score is at
    most the current whole second."""
    queue = _queue(directory)
    job = scheduled_job(key)
    try:
        queue.enqueue_at(
            datetime.datetime.fromtimestamp(due_s, tz=datetime.UTC),
            lab_job,
            job.key,
            job.job_type,
            job.payload,
            **enqueue_options(queue.name, job),
        )
    finally:
        queue.connection.close()


OWN_WORKER = OwnWorker(
    serve=serve,
    describe="rq's Worker.work as `rq worker --with-scheduler` runs it: a work horse forked"
    " per job (in a process group of its own, so a signal or SIGKILL to the worker's pid or"
    " group leaves a running horse to finish its job) and a forked scheduler process",
    shutdown=SHUTDOWN,
    source=SOURCE,
    schedule=schedule,
)
