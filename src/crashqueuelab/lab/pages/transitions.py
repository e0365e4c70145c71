"""A store's own history as the transitions a person reads: which job went from which
state to which, by whose lease, when (seconds from the case's start), and why where the
store says; lease tokens shortened, a payload never dumped.

Two shapes of history are read: event rows that name both states (the SQLite and
PostgreSQL queues), and walqueue's WAL transactions, whose states this module follows
frame by frame as walqueue's rules give them. A row of any other shape is still shown,
as its type and a short text of what it holds."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashqueuelab.lab.pages.tokens import short_names

#: An entry of an unknown shape is shown as text, cut to this many characters.
OTHER_TEXT = 120
#: Stands for a state the history does not hold (a job it first sees mid-life).
UNKNOWN = "?"
#: Stands for no state at all: the job did not exist before this transition.
NONE = "—"
#: What every row already says of an entry: left out of an unknown entry's text.
_ENTRY_KEYS = {
    "at_us",
    "now",
    "event_type",
    "type",
    "job_id",
    "task_id",
    "task_ids",
    "tasks",
    "seq",
}


@dataclass
class _Task:
    """What walqueue's frames have said of one task so far."""

    status: str
    attempts: int
    max_attempts: int | None
    holder: str | None = None


def seconds_text(us: int, origin_us: int) -> str:
    """``us`` as seconds after ``origin_us``: "0 s", "0.001 s", "3,613 s"."""
    return f"{(us - origin_us) / 1e6:,.3f}".rstrip("0").rstrip(".") + " s"


def _at(entry: Mapping[str, Any]) -> int | None:
    at = entry.get("at_us", entry.get("now"))
    return at if isinstance(at, int) else None


