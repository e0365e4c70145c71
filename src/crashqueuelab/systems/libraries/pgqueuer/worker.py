"""pgqueuer's own worker loop (``QueueManager.run``), for the heartbeat experiment."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from crashqueuelab.systems.contract import LibraryWorker
from crashqueuelab.systems.libraries.pgqueuer.client import ENTRYPOINT
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
