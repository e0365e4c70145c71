"""An independent reader of RQ's keys in a Redis server, with the lab's own commands.

It speaks Redis's protocol itself (``judges.resp``) and knows RQ's key layout from its
documentation and from what RQ writes, never from RQ's code: a job is the hash
``rq:job:<id>`` (``status``, ``origin``, ``description``, ``retries_left``), a queue is the
list ``rq:queue:<name>``, a job a worker popped but has not started is in the list
``rq:queue:<name>:intermediate`` (RQ 2.x and later), and the started, finished and failed
registries are sorted sets ``rq:wip:<name>`` (``rq:started:<name>`` before 2.0),
``rq:finished:<name>`` and ``rq:failed:<name>``.

The adapter gives each job a description of its own (``DESCRIPTION_PREFIX`` and JSON with
the lab's key and ``max_attempts``), so the reader needs no pickled field to name a job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.resp import RespConnection, RespError, text

#: The queue of a store is named in this file of its directory.
QUEUE_FILE = "rq-queue.json"
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
DESCRIPTION_PREFIX = "crashqueuelab "
#: The reader's words for where a job stands (RQ's own statuses, and ``dequeued``: popped
#: from the queue, not started).
QUEUED, DEQUEUED, STARTED, FINISHED, FAILED = "queued", "dequeued", "started", "finished", "failed"
#: RQ statuses the lab's workload never asks for; a job in one of them is a problem.
_KNOWN = {QUEUED, STARTED, FINISHED, FAILED, "scheduled", "deferred", "stopped", "canceled"}


@dataclass(frozen=True)
class RqReading:
    exists: bool
    #: key -> (the reader's state, attempts made)
    jobs: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)


def queue_name(directory: Path) -> str | None:
    try:
        return str(json.loads((directory / QUEUE_FILE).read_text())["queue"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _members(connection: RespConnection, key: str, kind: str) -> set[str]:
    if kind == "list":
        reply = connection.command("LRANGE", key, 0, -1)
    else:
        reply = connection.command("ZRANGE", key, 0, -1)
    # A started-registry entry is "<job id>:<execution id>" from RQ 2.0 on.
    return (
        {text(member).split(":")[0] for member in reply or []} if isinstance(reply, list) else set()
    )


def attempts_made(status: str, max_attempts: int, retries_left: int | None) -> int:
    """Attempts a job has had: the retries it used, and the one running or ended."""
    used = 0 if retries_left is None else max_attempts - 1 - retries_left
    return used + (1 if status in (STARTED, FINISHED, FAILED) else 0)


def read_rq_store(directory: Path, socket: str | None = None) -> RqReading:
    """Every job of the store's queue, as the server holds it now."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return RqReading(exists=False)
    if not path:
        return RqReading(True, problems=(f"no Redis server named ({SOCKET_VARIABLE} unset)",))
    try:
        with RespConnection(path) as connection:
            return _read(connection, name)
    except (OSError, RespError) as error:
        return RqReading(True, problems=(f"Redis did not answer: {error}",))


def _read(connection: RespConnection, name: str) -> RqReading:
    prefix = f"rq:queue:{name}"
    waiting = _members(connection, prefix, "list")
    popped = _members(connection, f"{prefix}:intermediate", "list")
    started = _members(connection, f"rq:wip:{name}", "zset") | _members(
        connection, f"rq:started:{name}", "zset"
    )
    finished = _members(connection, f"rq:finished:{name}", "zset")
    failed = _members(connection, f"rq:failed:{name}", "zset")
    jobs: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    cursor = "0"
    ids: list[str] = []
    for _ in range(100_000):  # bounded: SCAN ends when the cursor comes back to 0
        reply = connection.command("SCAN", cursor, "MATCH", "rq:job:*", "COUNT", 1000)
        assert isinstance(reply, list)
        cursor = text(reply[0])
        found = reply[1] if isinstance(reply[1], list) else []
        ids += [text(key)[len("rq:job:") :] for key in found]
        if cursor == "0":
            break
    for job_id in sorted(set(ids)):
        if ":" in job_id:  # rq:job:<id>:dependents and the like
            continue
        fields = connection.command(
            "HMGET", f"rq:job:{job_id}", "status", "origin", "description", "retries_left"
        )
        assert isinstance(fields, list)
        status, origin, description, retries = (text(value) for value in fields)
        if origin != name:
            continue
        try:
            if not description.startswith(DESCRIPTION_PREFIX):
                raise ValueError(description)
            named = json.loads(description[len(DESCRIPTION_PREFIX) :])
            key, max_attempts = str(named["key"]), int(named["max_attempts"])
        except (ValueError, KeyError, TypeError):
            problems.append(f"job {job_id}: a description the lab did not write: {description!r}")
            continue
        state = status
        if status == QUEUED and job_id not in waiting:
            state = DEQUEUED
            if job_id not in popped:
                problems.append(f"job {key}: queued, yet in no queue")
        elif status not in _KNOWN:
            problems.append(f"job {key}: status {status!r}")
        placed = {STARTED: started, FINISHED: finished, FAILED: failed}.get(status)
        if placed is not None and job_id not in placed:
            problems.append(f"job {key}: {status}, yet not in RQ's {status} registry")
        retries_left = int(retries) if retries.lstrip("-").isdigit() else None
        jobs[key] = (state, attempts_made(status, max_attempts, retries_left))
    return RqReading(True, jobs, tuple(problems))
