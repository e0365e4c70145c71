"""A heartbeat run after another, on the store it left: an upgrade (``versions
--upgrade-from``).

The first run (the release upgraded from) ends; the second (the release under test) runs on
the very server it ran on (the run that starts both keeps it, ``KEPT_REDIS_VARIABLE``) and on
its store: the files that name the store (its queue) are copied into the second run's store
directory, its workers' logs left behind. The second run's jobs are numbered after the
first's, so that each job belongs to one run: the second run judges its own, and what the
first left is read before the second submits anything (the system's independent reader:
what no lab job explains) and named as the first run's, never as the second's loss. A first
run that left nothing of the kind did not make the fault the upgrade is about: the second
run is then "not exercised", judged neither way.

Once the second run's workers stopped, the release's own recovery runs (``System.recover``,
after ``System.recovery_s``: dramatiq's maintenance, which puts back a dead worker's
messages) and the store is read again: what the first run left and is still there then, the
release under test keeps for ever (dramatiq 1.12.0 puts an id whose message is gone back on
its queue, to be handed out again as an empty message, #442; 1.12.1 drops it), and what
this run made itself is its own. Each is an inconsistent store (``store_inconsistent``).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.runs.kinds import HEARTBEATS
from crashqueuelab.systems.contract import StoreReading, System

#: The libraries a run after another is built for: dramatiq's store is its Redis broker's
#: queue, and its recovery (the maintenance) comes a heartbeat timeout after its workers.
UPGRADABLE_LIBRARIES = ("dramatiq",)
#: The type of a run's error when the first run left nothing for the second to meet.
NOT_EXERCISED = "NotExercised"
#: Files of the first run's store that stay behind: its workers' logs are its own.
LEFT_BEHIND = ("*.log",)
#: What a reader's problem is about: "message ID: ..." or "job KEY: ..." (a reader's words
#: for one of its messages or jobs).
_SUBJECT = re.compile(r"^(?P<what>message|job) (?P<name>[^: ]+):")


@dataclass(frozen=True)
class Before:
    """The run this one comes after: its directory, its record and its jobs."""

    directory: Path
    record: dict[str, Any]
    keys: tuple[str, ...]

    @property
    def store(self) -> Path:
        return self.directory / "store"


def load_before(directory: Path, system: System) -> Before:
    """The heartbeat run in ``directory``, checked: a record of ``system``'s library with a
    store; an error of one line for anything else."""
    try:
        record = json.loads((directory / HEARTBEATS.record).read_text())
    except (OSError, ValueError):
        raise InvalidInput(
            "after", f"{directory}: no heartbeat run's record ({HEARTBEATS.record}) there"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("jobs"), dict):
        raise InvalidInput("after", f"{directory}: not a heartbeat run's record")
    name = (record.get("system") or {}).get("name")
    if name != system.name:
        raise InvalidInput(
            "after", f"{directory} is a run of {name!r}: this run's store is {system.name!r}'s"
        )
    if system.server != "redis":
        raise InvalidInput(
            "after", f"{system.name} keeps no store on a server a run after it could share"
        )
    if system.distribution not in UPGRADABLE_LIBRARIES:
        raise InvalidInput(
            "after",
            f"{system.name}: a run after another is built for {', '.join(UPGRADABLE_LIBRARIES)}"
            " alone (its end waits for the library's recovery, a heartbeat timeout for"
            " dramatiq, an hour's visibility timeout for Celery by default)",
        )
    before = Before(directory, record, tuple(str(key) for key in record["jobs"]))
    if not before.store.is_dir():
        raise InvalidInput("after", f"{directory}: the run kept no store directory")
    return before


def take_over(before: Before, store: Path) -> list[str]:
    """Copy what names the first run's store into this run's (not its workers' logs); the
    names of the files copied."""
    copied = []
    for path in sorted(before.store.iterdir()):
        if path.is_file() and not any(path.match(pattern) for pattern in LEFT_BEHIND):
            shutil.copy2(path, store / path.name)
            copied.append(path.name)
    return copied


def next_keys(before: Before, jobs: int) -> list[str]:
    """This run's jobs, numbered after the first run's (itself, maybe, a run after another,
    whose numbers did not start at 0)."""
    numbers = [int(key[4:]) for key in before.keys if re.fullmatch(r"job-[0-9]+", key)]
    first = max([*numbers, len(before.keys) - 1]) + 1
    return [f"job-{index:02d}" for index in range(first, first + jobs)]


def subject_of(problem: str) -> tuple[str, str | None]:
    """What a reader's problem is about (``message ID`` or ``job KEY``; else the whole
    problem), and the job it names, if any."""
    found = _SUBJECT.match(problem)
    if found is None:
        return problem, None
    job = found.group("name") if found.group("what") == "job" else None
    return f"{found.group('what')} {found.group('name')}", job


def accounted(
    before: Before,
    left: Sequence[str],
    at_end: Sequence[str],
) -> dict[str, Any]:
    """The upgrade's accounting: what the first run left (``left``, read before this run
    submitted), and of what the reader names at the end (``at_end``), what is the first
    run's (its subject was left, or it names a job of the first run) and what is this
    run's own."""
    left_subjects = {subject_of(problem)[0] for problem in left}
    mine, theirs = [], []
    for problem in at_end:
        subject, job = subject_of(problem)
        if subject in left_subjects or (job is not None and job in before.keys):
            theirs.append(problem)
        else:
            mine.append(problem)
    return {
        "from": {
            "directory": before.directory.name,
            "spec": before.record.get("spec"),
            "version": (before.record.get("system") or {}).get("version"),
            "ok": before.record.get("ok"),
            "jobs": list(before.keys),
            "anomalies": len(before.record.get("anomalies") or ()),
        },
        "exercised": bool(left),
        "left": list(left),
        "left_jobs": sorted({job for _, job in map(subject_of, left) if job is not None}),
        "at_end": {"the first run's": theirs, "this run's": mine},
    }


