"""An independent reader of dramatiq's state: its Redis broker's keys, read with the lab's
own RESP client; or, on its RabbitMQ broker, the queues' ready messages read over AMQP
(``readers.amqp``: each taken and put back) with the results still in Redis.

Redis: the layout is the one dramatiq's Redis broker documents in its script
(``dramatiq/brokers/redis/dispatch.lua``), read from there and from what the broker
writes, never from dramatiq's code. Under the namespace ``dramatiq``, a queue ``Q`` is the
list ``dramatiq:Q`` of message ids, whose messages are the hash ``dramatiq:Q.msgs`` (id ->
the message as JSON: ``args``, ``options``, ``message_id``...); a message a worker fetched
and has not acknowledged is in that worker's set ``dramatiq:__acks__.<broker id>.Q`` (and
still in ``Q.msgs``); a delayed message (a retry waiting its backoff) is in ``Q.DQ`` and
``Q.DQ.msgs``; a dead-lettered one in the sorted set ``Q.XQ`` and ``Q.XQ.msgs``. An
acknowledged message is deleted: what is left of a finished job is the result dramatiq's
``Results`` middleware stored, a JSON list under the md5 of
``dramatiq-results:Q:<actor>:<message id>``.

The adapter writes each job's message id into the store's directory (``SUBMITTED_FILE``)
as it submits, since a finished job leaves Redis nothing to find it by; the job's
arguments are the lab's key, job type and payload, and its result is the attempt that
succeeded.

RabbitMQ (``read_dramatiq_rabbitmq_store``): dramatiq's RabbitMQ broker keeps a queue ``Q``,
its delay queue ``Q.DQ`` and its dead-letter queue ``Q.XQ`` as RabbitMQ queues of those
names, each message its JSON encoding (``args``, ``options``, ``message_id``). A message a
worker holds unacknowledged is not ready and cannot be read: a reading taken while a
consumer was attached says so.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readers.amqp import Unreadable, read_or_raise
from crashqueuelab.judges.resp import RespConnection, RespError, text

#: The queue of a store is named in this file of its directory.
QUEUE_FILE = "dramatiq-queue.json"
#: Each submitted job's key and dramatiq message id, one JSON line each.
SUBMITTED_FILE = "dramatiq-submitted.jsonl"
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
NAMESPACE = "dramatiq"
RESULTS_NAMESPACE = "dramatiq-results"
ACTOR = "lab_job"
#: Where a message stands, in the reader's words.
QUEUED, DELAYED, FETCHED, ACKED, DEAD = "queued", "delayed", "fetched", "acked", "dead"


@dataclass(frozen=True)
class DramatiqReading:
    exists: bool
    #: key -> (the reader's state, attempts made)
    jobs: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def queue_name(directory: Path) -> str | None:
    try:
        return str(json.loads((directory / QUEUE_FILE).read_text())["queue"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def submitted(directory: Path, file: str = SUBMITTED_FILE) -> dict[str, str]:
    """key -> dramatiq message id, for every job the adapter submitted to the store (a
    line cut short by a crash is left out: its job was not submitted); ``file``: another
    record of the same lines."""
    found: dict[str, str] = {}
    try:
        lines = (directory / file).read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            entry = json.loads(line)
            found.setdefault(str(entry["key"]), str(entry["message_id"]))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def result_key(queue: str, message_id: str) -> str:
    """Where dramatiq's Redis results backend keeps the result of ``message_id``."""
    named = f"{RESULTS_NAMESPACE}:{queue}:{ACTOR}:{message_id}"
    return hashlib.md5(named.encode()).hexdigest()


def read_dramatiq_store(directory: Path, socket: str | None = None) -> DramatiqReading:
    """Every job of the store, as the Redis server holds it now."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return DramatiqReading(exists=False)
    if not path:
        return DramatiqReading(True, problems=(f"no Redis server named ({SOCKET_VARIABLE} unset)",))
    try:
        with RespConnection(path) as connection:
            return _read(connection, name, submitted(directory))
    except (OSError, RespError) as error:
        return DramatiqReading(True, problems=(f"Redis did not answer: {error}",))


def _messages(connection: RespConnection, key: str) -> dict[str, dict[str, Any]]:
    reply = connection.command("HGETALL", key)
    pairs = reply if isinstance(reply, list) else []
    return {text(pairs[i]): json.loads(text(pairs[i + 1])) for i in range(0, len(pairs), 2)}


def _members(connection: RespConnection, *command: str | int) -> list[str]:
    reply = connection.command(*command)
    return [text(each) for each in reply] if isinstance(reply, list) else []


def _fetched(connection: RespConnection, name: str) -> set[str]:
    """The ids in every worker's acks set for the queue."""
    cursor, found = "0", set()
    for _ in range(100_000):  # bounded: SCAN ends when the cursor comes back to 0
        reply = connection.command(
            "SCAN", cursor, "MATCH", f"{NAMESPACE}:__acks__.*.{name}", "COUNT", 1000
        )
        assert isinstance(reply, list)
        cursor = text(reply[0])
        for key in reply[1] if isinstance(reply[1], list) else []:
            found |= set(_members(connection, "SMEMBERS", text(key)))
        if cursor == "0":
            break
    return found


