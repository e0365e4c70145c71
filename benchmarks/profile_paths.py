"""Where one worker's time goes on each path of the SQLite queue: a cProfile of a drain.

    python benchmarks/profile_paths.py [--path single|chained|batched] [--jobs 3000]
        [--batch 32] [--sync-off] [--no-profile] [--wal-pages] [--statements]
        [--unordered-ids] [--top 25]

Fills a fresh store (under the system temp directory) and drains it through the lab's
client, one worker, with cProfile on; prints jobs/s and the functions with the most time
of their own. ``--sync-off`` sets ``synchronous=OFF`` on the open connection after the
queue checked ``FULL`` (never possible through the queue's API): what is left is the CPU
cost of a transition, without its fsync. Profiling slows the run: ``--no-profile`` gives
the rate alone. ``--wal-pages`` also counts the pages the drain wrote to the WAL, per job
and by the b-tree each page belongs to (automatic checkpoints are turned off for the drain,
so the WAL keeps every frame).
``--statements`` times every SQL statement the drain runs (wall time per job, rows of a
SELECT included) through a connection that measures each call; it implies ``--no-profile``.
``--unordered-ids`` submits the jobs with purely random ids (what the queue made before
its ids began with their time), to see what id order does to the pages a commit writes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import secrets
import shutil
import sqlite3
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.contract import ChainingClient, JobSpec, OpenRequest, QueueClient
from crashqueuelab.systems.sqlite import SqliteClient, open_sqlite

LEASE_US = 60_000_000
#: A WAL frame is its page after a 24-byte header; the file starts with a 32-byte header.
FRAME_HEADER, WAL_HEADER = 24, 32


class UnorderedIds(RandomIds):
    """Job ids of 64 random bits and nothing else."""

    def job_id(self) -> str:
        return f"job-{secrets.token_hex(8)}"


class FetchedRows:
    """A statement's rows, all fetched while the clock ran, with the cursor's row count."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows, self.rowcount = rows, rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)


class TimedConnection:
    """The queue's connection, adding each statement's wall time to ``spent`` (by its verb,
    its table and whether it picks the next job)."""

    def __init__(self, connection: sqlite3.Connection, spent: defaultdict[str, float]) -> None:
        self._connection, self.spent = connection, spent

    @staticmethod
    def _name(sql: str) -> str:
        words = sql.split()
        table = next((words[at + 1] for at, word in enumerate(words[:-1]) if word in
                      ("INTO", "UPDATE", "FROM")), "")  # fmt: skip
        # A statement that names its rows in a WITH clause is known by what it does to them.
        verb = words[0]
        if verb == "WITH":
            verb = next((word for word in words if word in ("INSERT", "UPDATE")), verb)
        rows = " (rows)" if "), (" in sql else ""
        return f"{verb} {table}{' (next job)' if 'LIMIT' in sql else ''}{rows}".strip()

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> FetchedRows:
        started = time.perf_counter()
        cursor = self._connection.execute(sql, parameters)
        rows = FetchedRows(cursor.fetchall(), cursor.rowcount)
        self.spent[self._name(sql)] += time.perf_counter() - started
        return rows

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        started = time.perf_counter()
        cursor = self._connection.executemany(sql, rows)
        self.spent[f"{self._name(sql)} (many)"] += time.perf_counter() - started
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def timed_queue(spent: defaultdict[str, float]) -> type[DurableQueue]:
    """A ``DurableQueue`` whose statements go through a ``TimedConnection``."""

    class TimedQueue(DurableQueue):
        @property
        def connection(self) -> Any:
            return TimedConnection(super().connection, spent)

    return TimedQueue


def print_statements(spent: Mapping[str, float], jobs: int) -> None:
    """The SQL time per job of ``jobs`` jobs, in all and by statement, longest first."""
    print(f"SQL statements: {sum(spent.values()) / jobs * 1e6:.1f} us per job, by statement:")
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {seconds / jobs * 1e6:7.2f} us  {name}")


