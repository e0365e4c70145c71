"""dramatiq's own worker: the ``dramatiq`` command (``dramatiq.cli.main``) for the deploy
experiment, and ``dramatiq.Worker`` for the heartbeat experiment.

``serve`` runs what ``dramatiq BROKER --processes 1 --threads 1 --queues Q`` runs, in this
process's main thread: the command's main process installs its signal handlers (SIGTERM
and SIGINT passed on to its worker process, which stops gracefully: its worker threads
finish the message in hand, the messages it prefetched are put back) and forks one worker
process, which builds the broker by calling ``setup`` (the command's ``module:callable``
broker) and runs a ``Worker`` of one thread. Each message of the actor ``lab_job`` does
this process's work for its key.

``loop`` runs a ``Worker`` (one thread, dramatiq's default prefetch of two messages per
thread) on a broker whose ``heartbeat_timeout`` is the run's retry timer and whose
maintenance runs at every command, until the run says stop; then ``Worker.stop``. What
dramatiq logs at WARNING and above is kept in ``WORKER.dramatiq.log`` in the store's
directory.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.dramatiq import ACTOR, queue_name
from crashqueuelab.systems.contract import LibraryWorker, OwnWorker
from crashqueuelab.systems.libraries.dramatiq.client import (
    MAINTENANCE_EVERY_COMMAND,
    close_broker,
    lab_message,
    make_broker,
    message_id,
    record_submitted,
)
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users, scheduled_job

#: How often the heartbeat loop's main thread wakes to run a signal's handler.
STOP_POLL_S = 0.05
#: Where the worker process the command forks finds the store's queue.
QUEUE_VARIABLE = "CRASHQUEUELAB_DRAMATIQ_QUEUE"
#: dramatiq's documentation of its worker's signals.
SOURCE = "https://dramatiq.io/guide.html#signals"
_GRACEFUL = (
    "Sending an INT or TERM signal to the main process triggers graceful shutdown.  Consumer"
    " threads will stop receiving new work and worker threads will finish processing the"
    " work they have in flight before shutting down.  Any tasks still in worker memory at"
    " this point are re-queued on the broker. (" + SOURCE + ")"
)
SHUTDOWN = {
    "SIGTERM": _GRACEFUL,
    "SIGINT": _GRACEFUL,
    "second SIGTERM": "If you send a second INT or TERM signal then the worker processes will"
    " be killed immediately. (" + SOURCE + ")",
    "SIGKILL": "Dramatiq actors may receive the same message multiple times in the event of a"
    " worker failure (hardware, network or power failure). (https://dramatiq.io/guide.html):"
    " a killed worker's fetched messages are put back by the maintenance once its heartbeat"
    " is older than heartbeat_timeout (60 s by default)",
}

#: The work of this process's jobs, for the worker process the command forks: dramatiq
#: runs an actor in a thread of its own, which no context variable reaches, and the forked
#: process is a copy of this one, so a holder in the module is the one way in.
served_work: list[Callable[[str], None]] = []


def _store_queue(directory: Path) -> str:
    name = queue_name(directory)
    if name is None:
        raise SystemUnavailable(
            "dramatiq", f"no dramatiq store in {directory}: open it (System.open) first"
        )
    return name


def actor_on(broker: Any, queue: str, work: Callable[[str], None]) -> None:
    """The actor ``lab_job`` on ``broker``, doing ``work`` for each message's key."""
    import dramatiq

    def lab_job(key: str, job_type: str, payload: dict[str, Any]) -> int:
        work(key)
        return 0

    # Redeclared on this broker: the client's declares the one the adapter never runs.
    broker.actors.pop(ACTOR, None)
    declare: Any = dramatiq.actor(actor_name=ACTOR, queue_name=queue, broker=broker)
    declare(lab_job)


def setup() -> None:
    """The command's broker (``module:callable``): the store's queue on the run's Redis,
    its actor doing this process's work."""
    import dramatiq

    queue = os.environ[QUEUE_VARIABLE]
    broker = make_broker(queue)
    actor_on(broker, queue, served_work[-1])
    dramatiq.set_broker(broker)


