"""Where one worker's time goes on each path of the SQLite queue: a cProfile of a drain.

    python benchmarks/profile_paths.py [--path single|chained|batched] [--jobs 3000]
        [--batch 32] [--sync-off] [--no-profile] [--wal-pages] [--unordered-ids] [--top 25]

Fills a fresh store (under the system temp directory) and drains it through the lab's
client, one worker, with cProfile on; prints jobs/s and the functions with the most time
of their own. ``--sync-off`` sets ``synchronous=OFF`` on the open connection after the
queue checked ``FULL`` (never possible through the queue's API): what is left is the CPU
cost of a transition, without its fsync. Profiling slows the run: ``--no-profile`` gives
the rate alone. ``--wal-pages`` also counts the pages the drain wrote to the WAL, per job
and by the b-tree each page belongs to (automatic checkpoints are turned off for the drain,
so the WAL keeps every frame).
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
from collections import Counter
from pathlib import Path

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.contract import ChainingClient, JobSpec, OpenRequest, QueueClient
from crashqueuelab.systems.sqlite import SqliteClient

LEASE_US = 60_000_000
#: A WAL frame is its page after a 24-byte header; the file starts with a 32-byte header.
FRAME_HEADER, WAL_HEADER = 24, 32


class UnorderedIds(RandomIds):
    """Job ids of 64 random bits and nothing else."""

    def job_id(self) -> str:
        return f"job-{secrets.token_hex(8)}"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("single", "chained", "batched"), default="single")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sync-off", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--wal-pages", action="store_true")
    parser.add_argument("--unordered-ids", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="cql-profile-"))
    try:
        request = OpenRequest(
            scratch / "store",
            SystemClock(),
            UnorderedIds() if args.unordered_ids else RandomIds(),
            RetryPolicy(),
        )
        client = resolve_system("sqlite").open(request)
        try:
            specs = [JobSpec(f"job-{n}", "profile", {"n": n}) for n in range(args.jobs)]
            for start in range(0, args.jobs, 500):
                client.submit_many(specs[start : start + 500])
            assert isinstance(client, SqliteClient)
            connection = client.queue.connection
            if args.sync_off:
                connection.execute("PRAGMA synchronous = OFF")
            if args.wal_pages:
                connection.execute("PRAGMA wal_autocheckpoint = 0")
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            profile = cProfile.Profile()
            started = time.perf_counter()
            if not args.no_profile:
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
    setting = "OFF" if args.sync_off else "FULL"
    how = "alone" if args.no_profile else "under the profiler"
    print(f"{args.path}, synchronous={setting}: {done} jobs in {elapsed:.2f} s,"
          f" {done / elapsed:,.0f} jobs/s {how}")  # fmt: skip
    if args.wal_pages:
        print(f"{written.total() / done:.2f} WAL pages written per job, by b-tree:")
        for tree, frames in written.most_common():
            print(f"  {frames / done:5.2f}  {tree}")
    if not args.no_profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