def _read(
    connection: RespConnection, name: str, jobs_submitted: Mapping[str, str]
) -> DramatiqReading:
    base = f"{NAMESPACE}:{name}"
    live = _messages(connection, f"{base}.msgs")
    delayed = _messages(connection, f"{base}.DQ.msgs")
    dead = _messages(connection, f"{base}.XQ.msgs")
    listed = _members(connection, "LRANGE", base, 0, -1)
    listed_delayed = set(_members(connection, "LRANGE", f"{base}.DQ", 0, -1))
    fetched_queued = _fetched(connection, name)
    fetched_delayed = _fetched(connection, f"{name}.DQ")
    fetched = fetched_queued | fetched_delayed
    jobs: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    seen: dict[str, str] = {}
    for redis_id in listed:
        if listed.count(redis_id) > 1 and redis_id not in seen:
            problems.append(f"message {redis_id}: in the queue {listed.count(redis_id)} times")
        seen[redis_id] = QUEUED
    # An id whose message is gone: a consumer that fetches it is handed nothing (the
    # "None" message of dramatiq #266 and #442), and the id stays in its acks set.
    for ids, messages, where in (
        (seen, live, "in the queue"),
        (fetched_queued, live, "in a worker's acks set"),
        (listed_delayed, delayed, "in the delay queue"),
        (fetched_delayed, delayed, "in a worker's acks set of the delay queue"),
    ):
        problems += [
            f"message {redis_id}: {where}, its message gone"
            for redis_id in sorted(ids)
            if redis_id not in messages
        ]
    # One lab job is one dramatiq message id; each retry is a copy under a new Redis id.
    for messages, kind in ((dead, DEAD), (delayed, DELAYED), (live, QUEUED)):
        for redis_id, message in messages.items():
            key = str(message["args"][0])
            retries = int(message.get("options", {}).get("retries", 0))
            if kind == QUEUED and redis_id in fetched:
                state, attempts = FETCHED, retries + 1
            elif kind == QUEUED and redis_id not in listed:
                problems.append(f"job {key}: a message in no queue and fetched by no worker")
                continue
            elif kind == DELAYED and redis_id not in listed_delayed and redis_id not in fetched:
                problems.append(f"job {key}: a delayed message in no delay queue")
                continue
            else:
                state, attempts = kind, retries + (1 if kind == DEAD else 0)
            if key in jobs and kind != DEAD:
                problems.append(f"job {key}: more than one live message")
            jobs.setdefault(key, (state, attempts))
    _with_results(connection, name, jobs_submitted, jobs, problems)
    return DramatiqReading(True, jobs, tuple(problems))


def _with_results(
    connection: RespConnection,
    name: str,
    jobs_submitted: Mapping[str, str],
    jobs: dict[str, tuple[str, int]],
    problems: list[str],
) -> None:
    """Each submitted job whose result the ``Results`` middleware stored: acknowledged (its
    attempt) or dead, into ``jobs``."""
    for key, message_id in jobs_submitted.items():
        reply = connection.command("LRANGE", result_key(name, message_id), 0, -1)
        results = [json.loads(text(each)) for each in reply] if isinstance(reply, list) else []
        if not results:
            continue
        outcome = results[0]
        if isinstance(outcome, int):
            if key in jobs and jobs[key][0] != DEAD:
                problems.append(f"job {key}: a result, yet a message still live")
            jobs[key] = (ACKED, outcome)
        elif key not in jobs:
            jobs[key] = (DEAD, 0)


def read_dramatiq_rabbitmq_store(
    directory: Path, url: str | None, socket: str | None = None, settle_s: float = 0.0
) -> DramatiqReading:
    """Every job of the store on dramatiq's RabbitMQ broker at ``url``: its queues' ready
    messages, and the results in Redis; ``settle_s``: how long to wait for stopped workers'
    consumers to be gone (``readers.amqp``). A store that cannot be read raises
    ``Unreadable``: a failed reading is never an empty one."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return DramatiqReading(exists=False)
    if not path:
        raise Unreadable(f"no Redis server named ({SOCKET_VARIABLE} unset)")
    jobs: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    held = 0
    for queue, kind in ((f"{name}.XQ", DEAD), (f"{name}.DQ", DELAYED), (name, QUEUED)):
        reading = read_or_raise(url, queue, settle_s)
        held += reading.consumers
        for _, body in reading.messages:
            message = json.loads(body)
            key = str(message["args"][0])
            retries = int(message.get("options", {}).get("retries", 0))
            if key in jobs and kind != DEAD:
                problems.append(f"job {key}: more than one live message")
            jobs.setdefault(key, (kind, retries + (1 if kind == DEAD else 0)))
    try:
        with RespConnection(path) as connection:
            _with_results(connection, name, submitted(directory), jobs, problems)
    except (OSError, RespError) as error:
        raise Unreadable(f"Redis did not answer: {error}") from None
    if held:
        problems.append(
            f"read while {held} consumer(s) held its queues: the messages they held"
            " unacknowledged are not read"
        )
    return DramatiqReading(True, jobs, tuple(problems))