def serve(
    directory: Path, worker_id: str, work: Callable[[str], None], setup: str = f"{__name__}:setup"
) -> None:
    """``dramatiq crashqueuelab.systems.libraries.dramatiq.worker:setup --processes 1
    --threads 1 --queues Q`` (``setup``: the command's broker, another module's on
    RabbitMQ); returns when the command's main process would exit."""
    from dramatiq import cli

    # Untyped in every release.
    command: Any = cli

    os.environ[QUEUE_VARIABLE] = _store_queue(directory)
    served_work.append(work)
    arguments = command.make_argument_parser().parse_args(
        [
            setup,
            "--processes", "1",
            "--threads", "1",
            "--queues", os.environ[QUEUE_VARIABLE],
        ]
    )  # fmt: skip
    as_started_by_its_users()
    # The start method a ``dramatiq`` command has on Linux: the lab's worker process was
    # itself started by a forkserver, whose method its children inherit, and a worker
    # process started so would be a fresh interpreter, not this process's copy.
    multiprocessing.set_start_method("fork", force=True)
    command.main(arguments)


#: What of dramatiq's own log a heartbeat worker keeps, beside its store: its warnings
#: ("Found 'None' message in message cache", dramatiq #442) and errors (#266's
#: "Consumer encountered an unexpected error").
KEPT_LOG_LEVEL = logging.WARNING


def _keep_log(path: Path) -> None:
    """dramatiq's warnings and errors in ``path`` (the run's page shows them), instead of
    on the worker's stderr, where Python's last-resort handler put them."""
    handler = logging.FileHandler(path, delay=True)
    handler.setLevel(KEPT_LOG_LEVEL)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("dramatiq").addHandler(handler)


def loop(
    directory: Path,
    worker_id: str,
    work: Callable[[str], None],
    stop: threading.Event,
    retry_after_s: float,
) -> None:
    """A ``Worker`` of one thread whose broker's ``heartbeat_timeout`` is ``retry_after_s``,
    until ``stop`` is set."""
    from dramatiq import Worker

    queue = _store_queue(directory)
    _keep_log(directory / f"{worker_id}.dramatiq.log")
    broker = make_broker(
        queue,
        maintenance_chance=MAINTENANCE_EVERY_COMMAND,
        heartbeat_timeout_ms=round(retry_after_s * 1000),
    )
    actor_on(broker, queue, work)
    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        # A signal may be delivered to any of dramatiq's threads; Python runs its handler
        # (the one that sets ``stop``) only in the main thread, once that thread wakes, and
        # a wait with no timeout never would.
        while not stop.wait(STOP_POLL_S):
            pass
    finally:
        worker.stop()
        close_broker(broker)


def schedule(directory: Path, key: str, due_s: float) -> None:
    """``RedisBroker.enqueue(message, delay=...)`` of the lab's job ``key``, due at ``due_s``
    (seconds since the epoch): dramatiq's delay queue, which its worker moves to the queue
    once the message's eta has passed (``send_with_options(delay=...)`` is this call)."""
    queue = _store_queue(directory)
    job = scheduled_job(key)
    record_submitted(directory, key, message_id(queue, key))
    broker = make_broker(queue)
    try:
        delay_ms = max(0, round(due_s * 1000 - time.time() * 1000))
        broker.enqueue(lab_message(queue, job), delay=delay_ms)
    finally:
        close_broker(broker)


OWN_WORKER = OwnWorker(
    serve=serve,
    describe="dramatiq's command (dramatiq.cli.main) with one worker process of one thread:"
    " its main process passes SIGTERM/SIGINT on, its worker finishes the message in hand and"
    " puts back the ones it prefetched",
    shutdown=SHUTDOWN,
    source=SOURCE,
    schedule=schedule,
)

LIBRARY_WORKER = LibraryWorker(
    retry_after_s=2.0,
    run=loop,
    describe="dramatiq.Worker, 1 thread, prefetch 2 (dramatiq's default), heartbeat_timeout"
    " the retry timer, maintenance at every command",
)
