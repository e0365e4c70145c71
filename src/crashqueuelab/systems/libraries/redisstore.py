"""What the libraries on the Redis server a run starts share: the server's socket, named in
the environment, a store's own names (its queue, its keys' prefix) kept in a file of its
directory, written by the store's first open and read by every later one, and what Redis
documents of the persistence a library's system runs on."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.judges.findings import Kind
from crashqueuelab.servers.redis import SOCKET_VARIABLE
from crashqueuelab.systems.contract import Documented


def redis_socket(system: str) -> str:
    """The run's Redis server's socket; ``system`` is named when there is none."""
    socket = os.environ.get(SOCKET_VARIABLE)
    if not socket:
        raise SystemUnavailable(
            system, f"no Redis server: the command line starts one; {SOCKET_VARIABLE} is unset"
        )
    return socket


def unique_suffix(directory: Path) -> str:
    """A name no other store on the server has (the directory, the time, the process)."""
    seed = f"{directory.resolve()}{time.time_ns()}{os.getpid()}"
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def synced_json(path: Path, content: dict[str, Any]) -> None:
    """``content`` in ``path`` unless it is there already (of two processes opening one new
    store at once, the first one's content wins), synced with its directory."""
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    with draft.open("w") as handle:
        json.dump(content, handle)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    descriptor = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def kept_once(path: Path, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The store's names in ``path``: ``make``'s, written by the store's first open."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synced_json(path, make())
    kept: dict[str, Any] = json.loads(path.read_text())
    return kept


def record_line(path: Path, key: str, identifier: str) -> None:
    """One more line of a record the adapter keeps in the store's directory (a job's key and
    its message id), synced before it returns."""
    with path.open("a") as handle:
        handle.write(json.dumps({"key": key, "message_id": identifier}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def recorded_keys(path: Path) -> set[str]:
    """The keys of ``record_line``'s record (a line a crash cut short is left out)."""
    keys: set[str] = set()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return keys
    for line in lines:
        try:
            keys.add(str(json.loads(line)["key"]))
        except (ValueError, KeyError, TypeError):
            continue
    return keys


PERSISTENCE_DOCS = "https://redis.io/docs/latest/operate/oss_and_stack/management/persistence/"
#: Redis's default persistence, as every library on the run's server at its defaults meets it.
RDB_SNAPSHOTS = Documented(
    "RDB snapshots (Redis's default persistence) keep only the last snapshot: a crash of the"
    " server or a power cut takes back every write since it",
    PERSISTENCE_DOCS,
    crash_modes=("power-loss",),
    faults=("server restart",),
)

#: redis-py's own words on its errors.
CLIENT_ERRORS_DOCS = "https://redis.io/docs/latest/develop/clients/redis-py/error-handling"
#: Every Redis-backed library calls Redis through redis-py, which signals a connection that
#: broke under a call by raising: the caller is told failure, which the lab's contract
#: allows; the lab's chaos worker that made the call exits and is respawned.
CONNECTION_RAISES = Documented(
    'a call whose connection to Redis breaks (reset, or its answer lost) raises ("redis-py'
    ' uses exceptions to signal errors"; redis.ConnectionError: "Network or connection'
    " issues\"): the caller is told failure, and the lab's chaos worker that made the call"
    " exits and is respawned",
    CLIENT_ERRORS_DOCS,
    when={
        Kind.WORKER_EXITED: {
            "status": 3,
            "error": ("redis.exceptions.ConnectionError*", "redis.exceptions.TimeoutError*"),
        }
    },
)


#: A library on Redis runs at Redis's default persistence under its own name, and with the
#: append-only file synced before each answer under ``NAME-aof-always`` (its
#: ``PERSISTENCE_BY_SYSTEM``): there a crash or a power cut should take back nothing answered.
AOF_ALWAYS = "aof-always"


def persistence_losses(persistence: str) -> tuple[Documented, ...]:
    """What Redis documents a crash of the server or a power cut takes back, at the
    persistence a system runs on: every write since the last snapshot with RDB; with the
    append-only file synced on every write, nothing answered, so a loss there is no one's
    documented weakness."""
    return (RDB_SNAPSHOTS,) if persistence == "rdb" else ()


def persistence_durability(persistence: str) -> str:
    """A system's durability line for its Redis server's persistence."""
    from crashqueuelab.servers.redis import PERSISTENCE_WORDS

    return f"Redis persistence {persistence}: {PERSISTENCE_WORDS[persistence]}"