#: The first line of a traceback, which a log's summary leaves out with its frames.
_TRACEBACK = "Traceback (most recent call last)"
#: Who left a problem the second run still finds, in its finding's facts.
THIS_RUN = "this run"


def leftovers(before: Before, accounting: dict[str, Any]) -> list[Anomaly]:
    """What the store still holds after the release's workers and its recovery, that no lab
    job explains: the first run's (kept by this release) and this run's own."""
    spec = str(before.record.get("spec"))
    found = []
    for problem in accounting["at_end"]["the first run's"]:
        text = (
            f"{problem}: left by the run before ({spec}), still there after this release's"
            " workers and its own recovery"
        )
        found.append(
            Anomaly(Kind.STORE_INCONSISTENT, text, facts={"problem": problem, "left_by": spec})
        )
    for problem in accounting["at_end"]["this run's"]:
        text = f"{problem}: made in this run, still there after its recovery"
        found.append(
            Anomaly(Kind.STORE_INCONSISTENT, text, facts={"problem": problem, "left_by": THIS_RUN})
        )
    return found


def not_exercised(before: Before) -> dict[str, str]:
    """The error of a run after a first run that left nothing no lab job explains."""
    return {
        "type": NOT_EXERCISED,
        "message": f"the run before it ({before.record.get('spec')}, {before.directory.name})"
        " left nothing in the store that no lab job explains: the upgrade's fault was not"
        " made, so this release was not exercised by it",
    }


def problems(reading: StoreReading | None) -> list[str]:
    return [] if reading is None else list(reading.problems)


def library_logs(store: Path, lines: int = 3) -> dict[str, dict[str, Any]]:
    """What the library logged in each worker's log in the store directory (a worker loop
    that keeps one, as dramatiq's): how many lines, and the first distinct ones that say
    something (a traceback's frames left out, its last line kept)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(store.glob("*.log")):
        text = path.read_text(errors="replace").splitlines()
        said = (
            line
            for line in text
            if line.strip() and not line[0].isspace() and not line.startswith(_TRACEBACK)
        )
        distinct = list(dict.fromkeys(said))
        found[path.name] = {"lines": len(text), "first": distinct[:lines]}
    return found
