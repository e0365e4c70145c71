"""procrastinate's own worker (``procrastinate worker``), for the deploy experiment.

``serve`` runs what ``procrastinate worker`` runs (``procrastinate.cli.worker_``, inside
``asyncio.run`` with the app open): ``App.run_worker_async`` at its defaults, through
``App.run_worker``, on the schema and server the adapter opens, in this process's main
thread, the only one where procrastinate installs its SIGINT and SIGTERM handlers. The
lab's task (``client._lab_task``) finds the served process's work in its job context
(``run_worker(additional_context=...)``). ``schedule`` is ``configure(schedule_at=...)``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.systems.contract import OwnWorker
from crashqueuelab.systems.libraries.procrastinate.client import WORK, install, register
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users, scheduled_job
from crashqueuelab.systems.postgres import server_dsn, store_schema

#: procrastinate's documentation of stopping a worker, and of what a killed one leaves.
SOURCE = "https://procrastinate.readthedocs.io/en/stable/howto/advanced/shutdown.html"
_GRACEFUL = (
    "When a worker is requested to stop, it will attempt to gracefully shut down by waiting"
    " for all running jobs to complete. If a `shutdown_graceful_timeout` option is specified,"
    " the worker will attempt to abort all jobs that have not completed by that time."
)
_IMMEDIATE = (
    "if the worker gets a second `SIGINT` or `SIGTERM` signal, or if it's killed with"
    " `SIGKILL`, it will terminate immediately, possibly leaving jobs with the `doing` status"
    " in the queue. And, if no specific action is taken, these *stalled* jobs will remain in"
    " the queue forever, and their execution will never resume."
    " (https://procrastinate.readthedocs.io/en/stable/howto/production/retry_stalled_jobs.html)"
)
SHUTDOWN = {
    "SIGTERM": _GRACEFUL,
    "SIGINT": _GRACEFUL,
    "second SIGTERM": _IMMEDIATE,
    "second SIGINT": _IMMEDIATE,
    "SIGKILL": _IMMEDIATE,
}


def _app(directory: Path) -> tuple[Any, Any, str]:
    """procrastinate's app on the store's schema, the lab's task registered, and the
    schema."""
    import procrastinate

    dsn = server_dsn()
    schema = store_schema(directory, dsn)
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=dsn, kwargs={"options": f"-c search_path={schema}"}
        )
    )
    return app, register(app), schema


def serve(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    """``procrastinate worker`` at its defaults (one job at a time, waiting for jobs until a
    signal stops it) on the store's schema, with ``work`` as each job's work; returns when
    the worker exits."""
    app, _, schema = _app(directory)
    install(app, schema)
    as_started_by_its_users()
    app.run_worker(name=worker_id, additional_context={WORK: work})


def schedule(directory: Path, key: str, due_s: float) -> None:
    """The lab's task ``key`` deferred with ``configure(schedule_at=...)``, due at ``due_s``
    (seconds since the epoch)."""
    app, task, schema = _app(directory)
    install(app, schema)
    job = scheduled_job(key)

    async def defer() -> None:
        async with app.open_async():
            await task.configure(
                schedule_at=datetime.datetime.fromtimestamp(due_s, tz=datetime.UTC)
            ).defer_async(
                key=job.key,
                job_type=job.job_type,
                payload=job.payload,
                max_attempts=job.max_attempts,
            )

    asyncio.run(defer())


OWN_WORKER = OwnWorker(
    serve=serve,
    describe="procrastinate's worker as `procrastinate worker` runs it (App.run_worker_async,"
    " concurrency 1, no shutdown_graceful_timeout): a sync job in a thread of its event"
    " loop; its signal handlers, installed in the main thread, uninstall themselves at the"
    " first signal, and its heartbeat stops while it drains",
    shutdown=SHUTDOWN,
    source=SOURCE,
    schedule=schedule,
)
