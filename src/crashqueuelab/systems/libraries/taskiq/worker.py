"""taskiq's own worker (``taskiq worker module:broker``), for the deploy experiment.

``serve`` runs what each worker process of ``taskiq worker`` runs: ``start_listen`` of
``taskiq.cli.worker.run`` with the arguments the command line parses
(``WorkerArgs.from_cli``: every option at taskiq's defaults, so ``--ack-type when_saved``),
in this process's main thread. ``start_listen`` installs taskiq's SIGINT, SIGTERM and SIGHUP
handler (the first signal starts the shutdown: no new message is taken and the tasks in hand
are awaited; past ``--hardkill-count`` signals it raises ``KeyboardInterrupt``), imports the
broker named ``module:factory`` (``served_broker`` here, a broker factory as taskiq's
command line takes one: taskiq-redis's stream broker on the store's stream,
``client.stream_broker``) and runs taskiq's ``Receiver.listen``. The process
manager ``taskiq worker`` puts above its worker processes is left out: it only forwards a
SIGTERM to them as SIGINT, and one worker process is what the deploy experiment stops.

Each job is the synchronous task ``lab_job``, which taskiq runs in its thread pool and
which calls the process's work. There is no scheduling call: taskiq schedules through a
separate ``taskiq scheduler`` process and a schedule source, which the lab does not run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.readers.taskiq import queue_name
from crashqueuelab.systems.contract import OwnWorker
from crashqueuelab.systems.libraries.skeleton import as_started_by_its_users
from crashqueuelab.systems.libraries.taskiq.client import (
    IDLE_TIMEOUT_MS,
    TASK_NAME,
    redis_socket,
    stream_broker,
)

#: The store's stream and the work of this worker process, which each job runs.
_SERVED: list[tuple[str, Callable[[str], None]]] = []

SOURCE = "https://taskiq-python.github.io/guide/cli.html#worker"
_SHUTDOWN = (
    '"When to acknowledge message." (--ack-type, default when_saved: after the result is'
    " saved); taskiq's worker handler (start_listen's interrupt_handler, read in"
    " taskiq.cli.worker.run): the first signal sets the shutdown event, the receiver takes no"
    " new message and awaits the tasks in hand (--wait-tasks-timeout, none by default)"
)
SHUTDOWN = {
    "SIGTERM": _SHUTDOWN,
    "SIGINT": _SHUTDOWN,
    "second SIGTERM": 'counted towards --hardkill-count (3): "Number of termination signals'
    ' to the main process before performing a hardkill." (read in taskiq.cli.worker.args)',
    "SIGKILL": '"This broker **supports** acknowledgements and therefore is fine to use in'
    ' cases when data durability is required." (https://github.com/taskiq-python/'
    "taskiq-redis#stream): a killed worker's entry stays pending in the consumer group;"
    f" from 1.0.6 (pull request 82) a consumer's XAUTOCLAIM takes it once idle_timeout"
    f" ({IDLE_TIMEOUT_MS} ms here) passed, before it nothing takes it again",
}


def lab_job(key: str, job_type: str, payload: dict[str, Any]) -> int:
    """The task every lab job names, as taskiq's own worker runs it: the process's work."""
    if not _SERVED:
        raise SystemUnavailable("taskiq", f"job {key} runs only under crashqueuelab's worker")
    _SERVED[0][1](key)
    return 0


def served_broker() -> Any:
    """The broker factory taskiq's command line is named (``worker:served_broker``)."""
    queue, _ = _SERVED[0]
    broker = stream_broker(redis_socket(), queue)
    broker.register_task(lab_job, task_name=TASK_NAME)
    return broker


def serve(directory: Path, worker_id: str, work: Callable[[str], None]) -> None:
    """``taskiq worker`` 's worker process on the store's stream, with ``work`` as each
    job's work; returns when taskiq's worker exits."""
    from taskiq.cli.worker.args import WorkerArgs
    from taskiq.cli.worker.run import start_listen

    name = queue_name(directory)
    if name is None:
        raise SystemUnavailable(
            "taskiq", f"no taskiq store in {directory}: open it (System.open) first"
        )
    redis_socket()  # no server named: said here, before taskiq starts
    _SERVED[:] = [(name, work)]
    as_started_by_its_users()
    start_listen(WorkerArgs.from_cli([f"{__name__}:served_broker"]))


OWN_WORKER = OwnWorker(
    serve=serve,
    describe="taskiq's worker process as `taskiq worker module:broker` starts it"
    " (start_listen, one process): taskiq's Receiver on RedisStreamBroker, each job a sync"
    " task in its thread pool, acknowledged when its result is saved",
    shutdown=SHUTDOWN,
    source=SOURCE,
)
