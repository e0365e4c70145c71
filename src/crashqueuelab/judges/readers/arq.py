"""An independent reader of arq's keys in a Redis server, with the lab's own commands.

It speaks Redis's protocol itself (``judges.resp``) and knows arq's key layout from its
documentation and from what arq writes, never from arq's code: a queue is the sorted set
named as the queue (job ids scored by the time each is due, in ms), a job is the string
``arq:job:<id>`` (a pickled dict: ``f`` the function's name, ``a`` its arguments, ``t`` the
try it was enqueued with), a job a worker took is marked by ``arq:in-progress:<id>`` (which
expires on Redis's clock: arq's "pessimistic execution"), its tries so far are counted in
``arq:retry:<id>``, and a finished job's outcome is ``arq:result:<id>`` (a pickled dict:
``s`` success, ``t`` the try that ended it, ``r`` the result or the exception).

The pickles hold plain values except a failure's exception: they are read with an
unpickler that builds no class of anyone's (each class a pickle names is a stand-in that
keeps its name and arguments), so nothing of arq or of the adapter is imported.

The adapter names each job by the store's queue and the lab's key (``job_id``), passes the
lab's key, job type and payload as the job's arguments, and calls the function that runs
a job with ``max_attempts`` tries ``lab_job_<max_attempts>`` (``FUNCTION_PREFIX``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.resp import RespConnection, RespError, text

#: The queue of a store is named in this file of its directory.
QUEUE_FILE = "arq-queue.json"
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
#: The function that runs a job with N tries is ``FUNCTION_PREFIX + str(N)``.
FUNCTION_PREFIX = "lab_job_"
#: The reader's words for where a job stands: arq's own (``Job.status``), with its
#: ``complete`` told apart by the result's success.
QUEUED, DEFERRED, IN_PROGRESS, COMPLETE, FAILED = (
    "queued",
    "deferred",
    "in_progress",
    "complete",
    "failed",
)
#: The words of arq's failure when a job is picked past its ``max_tries``: that pick ran
#: nothing (arq counted it as a try before it looked at the limit).
RETRIES_EXCEEDED = "retries exceeded"


@dataclass(frozen=True)
class ArqReading:
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


def job_id(queue: str, key: str) -> str:
    """The arq job id of the lab's job ``key`` on ``queue``: the key itself after the
    queue, so that jobs enqueued in one millisecond (one score) are taken in the order of
    their keys, as arq's sorted set orders members of one score."""
    return f"{queue}-{key}"


def tries_made(success: bool, job_try: int, result: object, limit: int | None) -> int:
    """The tries a finished job ran: arq counts a pick past ``max_tries`` as a try (its
    result's ``t``) before it fails the job without running it."""
    if not success and RETRIES_EXCEEDED in str(result) and limit is not None:
        return min(job_try, limit)
    return job_try


class _Stand:
    """What the reader builds for any class a pickle names: its name and arguments."""

    name = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __str__(self) -> str:
        return f"{self.name}: {' '.join(str(arg) for arg in self.args)}"


class _NothingImported(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Stand,), {"name": f"{module}.{name}"})


def unpickle(data: bytes) -> Any:
    """A pickle's plain values, with every class it names a stand-in (nothing imported)."""
    return _NothingImported(io.BytesIO(data)).load()


def read_arq_store(directory: Path, socket: str | None = None) -> ArqReading:
    """Every job of the store's queue, as the server holds it now."""
    name = queue_name(directory)
    path = socket or os.environ.get(SOCKET_VARIABLE)
    if name is None:
        return ArqReading(exists=False)
    if not path:
        return ArqReading(True, problems=(f"no Redis server named ({SOCKET_VARIABLE} unset)",))
    try:
        with RespConnection(path) as connection:
            return _read(connection, name)
    except (OSError, RespError) as error:
        return ArqReading(True, problems=(f"Redis did not answer: {error}",))


def _scan(connection: RespConnection, pattern: str) -> list[str]:
    cursor, keys = "0", []
    for _ in range(100_000):  # bounded: SCAN ends when the cursor comes back to 0
        reply = connection.command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        assert isinstance(reply, list)
        cursor = text(reply[0])
        keys += [text(key) for key in (reply[1] if isinstance(reply[1], list) else [])]
        if cursor == "0":
            break
    return keys


def _limit(function: object) -> int | None:
    name = str(function)
    suffix = name[len(FUNCTION_PREFIX) :]
    return int(suffix) if name.startswith(FUNCTION_PREFIX) and suffix.isdigit() else None


def _read(connection: RespConnection, name: str) -> ArqReading:
    reply = connection.command("ZRANGE", name, 0, -1, "WITHSCORES")
    members = reply if isinstance(reply, list) else []
    scores = {text(members[i]): float(text(members[i + 1])) for i in range(0, len(members), 2)}
    now = connection.command("TIME")
    assert isinstance(now, list)
    now_ms = int(text(now[0])) * 1000 + int(text(now[1])) // 1000
    ids = set(scores)
    for prefix in ("arq:job:", "arq:result:"):
        ids |= {key[len(prefix) :] for key in _scan(connection, f"{prefix}{name}-*")}
    jobs: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    for job in sorted(ids):
        fields = connection.command(
            "MGET",
            f"arq:job:{job}",
            f"arq:result:{job}",
            f"arq:retry:{job}",
            f"arq:in-progress:{job}",
        )
        assert isinstance(fields, list)
        definition, result, retry, in_progress = fields
        tries = int(text(retry)) if text(retry).isdigit() else 0
        if isinstance(result, bytes):
            outcome = unpickle(result)
            key = str(outcome["a"][0])
            limit = _limit(outcome["f"])
            ran = tries_made(bool(outcome["s"]), int(outcome["t"]), outcome["r"], limit)
            jobs[key] = (COMPLETE if outcome["s"] else FAILED, ran)
            if job in scores or isinstance(definition, bytes):
                problems.append(f"job {key}: a result, yet still queued")
            continue
        if not isinstance(definition, bytes):
            problems.append(f"job {job}: in the queue, with neither a definition nor a result")
            continue
        key = str(unpickle(definition)["a"][0])
        if job not in scores:
            problems.append(f"job {key}: a definition and no result, yet in no queue")
            continue
        if in_progress is not None:
            state = IN_PROGRESS
        else:
            state = DEFERRED if scores[job] > now_ms else QUEUED
        jobs[key] = (state, tries)
    return ArqReading(True, jobs, tuple(problems))
