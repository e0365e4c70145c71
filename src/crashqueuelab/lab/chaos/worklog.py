"""What each chaos worker saw, line by line, and reading it back.

A worker appends one line per claim, accepted acknowledgement and refused (stale)
acknowledgement to its own line-buffered log, so the lines survive SIGKILL (the page cache
keeps what was written). The supervisor reads the logs to follow progress and to see who
held what when it paused a worker; the accounting reads them to count what the workers were
told, which no database records: two accepted acknowledgements of one job mean the system
accepted a stale one.

Line format: ``claim KEY TOKEN T ASKED`` once the claim returned, ``ASKED`` being when the
claim call began (the lease cannot have been granted before it, nor after ``T``); ``acking
KEY TOKEN T`` just
before the acknowledgement is sent (from then on the lease may be gone at any moment, so a
worker stopped there is not counted as holding it); ``ack KEY TOKEN T`` or ``stale KEY TOKEN
T`` with the system's answer; ``idle T`` once, when the worker first found no unfinished job
left while faults were still planned; ``heartbeat KEY TOKEN T ASKED`` for each accepted
heartbeat of a long job (``longjobs.py``: a refused one is a ``stale`` line); ``commits FOR
BY APPLIED RERUN T`` where the system
shares commits between processes (group commit): once with zeros when the worker starts,
then whenever a call changed the counts, by how much (``SHARED_COMMIT_COUNTS``, in order).
``T`` is ``time.monotonic()``, one clock for every process of the machine, so the report can
place every line on the run's timeline. ``KEY`` and ``TOKEN`` are written percent-encoded
(``word``): the contract calls a token opaque, and one with a space or a line break in it
must not split a line.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

LOG_SUFFIX = ".log"
#: The counts a ``commits`` line carries, in order (``CommitSharingClient``).
SHARED_COMMIT_COUNTS = (
    "carried_for_others",
    "carried_by_others",
    "carrier_vanished_applied",
    "carrier_vanished_rerun",
)


def word(text: str) -> str:
    """``text`` as one word of a log line, whatever characters it holds."""
    return quote(text, safe="")


#: The line a worker writes when the system answered a failure with a retry.
RETRIED = "failed-retry"


def lease_line(what: str, key: str, token: str, *times: float) -> str:
    """One line about a lease: ``WHAT KEY TOKEN T...``, key and token as words."""
    return " ".join([what, word(key), word(token), *(f"{at:.6f}" for at in times)]) + "\n"


def _text(logged: str) -> str:
    return unquote(logged)


@dataclass
class WorkerLog:
    """One worker's claims, accepted and refused acknowledgements, by key."""

    claims: list[tuple[str, str]] = field(default_factory=list)
    acking: list[tuple[str, str]] = field(default_factory=list)
    acks: list[tuple[str, str]] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)
    #: When each accepted acknowledgement was heard (monotonic seconds), in log order.
    ack_times: list[float] = field(default_factory=list)
    #: Every line as (monotonic seconds, word, key, token), in log order.
    events: list[tuple[float, str, str, str]] = field(default_factory=list)
    #: When each claim call that returned a lease began, by (key, token).
    claim_asked: dict[tuple[str, str], float] = field(default_factory=dict)
    #: When the latest accepted heartbeat of each lease was asked, by (key, token).
    extended_asked: dict[tuple[str, str], float] = field(default_factory=dict)
    #: When the worker first found no unfinished job left (and waited for the release).
    idle_at: float | None = None
    #: When the first and the last line were written.
    first_at: float | None = None
    last_at: float | None = None
    #: The group-commit counts of every ``commits`` line added up (None: no such line).
    shared_commits: Counter[str] | None = None
    #: Whether the log ends inside a claim call: a ``claiming`` line with no claim or
    #: ``idle`` line after it (the worker stopped there, or was polling an empty queue).
    claim_open: bool = False
    #: Each failed attempt the system said it would retry, as (key, when it was answered).
    retried: list[tuple[str, float]] = field(default_factory=list)
    #: The key of the ``acking`` line the log ends with: a report the worker began and was
    #: never answered for (None when the log ends otherwise).
    reporting: str | None = None

    def held(self) -> set[tuple[str, str]]:
        """Claims whose acknowledgement has not started: leases this worker surely holds."""
        return set(self.claims) - set(self.acking) - set(self.acks) - set(self.stale)

    def add(self, text: str) -> None:
        """Take the complete lines of ``text``."""
        lists = {
            "claim": self.claims,
            "acking": self.acking,
            "ack": self.acks,
            "stale": self.stale,
        }
        for line in text.splitlines():
            parts = line.split(" ")
            if len(parts) == 2 and parts[0] in ("claiming", "idle"):
                self.claim_open = parts[0] == "claiming"
            elif parts[0] == "claim":
                self.claim_open = False
            if len(parts) == 2 + len(SHARED_COMMIT_COUNTS) and parts[0] == "commits":
                self._add_commits(parts[1:-1])
            if len(parts) == 2 and parts[0] == "idle" and self.idle_at is None:
                try:
                    self.idle_at = float(parts[1])
                except ValueError:
                    continue
            if len(parts) >= 3 and parts[0] != "commits":
                parts[1:3] = [_text(parts[1]), _text(parts[2])]
            if parts[0]:
                self.reporting = parts[1] if parts[0] == "acking" and len(parts) == 4 else None
            if len(parts) == 4 and parts[0] == RETRIED:
                with contextlib.suppress(ValueError):
                    self.retried.append((parts[1], float(parts[3])))
            if len(parts) == 5 and parts[0] == "heartbeat":
                with contextlib.suppress(ValueError):
                    self.extended_asked[(parts[1], parts[2])] = float(parts[4])
                continue
            if len(parts) == 5 and parts[0] == "claim":
                # The claim call's start, then the line as any other.
                try:
                    self.claim_asked[(parts[1], parts[2])] = float(parts[4])
                except ValueError:
                    continue
                parts = parts[:4]
            if len(parts) == 4 and parts[0] in lists:
                lists[parts[0]].append((parts[1], parts[2]))
                try:
                    at = float(parts[3])
                except ValueError:
                    continue
                self.first_at = at if self.first_at is None else self.first_at
                self.last_at = at
                self.events.append((at, parts[0], parts[1], parts[2]))
                if parts[0] == "ack":
                    self.ack_times.append(at)

    def _add_commits(self, counts: list[str]) -> None:
        try:
            values = [int(count) for count in counts]
        except ValueError:
            return
        if self.shared_commits is None:
            self.shared_commits = Counter(dict.fromkeys(SHARED_COMMIT_COUNTS, 0))
        self.shared_commits.update(dict(zip(SHARED_COMMIT_COUNTS, values, strict=True)))


