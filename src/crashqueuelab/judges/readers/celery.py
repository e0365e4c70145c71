"""An independent reader of Celery's tasks in a Redis server, with the lab's own commands.

It speaks Redis's protocol itself (``judges.resp``) and knows the layout from kombu's and
Celery's documentation and from what they write, never from their code. The adapter gives
each store a queue of its own and kombu's ``global_keyprefix`` ``<queue>:``, so that every
broker key of one store carries its queue's name:

- ``<queue>:<queue>``, a list: the messages waiting (LPUSH by a producer, BRPOP by a
  worker, from the right);
- ``<queue>:unacked``, a hash from delivery tag to ``[message, exchange, routing key]``:
  every message a consumer received and has not acknowledged (kombu's Redis "QoS");
- ``<queue>:unacked_index``, a sorted set of the same tags scored by the time each was
  received: kombu's ``restore_visible`` puts back those older than ``visibility_timeout``.

A message is JSON: its ``headers`` name the task (``task``), its id (``id``) and how often it
was retried (``retries``). A task's result is the JSON string ``celery-task-meta-<id>``
(Celery's Redis result backend): its ``status`` (``STARTED`` with ``task_track_started``,
``RETRY``, ``SUCCESS``, ``FAILURE``) and, with ``result_extended``, its ``retries``.

The adapter names each task by the store's queue and the lab's key (``task_id``).

On Celery's RabbitMQ broker the messages are in a RabbitMQ queue of the store's name, and
the results still in Redis: ``read_celery_rabbitmq_store`` reads the queue's ready messages
over AMQP (``readers.amqp``: each taken without acknowledgement and put back) and their
headers as above; a message a live consumer holds unacknowledged cannot be read, and such a
reading says how many consumers were attached.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readers.amqp import Unreadable, read_or_raise
from crashqueuelab.judges.resp import RespConnection, RespError, text

#: The queue of a store is named in this file of its directory.
QUEUE_FILE = "celery-queue.json"
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
#: Celery's Redis result backend's key of a task's result.
RESULT_PREFIX = "celery-task-meta-"
#: The reader's words for where a task stands.
QUEUED, RESERVED, STARTED, RETRIED, SUCCEEDED, FAILED = (
    "queued",
    "reserved",
    "started",
    "retried",
    "succeeded",
    "failed",
)
_FINAL = {"SUCCESS": SUCCEEDED, "FAILURE": FAILED}


@dataclass(frozen=True)
class CeleryReading:
    exists: bool
    #: key -> (the reader's state, attempts made)
    jobs: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    #: Task ids with a copy left unacknowledged in kombu's ``unacked`` hash.
    unacked: tuple[str, ...] = ()


def queue_name(directory: Path) -> str | None:
    try:
        return str(json.loads((directory / QUEUE_FILE).read_text())["queue"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def key_prefix(queue: str) -> str:
    """kombu's ``global_keyprefix`` of the store's broker keys."""
    return f"{queue}:"


def task_id(queue: str, key: str) -> str:
    return f"{queue}-{key}"


def read_celery_store(directory: Path, socket: str | None = None) -> CeleryReading:
    """Every task of the store's queue, as the server holds it now."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return CeleryReading(exists=False)
    if not path:
        return CeleryReading(True, problems=(f"no Redis server named ({SOCKET_VARIABLE} unset)",))
    try:
        with RespConnection(path) as connection:
            return _read(connection, name, *_messages(connection, name))
    except (OSError, RespError) as error:
        return CeleryReading(True, problems=(f"Redis did not answer: {error}",))


