"""An independent reader of taskiq-redis's stream broker and result backend in a Redis server,
with the lab's own commands.

It speaks Redis's protocol itself (``judges.resp``) and knows the layout from Redis's
documentation of streams and from what taskiq-redis writes, never from taskiq's code: a
queue is a stream named as the queue, each entry one message (its field ``data``, taskiq's
JSON message: ``task_id``, ``task_name``, ``labels``, ``args``); the broker's consumer
group (``taskiq``) remembers the last entry it delivered (``XINFO GROUPS``) and keeps every
delivered entry no consumer acknowledged in its pending entries list (``XPENDING``): an
entry stays there until ``XACK``, whichever consumer held it and whether or not that
consumer still lives. A finished task's outcome is the string named by its task id (the
result backend's pickled dict, ``is_err`` telling a failure).

The adapter gives each job the task id ``<queue>-<key>`` and the lab's key, job type and
payload as its arguments. A retry (taskiq's ``SimpleRetryMiddleware``) adds a new entry with
the same task id and the label ``_retries``: the newest entry of a task id is where it
stands, and its attempts are the retries before it, plus one once it was delivered.

From 1.0.6 a consumer runs its ``XAUTOCLAIM`` holding a lock, the key
``autoclaim:<group>:<stream>`` (redis-py's lock: the holder's random token as its value, set
only when absent, deleted by its holder), and a consumer that finds the key set skips its
reclaim. The reader says whether the key is set and when it expires (never, without a
timeout): a lock its holder died with stops every consumer's reclaim.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readers.arq import unpickle
from crashqueuelab.judges.resp import Reply, RespConnection, RespError, text

#: The queue of a store is named in this file of its directory.
QUEUE_FILE = "taskiq-queue.json"
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
#: taskiq-redis's default consumer group, which the adapter keeps.
GROUP = "taskiq"
#: The reader's words for where a job stands: the stream's (an entry not yet delivered to the
#: group, or delivered and pending), then the result backend's.
QUEUED, PENDING, SUCCEEDED, FAILED, ACKNOWLEDGED = (
    "queued",
    "pending",
    "succeeded",
    "failed",
    "acknowledged",
)
#: The most pending entries one read lists (XPENDING's count).
PENDING_LISTED = 100_000
#: The key of the lock a consumer holds while it reclaims a stream's pending entries.
RECLAIM_LOCK = "autoclaim:{group}:{stream}"


@dataclass(frozen=True)
class Entry:
    """One stream entry, as the reader found it."""

    id: str
    task_id: str
    key: str
    retries: int
    #: Where it stands in the group: ``queued``, ``pending`` or ``acknowledged``.
    state: str
    #: The consumer that holds a pending entry, its idle time and deliveries (XPENDING).
    consumer: str = ""
    idle_ms: int = 0
    deliveries: int = 0


@dataclass(frozen=True)
class TaskiqReading:
    exists: bool
    #: key -> (the reader's state, attempts made)
    jobs: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    entries: tuple[Entry, ...] = ()
    #: The group's consumers, by name: their pending entries (XINFO CONSUMERS).
    consumers: Mapping[str, int] = field(default_factory=dict)
    #: What else the reader found that explains where jobs stand: ``reclaim_lock``.
    facts: Mapping[str, Any] = field(default_factory=dict)


def queue_name(directory: Path) -> str | None:
    try:
        return str(json.loads((directory / QUEUE_FILE).read_text())["queue"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def task_id(queue: str, key: str) -> str:
    """The taskiq task id of the lab's job ``key`` on ``queue``."""
    return f"{queue}-{key}"


def _entry_id(value: str) -> tuple[int, int]:
    milliseconds, _, sequence = value.partition("-")
    return int(milliseconds), int(sequence or 0)