def shared_commit_totals(logs: dict[str, WorkerLog]) -> dict[str, int] | None:
    """Every worker's group-commit counts added up; None when no worker logged any (a
    system that does not share commits)."""
    counted = [log.shared_commits for log in logs.values() if log.shared_commits is not None]
    if not counted:
        return None
    return {name: sum(counts[name] for counts in counted) for name in SHARED_COMMIT_COUNTS}


def _complete(data: bytes) -> bytes:
    # A worker killed mid-line leaves a partial last line: it is not evidence (yet).
    return data[: data.rfind(b"\n") + 1]


def read_log(path: Path) -> WorkerLog:
    log = WorkerLog()
    if path.is_file():
        log.add(_complete(path.read_bytes()).decode())
    return log


class LogFollower:
    """Reads only what was appended to each log since the last look."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._offsets: dict[Path, int] = {}
        self.logs: dict[str, WorkerLog] = {}
        self.acknowledged: set[str] = set()
        #: Keys whose acknowledgement was sent, answered or not: a worker killed between
        #: its commit and its answer's line leaves its job done in the store and never
        #: says so, so progress read from ``acknowledged`` alone trails the store.
        self.sent: set[str] = set()
        #: Every claim of a key: which worker, and when (monotonic seconds).
        self.claimers: dict[str, list[tuple[str, float]]] = {}

    def refresh(self, worker_ids: Iterable[str]) -> None:
        """Read what the named workers appended (a worker that has not written yet is skipped)."""
        for worker_id in worker_ids:
            path = self._directory / f"{worker_id}{LOG_SUFFIX}"
            if not path.is_file():
                continue
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = _complete(handle.read())
            if data:
                self._offsets[path] = offset + len(data)
                log = self.logs.setdefault(worker_id, WorkerLog())
                acks, sent, events = len(log.acks), len(log.acking), len(log.events)
                log.add(data.decode())
                self.acknowledged.update(key for key, _ in log.acks[acks:])
                self.sent.update(key for key, _ in log.acking[sent:])
                for at, word, key, _ in log.events[events:]:
                    if word == "claim":
                        self.claimers.setdefault(key, []).append((worker_id, at))


def read_logs(directory: Path) -> dict[str, WorkerLog]:
    """Every worker's log in ``directory``, by worker id."""
    return {
        path.name.removesuffix(LOG_SUFFIX): read_log(path)
        for path in sorted(directory.glob(f"*{LOG_SUFFIX}"))
    }


def acknowledged_keys(logs: dict[str, WorkerLog]) -> set[str]:
    return {key for log in logs.values() for key, _ in log.acks}


def accepted_per_key(logs: dict[str, WorkerLog]) -> Counter[str]:
    return Counter(key for log in logs.values() for key, _ in log.acks)