def _submission(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What a SQLite submission event's detail says of the job (its key, its attempts), or
    nothing: another event, or a detail that is not the JSON object the queue writes."""
    if entry.get("event_type") != "SUBMITTED" or not isinstance(entry.get("detail"), str):
        return {}
    try:
        detail = json.loads(entry["detail"])
    except ValueError:
        return {}
    return detail if isinstance(detail, dict) else {}


def _job_names(history: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, str]:
    """Each job id the history names, as its key where a submission says it (less the
    case's own prefix), else its id shortened."""
    keys: dict[str, str] = {}
    ids: set[str] = set()
    for entry in history:
        for job in _jobs_of(entry):
            ids.add(job)
        key = _submission(entry).get("idempotency_key")
        if isinstance(key, str):
            keys[str(entry["job_id"])] = key
    short = short_names(job for job in ids if job not in keys and job.startswith("job-"))
    return {
        job: keys[job].removeprefix(prefix)
        if job in keys
        else short.get(job, job.removeprefix(prefix))
        for job in ids
    }


def _jobs_of(entry: Mapping[str, Any]) -> list[str]:
    if entry.get("job_id") or entry.get("task_id"):
        return [str(entry.get("job_id") or entry.get("task_id"))]
    return [
        str(item.get("task_id", "?")) if isinstance(item, Mapping) else str(item)
        for item in entry.get("task_ids", entry.get("tasks", [])) or []
    ]


def _event_row(entry: Mapping[str, Any], origin_us: int, leases: dict[str, str]) -> dict[str, Any]:
    """One event of the SQLite or PostgreSQL queue: it names both of its states."""
    kind = str(entry["event_type"])
    notes = []
    limit = _submission(entry).get("max_attempts")
    if limit is not None:
        notes.append(f"up to {limit} attempts")
    if entry.get("attempt"):
        notes.append(f"attempt {entry['attempt']}")
    if isinstance(entry.get("lease_deadline_us"), int):
        notes.append(f"lease until {seconds_text(entry['lease_deadline_us'], origin_us)}")
    if entry.get("to_state") == "RETRY_SCHEDULED" and isinstance(entry.get("available_at_us"), int):
        notes.append(f"retry from {seconds_text(entry['available_at_us'], origin_us)}")
    if entry.get("error"):
        notes.append(str(entry["error"]))
    token = entry.get("lease_token")
    return {
        "change": f"{entry.get('from_state') or NONE} → {entry.get('to_state') or UNKNOWN}",
        "event": kind.lower().replace("_", " "),
        "holder": entry.get("worker_id") or "",
        "lease": leases.get(token, "") if isinstance(token, str) else "",
        "lease_title": token or "",
        "note": "; ".join(notes),
    }


def _ended(task: _Task | None) -> str:
    """Where walqueue sends a task whose lease ended without success."""
    if task is None or task.max_attempts is None:
        return "ready or dead"
    return "dead" if task.attempts >= task.max_attempts else "ready"


def _moved(before: str, after: str, event: str, holder: str = "", lease: str = "",
           note: str = "") -> dict[str, Any]:  # fmt: skip
    return {"change": f"{before} → {after}", "event": event, "holder": holder, "lease": lease,
            "note": note}  # fmt: skip


def _frame_rows(
    entry: Mapping[str, Any], tasks: dict[str, _Task], origin_us: int
) -> list[tuple[str, dict[str, Any]]]:
    """One walqueue transaction as a row per task it moves; ``tasks`` follows them. walqueue
    names a lease by its holder and its generation, which counts the task's attempts."""
    kind = entry.get("type")
    rows: list[tuple[str, dict[str, Any]]] = []
    if kind == "put":
        for item in entry.get("tasks", []):
            limit = item.get("max_attempts")
            tasks[item["task_id"]] = _Task("ready", 0, limit)
            rows.append(
                (item["task_id"], _moved(NONE, "ready", "put", note=f"up to {limit} attempts"))
            )
    elif kind == "reserve":
        for task_id in entry.get("task_ids", []):
            task = tasks.get(task_id)
            before = task.status if task else UNKNOWN
            if task:
                task.status, task.holder = "leased", entry["worker"]
                task.attempts += 1
            until = seconds_text(entry["now"] + entry["lease_seconds"], origin_us)
            note = (f"attempt {task.attempts}, " if task else "") + f"lease until {until}"
            lease = f"generation {task.attempts}" if task else ""
            rows.append(
                (task_id, _moved(before, "leased", "reserve", entry["worker"], lease, note))
            )
    elif kind in ("ack", "release"):
        task_id = entry["task_id"]
        task = tasks.get(task_id)
        before = task.status if task else UNKNOWN
        after = "completed" if kind == "ack" else _ended(task)
        note = ""
        if kind == "release" and after == "ready":
            note = f"retry from {seconds_text(entry['now'] + entry['delay'], origin_us)}"
        if task:
            task.status, task.holder = after, None
        lease = f"generation {entry.get('generation')}"
        rows.append((task_id, _moved(before, after, kind, entry.get("worker", ""), lease, note)))
    else:  # an expiry: the caller passes walqueue's five kinds of frame alone
        for task_id in entry.get("task_ids", []):
            task = tasks.get(task_id)
            before, after = (task.status if task else UNKNOWN), _ended(task)
            holder, lease = "", ""
            if task and task.holder:
                holder, lease = task.holder, f"generation {task.attempts}"
            if task:
                task.status, task.holder = after, None
            rows.append((task_id, _moved(before, after, "lease expired", holder, lease)))
    return rows


def _other_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry of a shape this module does not know: its type, and what it holds, short."""
    text = ", ".join(
        f"{key}={value}"
        for key, value in entry.items()
        if key not in _ENTRY_KEYS and value is not None
    )
    if len(text) > OTHER_TEXT:
        text = text[: OTHER_TEXT - 1] + "…"
    return {
        "change": "",
        "event": str(entry.get("event_type", entry.get("type", UNKNOWN))),
        "holder": "",
        "note": text,
    }


def store_transitions(
    history: Sequence[Mapping[str, Any]],
    *,
    origin_us: int,
    recovery_us: int | None = None,
    job_prefix: str = "",
) -> list[dict[str, Any]]:
    """The history's rows, in its order: ``at`` (seconds from ``origin_us``, blank where the
    store records no time), ``job`` (its key less ``job_prefix``, or its id shortened),
    ``change`` ("QUEUED → LEASED"), ``event``, ``holder``, ``lease`` (shortened; ``lease_title``
    whole), ``note``, and ``phase``: "recovery" from ``recovery_us`` on, else "workload"."""
    names = _job_names(history, job_prefix)
    leases = short_names(
        str(entry["lease_token"]) for entry in history if isinstance(entry.get("lease_token"), str)
    )
    tasks: dict[str, _Task] = {}
    rows = []
    recovering = False
    for entry in history:
        at = _at(entry)
        if "event_type" in entry and "job_id" in entry:
            moves = [(str(entry["job_id"]), _event_row(entry, origin_us, leases))]
        elif entry.get("type") in ("put", "reserve", "ack", "release", "expire"):
            moves = _frame_rows(entry, tasks, origin_us)
        else:
            moves = [(",".join(_jobs_of(entry)), _other_row(entry))]
        # An entry the store keeps no time for belongs with the one before it.
        if recovery_us is not None and at is not None:
            recovering = at >= recovery_us
        for job, row in moves:
            rows.append(
                {"lease": "", "lease_title": ""}
                | row
                | {
                    "at": "" if at is None else seconds_text(at, origin_us),
                    "job": names.get(job, job.removeprefix(job_prefix)),
                    "job_title": job,
                    "phase": "recovery" if recovering else "workload",
                }
            )
    return rows
