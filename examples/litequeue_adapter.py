"""litequeue (https://pypi.org/project/litequeue/), a queue on one SQLite file, put under
crashqueuelab from its public API: the second walk-through of docs/systems.md, for a library
the lab does not ship. Run it with ``crashqueuelab campaign --system
litequeue_adapter:litequeue_system`` (with this directory on PYTHONPATH).

litequeue stores messages (``put``), hands the oldest ready one out and marks it ``LOCKED``
(``pop``), and lets anyone mark a message ``DONE`` or ``FAILED`` by its id (``done``,
``mark_failed``). A message locked for too long is found with ``list_locked(threshold_seconds)``
and made ready again with ``retry``. It has no idempotency keys, no attempt count, no lease
per claim, no token and no heartbeat. What the contract needs and litequeue lacks, this
adapter keeps beside litequeue's table in the same file, written by SQLite triggers in
litequeue's own transactions ("Since it's all based on SQLite / SQL, it is easily
extendable", its README): a key per message, its attempt limit and the number of times it
was popped. It adds no lease and no fencing: those verdicts are litequeue's.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import litequeue

from crashqueuelab.core.errors import OperationUnsupported
from crashqueuelab.systems import (
    Capabilities,
    Claim,
    CrashPoint,
    ExpectedState,
    JobSpec,
    JobStatus,
    JobView,
    Kind,
    OpenRequest,
    StoredJob,
    StoreReading,
    System,
    Verdict,
)
from crashqueuelab.systems.boundary import OneAtATime, around
from crashqueuelab.systems.contract import Documented

T = TypeVar("T")
FILE = "litequeue.sqlite"
#: The example's queue is named (litequeue's ``queue_name``), as a user with several queues
#: in one file names them.
QUEUE_NAME = "jobs"
#: The sweep (``recover``) makes ready again a message locked for more than this: litequeue
#: has one threshold per sweep, not a lease per claim. It is the lab's lease (5 s).
LOCK_TIMEOUT_S = 5.0
READY, LOCKED, DONE, FAILED = "READY", "LOCKED", "DONE", "FAILED"
NATIVE = {0: READY, 1: LOCKED, 2: DONE, 3: FAILED}
PRUNED = "pruned"  # a DONE message that litequeue's prune() deleted
STATUS = {
    READY: JobStatus.PENDING,
    LOCKED: JobStatus.LEASED,
    DONE: JobStatus.SUCCEEDED,
    PRUNED: JobStatus.SUCCEEDED,
    FAILED: JobStatus.DEAD,
}
RELEASE = f"https://pypi.org/project/litequeue/{litequeue.__version__}/"

# The adapter's table and triggers: they run inside litequeue's own statements, so a pop
# counts its attempt and a prune records what it deleted in the same commit.
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS lab_keys (
        key TEXT PRIMARY KEY,
        message_id TEXT NOT NULL UNIQUE,
        max_attempts INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        deleted_status INTEGER)""",
    f"""CREATE TRIGGER IF NOT EXISTS lab_count_attempt AFTER UPDATE OF status ON [{QUEUE_NAME}]
    WHEN NEW.status = 1 AND OLD.status = 0 BEGIN
        UPDATE lab_keys SET attempts = attempts + 1 WHERE message_id = NEW.message_id;
    END""",
    f"""CREATE TRIGGER IF NOT EXISTS lab_note_deletion AFTER DELETE ON [{QUEUE_NAME}] BEGIN
        UPDATE lab_keys SET deleted_status = OLD.status WHERE message_id = OLD.message_id;
    END""",
)

# litequeue reads the time from its module's ``time_ns`` (its comment: "Expose function used
# by uuid7() to get current time"), one for the whole process: the client sets it to its own
# clock for each call, under one lock, and says concurrent_stores=False.
_PROCESS_WIDE = threading.RLock()


