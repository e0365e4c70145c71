"""arq's own worker (``arq module.WorkerSettings``), for the deploy experiment.

``serve`` runs what the ``arq`` command runs (``arq.cli.cli``: ``run_worker(settings)``,
that is ``Worker(**settings).run()``) with a ``WorkerSettings`` as a user writes it: the
lab's functions, the run's Redis server, the store's queue, and the process's work in
arq's job context (``ctx``, arq's own way of giving a job its context); everything else at
arq's defaults (``job_timeout`` 300 s, ``max_tries`` 5, ``job_completion_wait`` 0,
``handle_signals`` true). ``Worker.__init__`` installs arq's SIGINT and SIGTERM handlers on
its event loop (``handle_sig``), in this process's main thread. Each job is the coroutine
``lab_job``, which runs the blocking work in a thread, as arq's documentation tells
synchronous jobs to. ``schedule`` is ``enqueue_job(..., _defer_until=...)``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.arq import job_id, queue_name
from crashqueuelab.systems.contract import OwnWorker
from crashqueuelab.systems.libraries.arq.client import (
    WORK,
    function_for,
    functions,
    redis_socket,
)
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users, scheduled_job

#: arq's documentation of what its worker does when it shuts down.
SOURCE = "https://arq-docs.helpmanual.io/#retrying-jobs-and-cancellation"
_CANCELLED = (
    "As described above, when an arq worker shuts down, any ongoing jobs are cancelled"
    " immediately (via vanilla ``task.cancel()``, so a ``CancelledError`` will be raised)."
    " [...] If the worker shuts down, the job will be cancelled immediately and will remain"
    " in the queue to be run again when the worker starts up again (or run by another worker"
    " which is still running). (https://arq-docs.helpmanual.io/#usage)"
)
SHUTDOWN = {
    "SIGTERM": _CANCELLED,
    "SIGINT": _CANCELLED,
    "second SIGTERM": "arq's handler (handle_sig) runs again: the jobs are cancelled already"
    " (not documented; read in arq.worker)",
    "SIGKILL": "jobs aren't removed from the queue until they've either succeeded or failed"
    " [...] Jobs may be called more than once! (https://arq-docs.helpmanual.io/#usage): a"
    " killed worker's job keeps its in-progress key until it expires, job_timeout + 10 s"
    " after it was taken (read in arq.worker: in_progress_timeout_s), then runs again",
}


def _settings(directory: Path, work: Callable[[str], None]) -> type:
    name = queue_name(directory)
    if name is None:
        raise SystemUnavailable("arq", f"no arq store in {directory}: open it (System.open) first")
    from arq.connections import RedisSettings

    _functions = functions()

    class WorkerSettings:
        functions = _functions
        redis_settings = RedisSettings(unix_socket_path=redis_socket())
        queue_name = name
        ctx: ClassVar[dict[str, Any]] = {WORK: work}

    return WorkerSettings


def serve(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    """``arq <settings>`` on the store's queue, with ``work`` as each job's work; returns
    when arq's worker exits."""
    from arq.worker import run_worker

    settings = _settings(directory, work)
    as_started_by_its_users()
    # Worker.__init__ takes the thread's event loop (or makes one): a fresh one, as the
    # ``arq`` command's process has.
    asyncio.set_event_loop(asyncio.new_event_loop())
    try:
        run_worker(settings)
    finally:
        asyncio.get_event_loop().close()


async def _schedule(directory: Path, key: str, due_s: float) -> None:
    from arq.connections import RedisSettings, create_pool

    name = queue_name(directory)
    if name is None:
        raise SystemUnavailable("arq", f"no arq store in {directory}: open it (System.open) first")
    pool = await create_pool(
        RedisSettings(unix_socket_path=redis_socket()), default_queue_name=name
    )
    job = scheduled_job(key)
    try:
        await pool.enqueue_job(
            function_for(job),
            job.key,
            job.job_type,
            dict(job.payload),
            _job_id=job_id(name, key),
            _queue_name=name,
            _defer_until=datetime.datetime.fromtimestamp(due_s, tz=datetime.UTC),
        )
    finally:
        await pool.aclose(close_connection_pool=True)


def schedule(directory: Path, key: str, due_s: float) -> None:
    """``enqueue_job(..., _defer_until=...)`` of the lab's job ``key``, due at ``due_s``
    (seconds since the epoch; arq keeps milliseconds)."""
    asyncio.run(_schedule(directory, key, due_s))


OWN_WORKER = OwnWorker(
    serve=serve,
    describe="arq's Worker.run as `arq WorkerSettings` runs it (run_worker): one asyncio event"
    " loop, each job a task (the blocking work in a thread), arq's SIGINT/SIGTERM handler"
    " cancelling the jobs in hand",
    shutdown=SHUTDOWN,
    source=SOURCE,
    schedule=schedule,
)
