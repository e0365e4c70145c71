"""huey's own consumer (``huey_consumer``), for the deploy experiment.

``serve`` runs what ``huey_consumer`` runs (``huey.bin.huey_consumer.consumer_main``):
``create_consumer(**ConsumerConfig().values).run()`` on the ``SqliteHuey`` of the store the
adapter opens, at the command line's defaults (one worker thread, SIGINT graceful, SIGTERM
immediate, SIGHUP a graceful restart), in this process's main thread, where ``run``
installs huey's own signal handlers. The lab's task (``crashqueuelab_job``) is registered on
that huey with the served process's work as its body, as a user's module registers its
tasks on the huey it hands the consumer: huey finds a task by its name on the instance it
runs. ``schedule`` is the task's ``schedule(eta=...)``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readers.huey import DATABASE_FILE
from crashqueuelab.systems.contract import OwnWorker
from crashqueuelab.systems.libraries.huey.client import TASK_NAME, served_task
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users, scheduled_job

#: huey's documentation of stopping its consumer.
SOURCE = "https://huey.readthedocs.io/en/latest/consumer.html#consumer-shutdown"
SHUTDOWN = {
    "SIGINT": "The huey consumer supports graceful shutdown via ``SIGINT``. When the consumer"
    " process receives ``SIGINT``, workers are allowed to finish up whatever task they are"
    " currently executing before the process exits.",
    "SIGTERM": "Alternatively, you can shutdown the consumer using ``SIGTERM`` and any running"
    " tasks will be interrupted, ensuring the process exits quickly. Huey does not guarantee"
    " at-least-once delivery of messages, and does not do acknowledgement of completed tasks."
    " This means that if you terminate the consumer **without** letting it finish any"
    " currently-executing tasks, those tasks will be lost.",
    "SIGHUP": "To cleanly restart the consumer, including all workers, send the ``SIGHUP``"
    " signal. When the consumer receives the hang-up signal, any tasks being executed will be"
    " allowed to finish before the restart occurs.",
    "SIGKILL": "If the consumer is killed abruptly or the machine powers off unexpectedly, any"
    ' tasks that are currently being run by a worker will be "lost".',
}


def _never(key: str) -> None:
    raise AssertionError(f"scheduling {key} runs no task")


def _huey(directory: Path, fsync: bool | None) -> Any:
    from huey import SqliteHuey

    settings: dict[str, Any] = {} if fsync is None else {"fsync": fsync}
    return SqliteHuey("crashqueuelab", filename=str(directory / DATABASE_FILE), **settings)


def serve(
    directory: Path, worker_id: str, work: Callable[[str], None], *, fsync: bool | None
) -> None:
    """``huey_consumer`` at its defaults on the store's huey, with ``work`` as each task's
    work (the task's id is the job's key); returns when the consumer exits."""
    from huey.consumer_options import ConsumerConfig

    directory.mkdir(parents=True, exist_ok=True)
    huey = _huey(directory, fsync)
    huey.task(name=TASK_NAME, context=True)(served_task(work))
    config = ConsumerConfig()
    config.validate()
    consumer = huey.create_consumer(**config.values)
    as_started_by_its_users()
    try:
        consumer.run()
    finally:
        huey.storage.close()


def schedule(directory: Path, key: str, due_s: float, *, fsync: bool | None) -> None:
    """The lab's task ``key`` through huey's ``schedule(eta=...)``, due at ``due_s`` (seconds
    since the epoch); the consumer's scheduler enqueues it once due."""
    directory.mkdir(parents=True, exist_ok=True)
    huey = _huey(directory, fsync)
    job = scheduled_job(key)
    try:
        task = huey.task(name=TASK_NAME, context=True)(served_task(_never))
        task.schedule(
            args=(job.job_type, job.payload, job.max_attempts),
            eta=datetime.datetime.fromtimestamp(due_s, tz=datetime.UTC),
            retries=job.max_attempts - 1,
            id=job.key,
        )
    finally:
        huey.storage.close()


def own_worker(fsync: bool | None) -> OwnWorker:
    """huey's consumer on the SqliteHuey of a system with that ``fsync`` setting."""
    return OwnWorker(
        serve=partial(serve, fsync=fsync),
        describe="huey's consumer as `huey_consumer` runs it, at its defaults: one worker"
        " thread (a daemon: an immediate stop leaves it to die with the process) and the"
        " scheduler thread; SIGINT graceful, SIGTERM immediate, SIGHUP a graceful restart"
        " (os.execl of this process's argv)",
        shutdown=SHUTDOWN,
        source=SOURCE,
        schedule=partial(schedule, fsync=fsync),
    )
