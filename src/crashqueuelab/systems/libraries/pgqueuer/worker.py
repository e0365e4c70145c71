"""pgqueuer's own workers: its worker loop (``QueueManager.run``) for the heartbeat
experiment, and its worker process as ``pgq run`` starts it (``pgqueuer.run``, or the
supervisor's ``runit`` in releases before it), its own SIGTERM and SIGINT handlers
installed, for the deploy experiment, and a job scheduled with its ``execute_after``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems.contract import LibraryWorker, OpenRequest, OwnWorker
from crashqueuelab.systems.libraries.pgqueuer.client import (
    CONCURRENCY_LIMIT,
    ENTRYPOINT,
    PgQueuerClient,
)
from crashqueuelab.systems.libraries.skeleton import scheduled_job
from crashqueuelab.systems.postgres import server_dsn, store_schema

#: The heartbeat experiment's retry timer (heartbeat timeout in 1.x), and how often an idle
#: worker looks for work without a notification.
LOOP_RETRY_TIMER = timedelta(seconds=1)
LOOP_DEQUEUE_TIMEOUT = timedelta(milliseconds=50)


def run_queue_manager(
    directory: Path,
    worker_id: str,
    work: Callable[[str], None],
    stop: threading.Event,
    retry_after_s: float,
) -> None:
    """pgqueuer's own worker loop on the store in ``directory``: ``QueueManager.run`` as its
    users start it (default batch size, no concurrency limit), with its own heartbeat task
    and buffers, until ``stop`` is set. The retry timer goes where the release takes it (the
    entrypoint's ``retry_timer`` before 1.0, ``run``'s ``heartbeat_timeout`` from 1.0)."""
    import psycopg
    from pgqueuer.applications import PgQueuer
    from pgqueuer.db import PsycopgDriver

    dsn = server_dsn()
    schema = store_schema(directory, dsn)
    timer = timedelta(seconds=retry_after_s)

    async def main() -> None:
        connection = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, options=f"-c search_path={schema}"
        )
        async with connection:
            manager = PgQueuer(PsycopgDriver(connection)).qm
            run_settings: dict[str, Any] = {"dequeue_timeout": LOOP_DEQUEUE_TIMEOUT}
            entrypoint_settings: dict[str, Any] = {}
            if "heartbeat_timeout" in inspect.signature(manager.run).parameters:
                run_settings["heartbeat_timeout"] = timer
            else:
                entrypoint_settings["retry_timer"] = timer

            @manager.entrypoint(ENTRYPOINT, **entrypoint_settings)
            async def handle(job: Any) -> None:
                await asyncio.to_thread(work, json.loads(bytes(job.payload))["key"])

            async def watch() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                manager.shutdown.set()

            watcher = asyncio.ensure_future(watch())
            try:
                await manager.run(**run_settings)
            finally:
                watcher.cancel()

    asyncio.run(main())


LIBRARY_WORKER = LibraryWorker(
    retry_after_s=LOOP_RETRY_TIMER.total_seconds(),
    run=run_queue_manager,
    describe="pgqueuer's QueueManager.run (its dequeue, heartbeat task and buffers) on its"
    " psycopg driver, default batch size, no concurrency limit",
)


#: The deploy experiment's ``pgq run``: how long an idle worker waits for a notification
#: before it polls, and the heartbeat timeout where the release's ``run`` takes one (1.1
#: on; before, ``pgq run`` has none and the release's default, 30 s, holds). 4 s, not
#: less: 1.x's psycopg driver lets a heartbeat lag up to a second behind its notification
#: wait, and at 2 s a live or just-finished job was handed out again in deploy runs
#: (docs/real-queues.md), which is that lag and not what a deploy does.
DEPLOY_DEQUEUE_TIMEOUT = timedelta(seconds=1)
DEPLOY_HEARTBEAT_TIMEOUT = timedelta(seconds=4)
_SUPERVISORS = ("pgqueuer.adapters.cli.supervisor", "pgqueuer.supervisor")
_DOCS = "https://janbjorge.github.io/pgqueuer/"


def _runit() -> Callable[..., Any]:
    """The supervisor's ``runit``: what ``pgq run`` calls, in the releases before
    ``pgqueuer.run``."""
    for name in _SUPERVISORS:
        with contextlib.suppress(ImportError):
            runit: Callable[..., Any] = importlib.import_module(name).runit
            return runit
    raise ImportError("pgqueuer has neither pgqueuer.run nor a supervisor's runit")


def serve_pgq_run(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    """pgqueuer's worker process as ``pgq run module:factory`` starts it, in this process's
    main thread: the factory yields a ``PgQueuer`` whose entrypoint (``concurrency_limit``
    the adapter's, 1, as in the stuck-job reports) calls ``work(key)`` in a thread, and
    pgqueuer's own supervisor installs its SIGTERM and SIGINT handlers, runs it, and
    returns when it stops."""
    import pgqueuer
    import psycopg
    from pgqueuer.applications import PgQueuer
    from pgqueuer.db import PsycopgDriver

    dsn = server_dsn()
    schema = store_schema(directory, dsn)

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[Any]:
        connection = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, options=f"-c search_path={schema}"
        )
        async with connection:
            queuer = PgQueuer(PsycopgDriver(connection))

            @queuer.entrypoint(ENTRYPOINT, concurrency_limit=CONCURRENCY_LIMIT)
            async def handle(job: Any) -> None:
                await asyncio.to_thread(work, json.loads(bytes(job.payload))["key"])

            yield queuer

    run = getattr(pgqueuer, "run", None)
    if run is not None:
        settings: dict[str, Any] = {"dequeue_timeout": DEPLOY_DEQUEUE_TIMEOUT}
        if "heartbeat_timeout" in inspect.signature(run).parameters:
            settings["heartbeat_timeout"] = DEPLOY_HEARTBEAT_TIMEOUT
        asyncio.run(run(factory, **settings))
        return
    runit = _runit()
    # What ``pgq run``'s command line passes at its defaults, the dequeue timeout aside.
    defaults: dict[str, Any] = {
        "dequeue_timeout": DEPLOY_DEQUEUE_TIMEOUT,
        "batch_size": 10,
        "restart_delay": timedelta(0),
        "restart_on_failure": False,
        "shutdown": asyncio.Event(),
        "mode": importlib.import_module("pgqueuer.types").QueueExecutionMode.continuous,
        "max_concurrent_tasks": None,
        "shutdown_on_listener_failure": False,
        "heartbeat_timeout": DEPLOY_HEARTBEAT_TIMEOUT,
    }
    accepted = inspect.signature(runit).parameters
    asyncio.run(runit(factory, **{k: v for k, v in defaults.items() if k in accepted}))


def schedule(directory: Path, key: str, due_s: float) -> None:
    """The lab's job ``key`` enqueued with pgqueuer's ``execute_after``, the time from now
    until ``due_s`` (seconds since the epoch): pgqueuer takes a delay, which its server adds
    to its own clock when the row is inserted."""
    client = PgQueuerClient(OpenRequest(directory, SystemClock(), RandomIds(), RetryPolicy()))
    try:
        client.schedule(scheduled_job(key), timedelta(seconds=max(0.0, due_s - time.time())))
    finally:
        client.close()


OWN_WORKER = OwnWorker(
    serve=serve_pgq_run,
    describe="pgq run's code path (pgqueuer.run, or the supervisor's runit before it) with"
    " its own SIGTERM/SIGINT handlers; a PgQueuer whose entrypoint has concurrency_limit=1"
    f" (the adapter's); dequeue timeout {DEPLOY_DEQUEUE_TIMEOUT.total_seconds():g} s;"
    f" heartbeat timeout {DEPLOY_HEARTBEAT_TIMEOUT.total_seconds():g} s where the release's"
    " run takes one, else its default (30 s)",
    shutdown={
        "SIGTERM": "`pgq run` handles `SIGTERM` and `SIGINT`. ... 2. Wait for in-flight jobs"
        " to finish. PgQueuer has no built-in drain timeout; it awaits running jobs to"
        " completion, so bound the wait via your orchestrator",
        "SIGINT": "`pgq run` handles `SIGTERM` and `SIGINT` (as SIGTERM)",
        "SIGKILL": "If a worker process crashes mid-job, the job remains in `picked` state"
        " with a stale heartbeat. The global `heartbeat_timeout` ... controls when stale jobs"
        " become eligible for re-pickup by another worker; A recovered job will run again"
        " from the start",
    },
    source=_DOCS + "guides/deployment/",
    schedule=schedule,
)