def pages_by_tree(connection: sqlite3.Connection, wal: Path) -> Counter[str]:
    """The frames of ``wal``, counted by the b-tree that owns each page at the end.

    SQLite's ``dbstat`` table names the owner; a page freed during the drain and reused by
    another b-tree counts for its last owner, so the split is close, not exact.
    """
    data = wal.read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    owners = {
        int(page): str(name) for name, page in connection.execute("SELECT name, pageno FROM dbstat")
    }
    frames: Counter[str] = Counter()
    for at in range(WAL_HEADER, len(data) - FRAME_HEADER + 1, FRAME_HEADER + page_size):
        page = int.from_bytes(data[at : at + 4], "big")
        frames[owners.get(page, "(free)")] += 1
    return frames


def drain(client: QueueClient, path: str, batch: int) -> int:
    done = 0
    if path == "batched":
        while claims := client.claim_many("profile", LEASE_US, batch):
            client.succeed_many(claims)
            done += len(claims)
    elif path == "chained":
        assert isinstance(client, ChainingClient)
        claim = client.claim("profile", LEASE_US)
        while claim is not None:
            _, claim = client.succeed_and_claim(claim, LEASE_US)
            done += 1
    else:
        while (one := client.claim("profile", LEASE_US)) is not None:
            client.succeed(one)
            done += 1
    return done


def report(
    args: argparse.Namespace,
    done: int,
    elapsed: float,
    written: Counter[str],
    spent: defaultdict[str, float],
    profile: cProfile.Profile,
) -> None:
    setting = "OFF" if args.sync_off else "FULL"
    how = "under the profiler"
    if args.no_profile or args.statements:
        how = "statements timed" if args.statements else "alone"
    print(f"{args.path}, synchronous={setting}: {done} jobs in {elapsed:.2f} s,"
          f" {done / elapsed:,.0f} jobs/s {how}")  # fmt: skip
    if args.wal_pages:
        print(f"{written.total() / done:.2f} WAL pages written per job, by b-tree:")
        for tree, frames in written.most_common():
            print(f"  {frames / done:5.2f}  {tree}")
    if args.statements:
        print_statements(spent, done)
    if not (args.no_profile or args.statements):
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("single", "chained", "batched"), default="single")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sync-off", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--wal-pages", action="store_true")
    parser.add_argument("--statements", action="store_true")
    parser.add_argument("--unordered-ids", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    spent: defaultdict[str, float] = defaultdict(float)
    scratch = Path(tempfile.mkdtemp(prefix="cql-profile-"))
    try:
        request = OpenRequest(
            scratch / "store",
            SystemClock(),
            UnorderedIds() if args.unordered_ids else RandomIds(),
            RetryPolicy(),
        )
        client = (
            open_sqlite(request, timed_queue(spent))
            if args.statements
            else resolve_system("sqlite").open(request)
        )
        try:
            specs = [JobSpec(f"job-{n}", "profile", {"n": n}) for n in range(args.jobs)]
            for start in range(0, args.jobs, 500):
                client.submit_many(specs[start : start + 500])
            assert isinstance(client, SqliteClient)
            spent.clear()
            connection = client.queue.connection
            if args.sync_off:
                connection.execute("PRAGMA synchronous = OFF")
            if args.wal_pages:
                connection.execute("PRAGMA wal_autocheckpoint = 0")
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            profile = cProfile.Profile()
            started = time.perf_counter()
            if not (args.no_profile or args.statements):
                profile.enable()
            done = drain(client, args.path, args.batch)
            profile.disable()
            elapsed = time.perf_counter() - started
            written: Counter[str] = Counter()
            if args.wal_pages:
                written = pages_by_tree(connection, Path(f"{client.queue.path}-wal"))
        finally:
            client.close()
    finally:
        shutil.rmtree(scratch)
    report(args, done, elapsed, written, spent, profile)


if __name__ == "__main__":
    main()