def _pairs(reply: Reply) -> dict[str, Reply]:
    items = reply if isinstance(reply, list) else []
    return {text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


def read_taskiq_store(directory: Path, socket: str | None = None) -> TaskiqReading:
    """Every job of the store's stream, as the server holds it now."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return TaskiqReading(exists=False)
    if not path:
        return TaskiqReading(True, problems=(f"no Redis server named ({SOCKET_VARIABLE} unset)",))
    try:
        with RespConnection(path) as connection:
            return _read(connection, name)
    except (OSError, RespError) as error:
        return TaskiqReading(True, problems=(f"Redis did not answer: {error}",))


def _group(connection: RespConnection, name: str) -> tuple[str | None, dict[str, int]]:
    """The group's last delivered entry, and its consumers' pending counts."""
    if connection.command("EXISTS", name) == 0:
        return None, {}
    groups = connection.command("XINFO", "GROUPS", name)
    for group in groups if isinstance(groups, list) else []:
        fields = _pairs(group)
        if text(fields.get("name")) == GROUP:
            consumers = connection.command("XINFO", "CONSUMERS", name, GROUP)
            counts = {
                text(_pairs(c).get("name")): int(text(_pairs(c).get("pending")) or 0)
                for c in (consumers if isinstance(consumers, list) else [])
            }
            return text(fields.get("last-delivered-id")), counts
    return None, {}


def _pending(connection: RespConnection, name: str) -> dict[str, tuple[str, int, int]]:
    reply = connection.command("XPENDING", name, GROUP, "-", "+", PENDING_LISTED)
    found = {}
    for row in reply if isinstance(reply, list) else []:
        assert isinstance(row, list)
        found[text(row[0])] = (text(row[1]), int(text(row[2])), int(text(row[3])))
    return found


def _message(data: Reply) -> dict[str, Any]:
    decoded = json.loads(text(data))
    assert isinstance(decoded, dict)
    return decoded


def _read(connection: RespConnection, name: str) -> TaskiqReading:
    last, consumers = _group(connection, name)
    if last is None:
        # No group yet: nothing was ever read, and no entry can be delivered.
        last = "0-0"
    pending = _pending(connection, name) if consumers or last != "0-0" else {}
    rows = connection.command("XRANGE", name, "-", "+")
    entries: list[Entry] = []
    problems: list[str] = []
    for row in rows if isinstance(rows, list) else []:
        assert isinstance(row, list)
        identifier = text(row[0])
        fields = _pairs(row[1])
        try:
            message = _message(fields.get("data"))
            key = str(message["args"][0])
            labels = message.get("labels") or {}
            retries = int(labels.get("_retries", 0))
            task = str(message["task_id"])
        except (ValueError, KeyError, IndexError, TypeError, AssertionError):
            problems.append(f"entry {identifier}: not a message of the lab's")
            continue
        if _entry_id(identifier) > _entry_id(last):
            state, held = QUEUED, ("", 0, 0)
        elif identifier in pending:
            state, held = PENDING, pending[identifier]
        else:
            state, held = ACKNOWLEDGED, ("", 0, 0)
        entries.append(Entry(identifier, task, key, retries, state, *held))
    newest: dict[str, Entry] = {}
    for entry in entries:  # XRANGE lists them oldest first
        newest[entry.task_id] = entry
    jobs: dict[str, tuple[str, int]] = {}
    for task, entry in sorted(newest.items()):
        if entry.state == QUEUED:
            jobs[entry.key] = (QUEUED, entry.retries)
            continue
        if entry.state == PENDING:
            jobs[entry.key] = (PENDING, entry.retries + 1)
            continue
        result = connection.command("GET", task)
        if not isinstance(result, bytes):
            problems.append(f"job {entry.key}: acknowledged, with no result")
            jobs[entry.key] = (ACKNOWLEDGED, entry.retries + 1)
            continue
        outcome = unpickle(result)
        failed = bool(outcome.get("is_err")) if isinstance(outcome, dict) else True
        jobs[entry.key] = (FAILED if failed else SUCCEEDED, entry.retries + 1)
    facts = {"reclaim_lock": _reclaim_lock(connection, name)}
    return TaskiqReading(True, jobs, tuple(problems), tuple(entries), consumers, facts)


def _reclaim_lock(connection: RespConnection, name: str) -> dict[str, Any]:
    """Whether a consumer holds the stream's reclaim lock (``RECLAIM_LOCK``), and for how
    long more (None: the key never expires, so it is held until its holder deletes it). The
    key is not in the fact: it names the stream, which differs from store to store, and a
    campaign compares its crash states' facts across cases."""
    key = RECLAIM_LOCK.format(group=GROUP, stream=name)
    held = connection.command("GET", key)
    if not isinstance(held, bytes):
        return {"held": False}
    remaining = connection.command("PTTL", key)
    expires = int(remaining) if isinstance(remaining, int) and remaining >= 0 else None
    return {"held": True, "expires_in_ms": expires}