class LiteQueueClient(OneAtATime):
    def __init__(self, request: OpenRequest) -> None:
        request.directory.mkdir(parents=True, exist_ok=True)
        self.clock, self.hook = request.clock, request.hook
        with _PROCESS_WIDE:
            self.queue = litequeue.LiteQueue(str(request.directory / FILE), queue_name=QUEUE_NAME)
            with self.queue.transaction("IMMEDIATE"):
                for statement in SCHEMA:
                    self.queue.conn.execute(statement)

    def _now_ns(self) -> int:
        return self.clock.now_us() * 1000

    def _call(self, name: str, call: Callable[..., T], *args: object) -> T:
        # A crash point on each side of the library call (docs/systems.md, the checklist).
        with self._own_clock():
            return around(self.hook, name, partial(call, *args))

    def _read(self, call: Callable[..., T], *args: object) -> T:
        with self._own_clock():
            return call(*args)

    @contextmanager
    def _own_clock(self) -> Iterator[None]:
        with _PROCESS_WIDE:
            litequeue.time_ns = self._now_ns
            yield

    def _key_row(self, column: str, value: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.queue.conn.execute(
            f"SELECT * FROM lab_keys WHERE {column} = ?", (value,)
        ).fetchone()
        return row

    def submit(self, job: JobSpec) -> str:
        return self._call("put", self._put, job)

    def _put(self, job: JobSpec) -> str:
        # litequeue has no keys: one transaction looks the key up and puts the message.
        with self.queue.transaction("IMMEDIATE"):
            known = self._key_row("key", job.key)
            if known is not None:
                return str(known["message_id"])
            data = {"key": job.key, "type": job.job_type, "payload": job.payload}
            message = self.queue.put(json.dumps(data, sort_keys=True))
            self.queue.conn.execute(
                "INSERT INTO lab_keys (key, message_id, max_attempts) VALUES (?, ?, ?)",
                (job.key, message.message_id, job.max_attempts),
            )
            return str(message.message_id)

    def submit_many(self, jobs: Sequence[JobSpec]) -> list[str]:
        return [self.submit(job) for job in jobs]

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        message = self._call("pop", self.queue.pop)
        if message is None:
            return None
        data = json.loads(message.data)
        row = self._read(self._key_row, "message_id", message.message_id)
        attempt = 0 if row is None else int(row["attempts"])
        return Claim(
            job_id=message.message_id, key=data["key"], job_type=data["type"],
            payload=data["payload"], attempt=attempt, worker_id=worker_id,
            token=f"{message.message_id}/{attempt}",
        )  # fmt: skip

    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise OperationUnsupported("litequeue", "heartbeat")

    def succeed(self, claim: Claim) -> Verdict:
        # done() marks the message whoever asks, and answers nothing that says otherwise.
        self._call("done", self.queue.done, claim.job_id)
        return Verdict.SUCCEEDED

    def fail(self, claim: Claim, error: str) -> Verdict:
        # litequeue has no attempt limit: the adapter's count (not the claim's) decides
        # between retry (ready again at once: litequeue has no retry delay) and mark_failed.
        if self._read(self._used_up, claim.job_id):
            self._call("mark_failed", self.queue.mark_failed, claim.job_id)
            return Verdict.DEAD
        self._call("retry", self.queue.retry, claim.job_id)
        return Verdict.RETRY

    def _used_up(self, message_id: str) -> bool:
        row = self._key_row("message_id", message_id)
        return row is None or row["attempts"] >= row["max_attempts"]

    def recover(self) -> int:
        return self._call("sweep", self._sweep)

    def _sweep(self) -> int:
        # litequeue's recovery: list_locked, then retry (or mark_failed at the attempt
        # limit), in one transaction so that no done() lands between the two.
        with self.queue.transaction("IMMEDIATE"):
            stuck = list(self.queue.list_locked(LOCK_TIMEOUT_S))
            for message in stuck:
                if self._used_up(message.message_id):
                    self.queue.mark_failed(message.message_id)
                else:
                    self.queue.retry(message.message_id)
        return len(stuck)

    def checkpoint(self) -> None:
        # litequeue's compaction: prune() deletes finished messages (the trigger notes them).
        self._call("prune", self.queue.prune, False)

    def job(self, key: str) -> JobView | None:
        return self._read(self._job, key)

    def _job(self, key: str) -> JobView | None:
        row = self._key_row("key", key)
        if row is None:
            return None
        message = self.queue.get(row["message_id"])
        if message is not None:
            native = NATIVE[int(message.status)]
        elif row["deleted_status"] == 2:
            native = PRUNED
        else:
            return None  # gone without litequeue's prune: lost
        return JobView(key, STATUS[native], int(row["attempts"]), native)

    def active_count(self) -> int:
        return int(self._read(self.queue.qsize))

    def close(self) -> None:
        self.queue.close()


def read_store(directory: Path) -> StoreReading:
    """The independent reader: litequeue's table and the adapter's, read with the stdlib's
    sqlite3 in read-only mode, never with litequeue's code."""
    path = directory / FILE
    judge = "litequeue_adapter.read_store (sqlite3, read-only)"
    if not path.exists():
        checks = {"integrity_check": True, "invariants": True}
        return StoreReading(False, {}, {}, True, (), judge, checks=checks)
    connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        integrity = connection.execute("PRAGMA integrity_check").fetchone()[0]
        # A process killed while opening a new store may leave litequeue's table without
        # the adapter's (or neither): both read as empty.
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        keys = connection.execute(
            "SELECT key, message_id, max_attempts, attempts, deleted_status FROM lab_keys"
        ).fetchall() if "lab_keys" in tables else []  # fmt: skip
        messages = dict(
            connection.execute(f"SELECT message_id, status FROM [{QUEUE_NAME}]").fetchall()
            if QUEUE_NAME in tables
            else []
        )
    finally:
        connection.close()
    jobs, problems = _judge(keys, messages)
    checks = {"integrity_check": integrity == "ok", "invariants": not problems}
    if integrity != "ok":
        problems.append(f"integrity_check: {integrity}")
    return StoreReading(True, jobs, {}, not problems, tuple(problems), judge, checks=checks)


def _judge(
    keys: list[tuple[Any, ...]], messages: dict[str, int]
) -> tuple[dict[str, StoredJob], list[str]]:
    jobs: dict[str, StoredJob] = {}
    problems: list[str] = []
    for key, message_id, max_attempts, attempts, deleted_status in keys:
        status = messages.pop(message_id, None)
        if status is None and deleted_status != 2:
            problems.append(f"job {key}: its message {message_id} is gone (lost)")
            continue
        native = PRUNED if status is None else NATIVE.get(status, f"status {status}")
        if native not in STATUS:
            problems.append(f"job {key}: unknown litequeue status {status}")
            continue
        if attempts > max_attempts:
            problems.append(f"job {key}: {attempts} attempts of at most {max_attempts}")
        if attempts == 0 and native != READY:
            problems.append(f"job {key}: {native} but never popped")
        jobs[key] = StoredJob(native, STATUS[native], attempts)
    problems.extend(f"message {message_id}: no job names it" for message_id in messages)
    return jobs, problems


def point(name: str, effect: tuple[str, int] | None, flaky: tuple[str, int] | None,
          effects: int) -> CrashPoint:  # fmt: skip
    return CrashPoint(name, f"litequeue around {name}", ExpectedState(effect, flaky, effects))


# The durable state after each point's first occurrence in the lab's workload, in litequeue's
# words (docs/systems.md, "What the lab does with an adapter"). No heartbeat; a failed
# attempt is ready again at once (litequeue has no retry delay).
NEW, TAKEN, FINISHED = (READY, 0), (LOCKED, 1), (DONE, 1)
CRASH_POINTS = (
    point("put:before", None, None, 0),
    point("put:after", NEW, None, 0),
    point("pop:before", NEW, NEW, 0),
    point("pop:after", TAKEN, NEW, 0),
    point("BEFORE_EFFECT_COMMIT", TAKEN, NEW, 0),
    point("AFTER_EFFECT_COMMIT", TAKEN, NEW, 1),
    point("done:before", TAKEN, NEW, 1),
    point("done:after", FINISHED, NEW, 1),
    point("retry:before", FINISHED, TAKEN, 1),
    point("retry:after", FINISHED, (READY, 1), 1),
    point("sweep:before", FINISHED, (READY, 1), 1),
    point("sweep:after", FINISHED, (READY, 1), 1),
    point("prune:before", FINISHED, (LOCKED, 2), 1),
    point("prune:after", (PRUNED, 1), (LOCKED, 2), 1),
)
CAPABILITIES = Capabilities(
    fencing_tokens=False, heartbeats=False, several_processes=True, batching=False,
    single_owner=False, checkpoint=True, concurrent_stores=False,
)  # fmt: skip
# What litequeue's own documentation says it does not do, quoted; it names the kinds of
# finding that follow from it (docs/systems.md lists them), and no other.
NO_FENCING = Documented(
    what="No lease and no fencing: done(message_id) and mark_failed(message_id) mark the "
    "message whoever calls them and whenever; litequeue hands out no token and keeps no "
    "deadline, so a late or stale acknowledgement or failure report is accepted",
    source=f'{RELEASE}: the README ("the api to set a message as **done** lets you specifiy '
    'the `message_id` to be set as done") and LiteQueue.done ("If executed multiple times, '
    '`done_time` will be the last time this function is called.")',
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
    ),
    when={
        # A stale failure report marks a message its new holder had acknowledged FAILED.
        Kind.STORE_DIFFERS: {"told": "succeeded", "stored": "dead"},
        # The contract's rules (the pytest plugin): a second done() and one at the lab's
        # deadline mark the message, as any done() does.
        Kind.CONTRACT_RULE_FAILED: (
            {
                "point": "the_live_holder_acknowledges_once",
                "assertion": "a second acknowledgement of the same lease answered succeeded*",
            },
            {
                "point": "an_acknowledgement_at_the_deadline_is_refused",
                "assertion": "* answered succeeded*",
            },
        ),
    },
)
# litequeue's own clock: how long a message has been locked is measured with time_ns().
WALL_CLOCK_LOCKS = Documented(
    what="A locked message is ready again only once a sweep finds it locked for longer than "
    "its threshold, counted on litequeue's own clock (the wall clock, time_ns()), so a "
    "lease that ran out on the caller's clock frees nothing until that much real time passed",
    source=f'{RELEASE}: LiteQueue.list_locked ("Return all the tasks that have been in the '
    '`LOCKED` state for more than `threshold_seconds` seconds.")',
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
            "assertion": "* found nothing to claim",
        },
    },
)
# litequeue has no delay: retry() makes the message ready at once.
RETRY_AT_ONCE = Documented(
    what="No retry delay: retry(message_id) makes a message ready again at once, so a failed "
    "message can be taken again before the delay the lab's contract asks for",
    source=f'{RELEASE}: LiteQueue.retry ("Mark a locked message as free again.")',
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's"
            " delay has not passed",
        },
    },
)
DOCUMENTED = (NO_FENCING, WALL_CLOCK_LOCKS, RETRY_AT_ONCE)


def litequeue_system() -> System:
    return System(
        name="litequeue",
        version=f"litequeue {litequeue.__version__} (SQLite {sqlite3.sqlite_version})",
        durability="SQLite WAL, synchronous=NORMAL (litequeue's own pragmas)",
        capabilities=CAPABILITIES,
        crash_points=CRASH_POINTS,
        open=LiteQueueClient,
        reader=read_store,
        documented=DOCUMENTED,
        distribution="litequeue",
        recovery_s=LOCK_TIMEOUT_S,
    )
