"""``python -m walqueue.cli DIRECTORY``: one JSON command per stdin line, one JSON line back.

Commands: ``{"op": "put" | "put_many" | "reserve" | "ack" | "release" | "get" | "stats" |
"compact", ...}`` with the API's argument names; a lease is passed back as the object
``reserve`` printed. A malformed line gets an error line and the session goes on; a store
that cannot be opened ends the session with one error line and exit status 1.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from walqueue.errors import WalQueueError
from walqueue.queue import Lease, Queue

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
USAGE = "usage: python -m walqueue.cli DIRECTORY (one JSON command per stdin line)"


def _lease(raw: Any) -> Lease:
    if not isinstance(raw, dict):
        raise TypeError("lease must be the object reserve returned")
    fields = {field.name for field in dataclasses.fields(Lease)}
    if set(raw) != fields:
        raise TypeError(f"lease needs exactly the fields {sorted(fields)}")
    return Lease(**raw)


def _done(operation: Callable[..., None], arguments: dict[str, Any]) -> dict[str, Any]:
    operation(_lease(arguments.pop("lease", None)), **arguments)
    return {}


def _run(queue: Queue, command: dict[str, Any]) -> dict[str, Any]:
    op = command.pop("op", None)
    handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "put": lambda a: {"task_id": queue.put(**a)},
        "put_many": lambda a: {"task_ids": queue.put_many(**a)},
        "reserve": lambda a: {
            "leases": [dataclasses.asdict(lease) for lease in queue.reserve(**a)]
        },
        "ack": lambda a: _done(queue.ack, a),
        "release": lambda a: _done(queue.release, a),
        "get": lambda a: {"task": dataclasses.asdict(queue.get(**a))},
        "stats": lambda a: {"stats": queue.stats(**a)},
        "compact": lambda a: {"snapshot_seq": queue.compact(**a)},
    }
    handler = handlers.get(op) if isinstance(op, str) else None
    if handler is None:
        raise TypeError(f"unknown op {op!r}; expected one of {sorted(handlers)}")
    return {"ok": True, **handler(command)}


def _error(error: BaseException) -> dict[str, Any]:
    kind = type(error).__name__
    return {"ok": False, "error": {"type": kind, "message": str(error)}}


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    source = stdin if stdin is not None else sys.stdin
    out = stdout if stdout is not None else sys.stdout

    def emit(result: dict[str, Any]) -> None:
        out.write(json.dumps(result, sort_keys=True) + "\n")
        out.flush()

    if arguments in (["-h"], ["--help"]):
        emit({"ok": True, "usage": USAGE})
        return EXIT_OK
    # An option is never taken for a directory to create.
    if len(arguments) != 1 or arguments[0].startswith("-"):
        emit(_error(TypeError(USAGE)))
        return EXIT_USAGE
    try:
        queue = Queue(arguments[0])
    except (WalQueueError, OSError) as error:
        emit(_error(error))
        return EXIT_UNAVAILABLE
    with queue:
        for line in source:
            if not line.strip():
                continue
            if queue.closed:
                # A write failed part-way (a disk error): the store needs a fresh open.
                emit(_error(WalQueueError("the queue closed after a failed write; reopen it")))
                return EXIT_UNAVAILABLE
            try:
                command = json.loads(line)
                if not isinstance(command, dict):
                    raise TypeError("each line must be a JSON object")
                emit(_run(queue, command))
            except RecursionError:
                emit(_error(ValueError("the line is nested too deeply")))
            except KeyError as error:
                emit(
                    {"ok": False, "error": {"type": "KeyError", "message": f"unknown task {error}"}}
                )
            except (WalQueueError, TypeError, ValueError, OSError) as error:
                emit(_error(error))
        failed = queue.closed
    return EXIT_UNAVAILABLE if failed else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