def read_celery_rabbitmq_store(
    directory: Path, url: str | None, socket: str | None = None, settle_s: float = 0.0
) -> CeleryReading:
    """Every task of the store's queue on Celery's RabbitMQ broker at ``url`` (its ready
    messages), with the results in Redis; ``settle_s``: how long to wait for stopped workers'
    consumers to be gone (``readers.amqp``). A store that cannot be read raises
    ``Unreadable``: a failed reading is never an empty one."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return CeleryReading(exists=False)
    if not path:
        raise Unreadable(f"no Redis server named ({SOCKET_VARIABLE} unset)")
    queue = read_or_raise(url, name, settle_s)
    waiting = {
        str(headers.get("id")): int(headers.get("retries") or 0) for headers, _ in queue.messages
    }
    try:
        with RespConnection(path) as connection:
            reading = _read(connection, name, waiting, {})
    except (OSError, RespError) as error:
        raise Unreadable(f"Redis did not answer: {error}") from None
    if not queue.consumers:
        return reading
    held = (
        f"read while {queue.consumers} consumer(s) held the queue: the messages they held"
        " unacknowledged are not read"
    )
    return CeleryReading(True, reading.jobs, (*reading.problems, held), reading.unacked)


def _headers(message: Any) -> dict[str, Any]:
    headers = message.get("headers") if isinstance(message, dict) else None
    return headers if isinstance(headers, dict) else {}


def _messages(connection: RespConnection, name: str) -> tuple[dict[str, int], dict[str, int]]:
    """The retries of each waiting task's message, and of each unacknowledged one, by id."""
    prefix = key_prefix(name)
    listed = connection.command("LRANGE", f"{prefix}{name}", 0, -1)
    waiting: dict[str, int] = {}
    for raw in listed if isinstance(listed, list) else []:
        headers = _headers(json.loads(text(raw)))
        waiting[str(headers.get("id"))] = int(headers.get("retries") or 0)
    held = connection.command("HGETALL", f"{prefix}unacked")
    pairs = held if isinstance(held, list) else []
    unacked: dict[str, int] = {}
    for index in range(1, len(pairs), 2):
        entry = json.loads(text(pairs[index]))
        headers = _headers(entry[0] if isinstance(entry, list) and entry else None)
        unacked[str(headers.get("id"))] = int(headers.get("retries") or 0)
    return waiting, unacked


def _results(connection: RespConnection, name: str) -> dict[str, dict[str, Any]]:
    cursor, found = "0", {}
    for _ in range(100_000):  # bounded: SCAN ends when the cursor comes back to 0
        reply = connection.command(
            "SCAN", cursor, "MATCH", f"{RESULT_PREFIX}{name}-*", "COUNT", 1000
        )
        assert isinstance(reply, list)
        cursor = text(reply[0])
        for key in reply[1] if isinstance(reply[1], list) else []:
            value = connection.command("GET", text(key))
            if value is not None:
                found[text(key)[len(RESULT_PREFIX) :]] = json.loads(text(value))
        if cursor == "0":
            break
    return found


def _read(
    connection: RespConnection, name: str, waiting: dict[str, int], unacked: dict[str, int]
) -> CeleryReading:
    """The store's tasks from the messages ``waiting`` and ``unacked`` (each task id's
    retries) and the results in Redis."""
    results = _results(connection, name)
    start = len(task_id(name, ""))
    jobs: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    for identifier in sorted(set(waiting) | set(unacked) | set(results)):
        if not identifier.startswith(task_id(name, "")):
            problems.append(f"a message of task {identifier}, which the lab did not send")
            continue
        key = identifier[start:]
        meta = results.get(identifier, {})
        status = str(meta.get("status"))
        ran = int(meta.get("retries") or 0) + 1
        if status in _FINAL:
            # A result recorded while a copy waits unacknowledged: acks_late's window between
            # storing the result and acknowledging, or a message redelivered meanwhile.
            jobs[key] = (_FINAL[status], ran)
        elif identifier in waiting:
            jobs[key] = (QUEUED, waiting[identifier])
        elif identifier in unacked:
            retries = unacked[identifier]
            state = STARTED if status == "STARTED" and ran == retries + 1 else RESERVED
            jobs[key] = (state, retries + 1)
        elif status == "STARTED":
            # Acknowledged at its start (Celery's default), and not finished.
            jobs[key] = (STARTED, ran)
        else:
            # Retried, its new message in no queue: the retry's publish never reached Redis.
            jobs[key] = (RETRIED, ran)
    return CeleryReading(True, jobs, tuple(problems), tuple(sorted(unacked)))
