"""Where the time of a contended turn goes: N processes draining one DurableQueue file.

    python benchmarks/contention_profile.py [--workers 16] [--work-ms 1] [--jobs 3000]
        [--statements]
    strace -f -c -o counts.txt python benchmarks/contention_profile.py --workers 16

Fills a fresh store (under the system temp directory) and starts ``--workers`` spawned
processes that each claim a job, sleep ``--work-ms`` and succeed it until none is left.
Each process times every turn at the write lock (from the moment its ticket is served to
the moment it finishes the turn, which also carries the requests of the writers waiting
behind it: group commit), counts the requests its turns carried, and its own CPU time;
the parent prints jobs/s, the turns' mean and percentiles, the CPU spent per job, and,
over the window from the first turn to the last (process start-up left out), the share of
it the lock was held and the hand-over gaps between one turn's end and the next turn's
start (the clock is the system-wide monotonic one, so the processes' times compare).
``--statements`` also times every SQL statement the workers run (profile_paths.py's timing
connection) and prints the time per job of each, summed over the workers. Run under
``strace -f -c`` it also shows which system calls the waiting costs.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEASE_US = 60_000_000


@dataclass(frozen=True)
class WorkerFigures:
    jobs: int
    #: (served, released) of each turn, in seconds of the system-wide monotonic clock.
    turns: list[tuple[float, float]]
    cpu_s: float
    #: Seconds spent in each kind of SQL statement (with ``--statements``).
    statements: dict[str, float]
    #: Other writers' requests this worker's turns carried (group commit).
    carried: int


def _drain(path: Path, work_s: float, timed: bool, results: Any) -> None:
    from crashqueuelab.core import turns
    from crashqueuelab.core.queue import DurableQueue

    spent: defaultdict[str, float] = defaultdict(float)
    queue_class = DurableQueue
    if timed:
        from profile_paths import timed_queue

        queue_class = timed_queue(spent)

    held: list[tuple[float, float]] = []
    served_at = [0.0]
    carried = [0]
    acquire, enter, finish = turns.TurnLock.acquire, turns.TurnLock.enter, turns.TurnLock.finish

    def timed_acquire(lock: turns.TurnLock, *, timeout_s: float) -> int:
        ticket = acquire(lock, timeout_s=timeout_s)
        served_at[0] = time.perf_counter()
        return ticket

    def timed_enter(
        lock: turns.TurnLock, request: Callable[[], bytes], *, timeout_s: float
    ) -> turns.Served | turns.Carried:
        entry = enter(lock, request, timeout_s=timeout_s)
        if isinstance(entry, turns.Served):
            served_at[0] = time.perf_counter()
        return entry

    def timed_finish(
        lock: turns.TurnLock, ticket: int, behind: list[int], *, timeout_s: float
    ) -> None:
        finish(lock, ticket, behind, timeout_s=timeout_s)
        held.append((served_at[0], time.perf_counter()))
        carried[0] += len(behind)

    # Only this spawned child's class is wrapped; the parent's is untouched. A turn starts
    # when ``acquire`` or ``enter`` returns it and ends in ``finish``, which also carries
    # the requests of the writers waiting behind it.
    setattr(turns.TurnLock, "acquire", timed_acquire)  # noqa: B010
    setattr(turns.TurnLock, "enter", timed_enter)  # noqa: B010
    setattr(turns.TurnLock, "finish", timed_finish)  # noqa: B010
    worker = f"w{os.getpid()}"
    done = 0
    with queue_class(path) as queue:
        started = time.process_time()
        while (claimed := queue.claim(worker_id=worker, lease_duration_us=LEASE_US)) is not None:
            time.sleep(work_s)
            queue.succeed(
                job_id=claimed.job.job_id, worker_id=worker, lease_token=claimed.lease_token
            )
            done += 1
        cpu = time.process_time() - started
    results.put(WorkerFigures(done, held, cpu, dict(spent), carried[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--statements", action="store_true")
    args = parser.parse_args()
    from crashqueuelab.core.queue import DurableQueue

    scratch = Path(tempfile.mkdtemp(prefix="cql-contention-"))
    try:
        path = scratch / "queue.sqlite"
        with DurableQueue(path) as queue:
            for start in range(0, args.jobs, 500):
                queue.submit_many(
                    [
                        {"idempotency_key": f"k{n}", "job_type": "profile", "payload": {"n": n}}
                        for n in range(start, min(start + 500, args.jobs))
                    ]
                )
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        workers = [
            context.Process(
                target=_drain, args=(path, args.work_ms / 1000, args.statements, results)
            )
            for _ in range(args.workers)
        ]
        for process in workers:
            process.start()
        started = time.perf_counter()
        figures = [results.get(timeout=600) for _ in workers]
        elapsed = time.perf_counter() - started
        for process in workers:
            process.join(timeout=60)
    finally:
        shutil.rmtree(scratch)
    jobs = sum(figure.jobs for figure in figures)
    spans = sorted(span for figure in figures for span in figure.turns)
    turns = sorted(released - served for served, released in spans)
    cuts = statistics.quantiles(turns, n=10)
    window = spans[-1][1] - spans[0][0]
    # A release is timed after the hand-over call returns, so the next turn may start a
    # little before it: such a gap counts as none.
    gaps = [max(0.0, after[0] - before[1]) for before, after in itertools.pairwise(spans)]
    gap_cuts = statistics.quantiles(gaps, n=10)
    print(
        f"{args.workers} workers, {args.work_ms:g} ms: {jobs / elapsed:,.0f} jobs/s"
        f" ({jobs / window:,.0f} over the window of turns);"
        f" {len(turns)} turns, held {statistics.fmean(turns) * 1e6:.0f} us on average"
        f" (p50 {cuts[4] * 1e6:.0f}, p90 {cuts[8] * 1e6:.0f});"
        f" lock held {sum(turns) / window:.0%} of the window;"
        f" hand-over gaps {statistics.fmean(gaps) * 1e6:.0f} us on average"
        f" (p50 {gap_cuts[4] * 1e6:.0f}, p90 {gap_cuts[8] * 1e6:.0f});"
        f" CPU {sum(figure.cpu_s for figure in figures) / jobs * 1e6:.0f} us per job;"
        f" {sum(figure.carried for figure in figures)} transitions carried in another"
        " writer's turn"
    )
    if args.statements:
        from profile_paths import print_statements

        spent: defaultdict[str, float] = defaultdict(float)
        for figure in figures:
            for name, seconds in figure.statements.items():
                spent[name] += seconds
        print_statements(spent, jobs)


if __name__ == "__main__":
    main()
