"""Celery's own worker (``celery worker``), for the deploy experiment.

``serve`` runs what the ``celery worker`` command runs (``Celery.worker_main``, the same
click command) with the store's app as a user writes it: the lab's task, the run's Redis
server as broker and result backend, the store's queue, and the system's acknowledgement
settings; everything else at Celery's defaults (the prefork pool, one child per core,
``worker_prefetch_multiplier`` 4, mingle, gossip and heartbeats on). Celery installs its
own SIGTERM, SIGINT and SIGQUIT handlers (``celery.apps.worker``) in this process's main
thread; the pool's children are forked after ``serve`` set the process's work, which each
task runs (``client.lab_task``). With the gevent pool ``serve`` first monkey-patches the
process as the ``celery`` command does for ``--pool gevent``, and each task runs in a
greenlet of the main process. Celery's ``task_received`` signal, sent in the main process
as the consumer takes a message (an ETA task's too, long before it is due), records each
receipt where the lab's work can (``JobWork.received``), and ``worker_ready``, sent as the
consumer starts consuming (seconds after the process started: mingle waits for its peers),
that the worker takes jobs (``JobWork.ready``). ``schedule`` is
``apply_async(eta=...)``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.celery import queue_name, task_id
from crashqueuelab.systems.contract import JobWork, OwnWorker
from crashqueuelab.systems.libraries.celery.client import (
    RABBITMQ,
    SERVED_WORK,
    TASK_NAME,
    Settings,
    make_app,
    quiet_celery,
    redis_socket,
)
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users, scheduled_job

#: Celery's documentation of what its worker does when it is stopped.
SOURCE = "https://docs.celeryq.dev/en/stable/userguide/workers.html#stopping-the-worker"
_WARM = (
    "Shutdown should be accomplished using the TERM signal. When shutdown is initiated the"
    " worker will finish all currently executing tasks before it actually terminates. If"
    " these tasks are important, you should wait for it to finish before doing anything"
    " drastic, like sending the KILL signal. (" + SOURCE + ")"
)
SHUTDOWN = {
    "SIGTERM": _WARM,
    "SIGINT": "INT: Warm shutdown, the same as TERM (read in celery.apps.worker:"
    " install_worker_int_handler); a second INT is a cold shutdown",
    "SIGQUIT": "QUIT: Cold shutdown, terminate ASAP"
    " (https://docs.celeryq.dev/en/stable/userguide/workers.html#process-signals)",
    "second SIGTERM": "not documented; read in celery.apps.worker: the warm shutdown under"
    " way goes on",
    "SIGKILL": "If the worker won't shutdown after considerate time, for being stuck in an"
    " infinite-loop or similar, you can use the KILL signal to force terminate the worker:"
    " but be aware that currently executing tasks will be lost (i.e., unless the tasks have"
    " the acks_late option set). (" + SOURCE + ")",
}


def _app(directory: Path, settings: Settings) -> tuple[str, object]:
    name = queue_name(directory)
    if name is None:
        raise SystemUnavailable(
            "celery", f"no Celery store in {directory}: open it (System.open) first"
        )
    return name, make_app(name, redis_socket(), settings)


def serve(
    settings: Settings, pool: str, directory: Path, worker_id: str, work: Callable[[str], None]
) -> None:
    """``celery worker --pool POOL -Q <queue>`` on the store's queue, with ``work`` as each
    task's work; returns when Celery's worker exits."""
    arguments = [
        "worker",
        f"--pool={pool}",
        "--loglevel=WARNING",
        f"--hostname={worker_id}@crashqueuelab",
    ]
    if pool in ("gevent", "eventlet"):
        # What the `celery` command does first (celery.__main__): a green pool's
        # monkey-patching, before kombu captures the blocking select and socket calls.
        from celery import maybe_patch_concurrency

        maybe_patch_concurrency(arguments)
    name, app = _app(directory, settings)
    quiet_celery()
    SERVED_WORK["work"] = work
    if isinstance(work, JobWork):
        _record_receipts(work)
    as_started_by_its_users()
    app.worker_main([*arguments, f"--queues={name}"])  # type: ignore[attr-defined]


def _record_receipts(work: JobWork) -> None:
    """Each message of the lab's task this worker's consumer receives, and the moment it
    starts consuming (``worker_ready``, sent right before its event loop), said to
    ``work``."""
    from celery.signals import task_received, worker_ready

    def received(sender: object = None, request: Any = None, **_: object) -> None:
        if request is not None and request.task_name == TASK_NAME and request.args:
            work.received(str(request.args[0]))

    def ready(sender: object = None, **_: object) -> None:
        work.ready()

    # Held strongly: the handlers are closures no one else keeps.
    task_received.connect(received, weak=False)
    worker_ready.connect(ready, weak=False)


def schedule(settings: Settings, directory: Path, key: str, due_s: float) -> None:
    """``apply_async(eta=...)`` of the lab's job ``key``, due at ``due_s`` (seconds since the
    epoch)."""
    name, app = _app(directory, settings)
    job = scheduled_job(key)
    try:
        app.tasks[TASK_NAME].apply_async(  # type: ignore[attr-defined]
            (job.key, job.job_type, dict(job.payload), job.max_attempts),
            task_id=task_id(name, key),
            queue=name,
            eta=datetime.datetime.fromtimestamp(due_s, tz=datetime.UTC),
        )
    finally:
        app.close()  # type: ignore[attr-defined]


def own_worker(settings: Settings, pool: str = "prefork") -> OwnWorker:
    """Celery's worker with ``settings`` and ``pool``."""
    return OwnWorker(
        serve=partial(serve, settings, pool),
        describe=f"Celery's worker as `celery worker --pool {pool}` runs it (worker_main):"
        f" {settings.words}; the main process consumes from"
        f" {'RabbitMQ' if settings.broker == RABBITMQ else 'Redis'}, each task runs in a"
        " pool child",
        shutdown=SHUTDOWN,
        source=SOURCE,
        schedule=partial(schedule, settings),
        tells_ready=True,
    )
