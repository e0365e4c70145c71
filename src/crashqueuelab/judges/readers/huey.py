"""An independent reader of huey's ``SqliteStorage`` file, as the lab drives it.

It knows the tables huey creates (``task``, ``schedule``, ``kv``) and what huey's default
serializer writes into them: a pickled ``Message`` (a named tuple whose fields start ``id,
name, eta, retries``, then ``retry_delay, priority, args``) for each waiting task, and the
pickled return value or ``Error`` under a finished task's id. It unpickles with a restricted
unpickler that builds no class of huey's (it records the class's name and the values given
to it instead), so it runs without huey installed and without trusting what it reads.

The lab's adapter gives each task the job's key as its id and ``(job type, payload,
max_attempts)`` as its arguments, and its task returns the attempt that ran it.
"""

from __future__ import annotations

import io
import pickle
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.judges.readonly import open_foreign_read_only

DATABASE_FILE = "huey.db"
#: Where a job stands in huey's file, in huey's terms: in the ``task`` table, in the
#: ``schedule`` table (a retry with a delay), or finished with a result or an error in ``kv``.
QUEUED, SCHEDULED, DONE, ERROR = "queued", "scheduled", "done", "error"
#: The lab's task names its attempt in the error it raises: ``attempt N: reason``.
FAILED_ATTEMPT = "attempt"
_FAILED = re.compile(FAILED_ATTEMPT + r" (\d+):")
#: The modules whose values a pickle in huey's file may hold besides huey's own classes.
_PLAIN_MODULES = {"builtins", "copyreg", "collections", "datetime", "uuid"}


@dataclass
class Recorded:
    """What the restricted unpickler builds in place of a class it will not import."""

    qualified_name: str
    args: tuple[Any, ...] = ()
    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _recording(qualified_name: str) -> type:
    """A class whose instances record their construction, for NEWOBJ in pickle protocol 2+."""

    def new(cls: type, *args: Any) -> Recorded:
        return Recorded(qualified_name, args)

    return type("Recorded_" + qualified_name.replace(".", "_"), (), {"__new__": new})


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".", maxsplit=1)[0] in _PLAIN_MODULES and module != "builtins":
            return super().find_class(module, name)
        if module == "builtins" and name in {"dict", "list", "tuple", "set", "frozenset"}:
            return super().find_class(module, name)
        return _recording(f"{module}.{name}")


def unpickle(data: bytes) -> Any:
    """A value of huey's file, with every non-plain class replaced by a ``Recorded``."""
    return _RestrictedUnpickler(io.BytesIO(bytes(data))).load()


@dataclass
class HueyReading:
    """Jobs by key as ``(state, attempts)``, and what is wrong with the file."""

    exists: bool
    jobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _message(row_id: int, data: bytes) -> tuple[str, int]:
    """The key and attempts made so far of one waiting task's message."""
    message = unpickle(data)
    if not isinstance(message, Recorded) or not message.qualified_name.endswith(".Message"):
        raise ValueError(f"row {row_id}: not a huey message")
    key, retries, arguments = message.args[0], message.args[3], message.args[6]
    max_attempts = int(arguments[2])
    return str(key), max_attempts - 1 - int(retries)


def failed_attempt(metadata: Any) -> int:
    """The attempt an ``Error``'s metadata names (its ``error`` is the raised exception's
    repr); 0 when it names none."""
    found = _FAILED.search(str(metadata.get("error", ""))) if isinstance(metadata, dict) else None
    return int(found.group(1)) if found else 0


def _finished(value: Any) -> tuple[str, int]:
    if isinstance(value, Recorded) and value.qualified_name.endswith(".Error"):
        return ERROR, failed_attempt(value.args[0] if value.args else value.state)
    if isinstance(value, int) and not isinstance(value, bool):
        return DONE, value
    raise ValueError(f"not a result the lab's task returns: {value!r}")


def read_huey_file(directory: Path) -> HueyReading:
    """Every job the file holds, with the attempts made so far."""
    path = directory / DATABASE_FILE
    if not path.is_file():
        return HueyReading(exists=False)
    reading = HueyReading(exists=True)
    try:
        conn = open_foreign_read_only(path)
    except sqlite3.DatabaseError as error:
        reading.problems.append(f"unreadable: {error}")
        return reading
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        waiting: list[tuple[str, int, bytes]] = []
        for table, state in (("task", QUEUED), ("schedule", SCHEDULED)):
            if table in tables:
                rows = conn.execute(f"SELECT id, data FROM {table} ORDER BY id").fetchall()
                waiting += [(state, row_id, data) for row_id, data in rows]
        values = conn.execute("SELECT key, value FROM kv").fetchall() if "kv" in tables else []
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as error:
        reading.problems.append(f"unreadable: {error}")
        return reading
    finally:
        conn.close()
    if integrity != "ok":
        reading.problems.append(f"integrity_check: {integrity}")
    for state, row_id, data in waiting:
        try:
            key, attempts = _message(row_id, data)
        except (pickle.UnpicklingError, ValueError, IndexError, TypeError, EOFError) as error:
            reading.problems.append(f"{state} row {row_id}: unreadable message ({error})")
            continue
        if key in reading.jobs:
            reading.problems.append(f"job {key}: waiting twice ({state} row {row_id} again)")
            continue
        reading.jobs[key] = (state, attempts)
    for key, value in values:
        if str(key).startswith("r:"):  # a revocation flag, not a result
            continue
        try:
            state, attempts = _finished(unpickle(value))
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError) as error:
            reading.problems.append(f"result {key}: unreadable ({error})")
            continue
        if str(key) in reading.jobs:
            # huey keeps the error of an attempt that will be retried (before 3.x always,
            # later where intermediate errors are stored): the waiting task is the job.
            if state != ERROR:
                reading.problems.append(f"job {key}: finished and still waiting")
            continue
        reading.jobs[str(key)] = (state, attempts)
    return reading
