"""What one benchmark worker process does: open its own connection, wait, drain the queue.

Each worker records, per job, the time from the start of its claim to the commit of its
acknowledgement, and returns those figures to the parent through a queue. Connections are
opened inside the worker process, never inherited.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

from crashqueuelab.core.models import Acknowledgement
from crashqueuelab.core.queue import DurableQueue
from crashqueuelab.lab.bench import textbook

#: Barrier and result waits are bounded: a stuck worker fails the run instead of hanging it.
WAIT_TIMEOUT_S = 120.0
LEASE_US = 60_000_000


@dataclass(frozen=True)
class WorkerSpec:
    system: str
    database: str
    worker_index: int
    work_ms: float
    batch: int


@dataclass(frozen=True)
class WorkerReport:
    worker_index: int
    jobs: int
    latencies_us: list[int]
    started: float
    finished: float


def _work(milliseconds: float) -> None:
    if milliseconds > 0:
        time.sleep(milliseconds / 1000)


def _textbook(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float]:
    conn = textbook.connect(Path(spec.database))
    latencies: list[int] = []
    try:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = time.monotonic()
        while True:
            begin = time.monotonic()
            job_id = textbook.claim(conn, lease_until=1)
            if job_id is None:
                break
            _work(spec.work_ms)
            textbook.complete(conn, job_id)
            latencies.append(int((time.monotonic() - begin) * 1e6))
    finally:
        conn.close()
    return latencies, started


def _single(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float]:
    worker_id = f"bench-{spec.worker_index}"
    latencies: list[int] = []
    with DurableQueue(spec.database, create=False) as queue:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = time.monotonic()
        while True:
            begin = time.monotonic()
            claimed = queue.claim(worker_id=worker_id, lease_duration_us=LEASE_US)
            if claimed is None:
                break
            _work(spec.work_ms)
            queue.succeed(
                job_id=claimed.job.job_id, worker_id=worker_id, lease_token=claimed.lease_token
            )
            latencies.append(int((time.monotonic() - begin) * 1e6))
    return latencies, started


def _batched(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float]:
    worker_id = f"bench-{spec.worker_index}"
    latencies: list[int] = []
    with DurableQueue(spec.database, create=False) as queue:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = time.monotonic()
        while True:
            begin = time.monotonic()
            claimed = queue.claim_many(
                worker_id=worker_id, lease_duration_us=LEASE_US, limit=spec.batch
            )
            if not claimed:
                break
            for _ in claimed:
                _work(spec.work_ms)
            queue.succeed_many(
                [Acknowledgement(c.job.job_id, worker_id, c.lease_token) for c in claimed]
            )
            elapsed = int((time.monotonic() - begin) * 1e6)
            latencies.extend([elapsed] * len(claimed))
    return latencies, started


RUNNERS = {
    "textbook": _textbook,
    "crashqueuelab-single": _single,
    "crashqueuelab-batched": _batched,
}


def run_worker(spec: WorkerSpec, barrier: Barrier, results: Queue[WorkerReport]) -> None:
    """Process entry point: drain the queue, then report."""
    latencies, started = RUNNERS[spec.system](spec, barrier)
    finished = time.monotonic()
    results.put(WorkerReport(spec.worker_index, len(latencies), latencies, started, finished))
