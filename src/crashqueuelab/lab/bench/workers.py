"""What one benchmark worker process does: open its own connection, wait, drain the queue.

Each worker records, per job, the time from the start of its claim to the commit of its
acknowledgement, and returns those figures to the parent through a queue. Connections are
opened inside the worker process, never inherited. A system under test is driven through
the contract alone, one job at a time (``single``) or in batches (``batched``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Protocol, cast

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.bench import textbook
from crashqueuelab.lab.bench.peers import resolve_peer
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import ignore_interrupts
from crashqueuelab.lab.workloads.batching import batch_sizer
from crashqueuelab.systems.contract import ChainingClient, OpenRequest, QueueClient
from crashqueuelab.systems.registry import resolve_system

#: Barrier and result waits are bounded: a stuck worker fails the run instead of hanging it.
WAIT_TIMEOUT_S = 120.0
LEASE_US = 60_000_000


@dataclass(frozen=True)
class WorkerSpec:
    #: "textbook", "peer", or how a system is driven: "single", "chained", "batched" or
    #: "batched-chained".
    path_kind: str
    #: The system's name or module:factory, or the peer's name (unused for the textbook).
    system: str
    #: The textbook database file, or the system's store directory.
    store: str
    worker_index: int
    work_ms: float
    #: Jobs per batch of the batched path; None lets each worker size its batches itself.
    batch: int | None
    #: The parent's import path and server environment.
    inherited: Inherited


def open_client(system: str, store: str) -> QueueClient:
    request = OpenRequest(Path(store), SystemClock(), RandomIds(), RetryPolicy())
    return resolve_system(system).open(request)


@dataclass(frozen=True)
class WorkerReport:
    worker_index: int
    jobs: int
    latencies_us: list[int]
    started: float
    finished: float
    #: What the system raised, when the worker could not drain the queue.
    error: str | None = None
    #: Claims that returned jobs (each a batch on the batched path).
    batches: int = 0
    largest_batch: int = 0


def _work(milliseconds: float) -> None:
    if milliseconds > 0:
        time.sleep(milliseconds / 1000)


def _textbook(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float, list[int]]:
    conn = textbook.connect(Path(spec.store))
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
    return latencies, started, []


class _ChainingQueueClient(QueueClient, ChainingClient, Protocol):
    """A system's client that also acknowledges and claims in one commit."""


def _open_chaining(spec: WorkerSpec) -> _ChainingQueueClient:
    """The system's client, refused (TypeError) unless it acknowledges and claims in one commit."""
    client = open_client(spec.system, spec.store)
    if not isinstance(client, ChainingClient):
        client.close()
        raise TypeError(f"{spec.system} cannot acknowledge and claim in one commit")
    return cast(_ChainingQueueClient, client)


def _chained(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float, list[int]]:
    """Drain a system's store one job at a time, each acknowledgement leasing the next job
    in the same commit (a ``ChainingClient``)."""
    worker_id = f"bench-{spec.worker_index}"
    latencies: list[int] = []
    client = _open_chaining(spec)
    try:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = begin = time.monotonic()
        claim = client.claim(worker_id, LEASE_US)
        while claim is not None:
            _work(spec.work_ms)
            # The next job's claim starts with this acknowledgement.
            next_begin = time.monotonic()
            _, claim = client.succeed_and_claim(claim, LEASE_US)
            latencies.append(int((time.monotonic() - begin) * 1e6))
            begin = next_begin
    finally:
        client.close()
    return latencies, started, []


def _system(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float, list[int]]:
    """Drain a system's store one job (``single``) or one batch (``batched``) at a time."""
    worker_id = f"bench-{spec.worker_index}"
    batched = spec.path_kind == "batched"
    sizer = batch_sizer(spec.batch)
    latencies: list[int] = []
    sizes: list[int] = []
    client = open_client(spec.system, spec.store)
    try:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = time.monotonic()
        while True:
            begin = time.monotonic()
            if batched:
                claims = client.claim_many(worker_id, LEASE_US, sizer.next_size())
            else:
                claim = client.claim(worker_id, LEASE_US)
                claims = [] if claim is None else [claim]
            if not claims:
                break
            claimed = time.monotonic()
            for _ in claims:
                _work(spec.work_ms)
            worked = time.monotonic()
            if batched:
                client.succeed_many(claims)
            else:
                client.succeed(claims[0])
            end = time.monotonic()
            sizer.observe(jobs=len(claims), work_s=worked - claimed)
            sizes.append(len(claims))
            # Every job of a batch waited for the whole batch.
            latencies.extend([int((end - begin) * 1e6)] * len(claims))
    finally:
        client.close()
    return latencies, started, sizes


def _batched_chained(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float, list[int]]:
    """Drain a system's store in batches, each acknowledgement leasing the next batch in
    the same commit (a ``ChainingClient``)."""
    worker_id = f"bench-{spec.worker_index}"
    sizer = batch_sizer(spec.batch)
    latencies: list[int] = []
    sizes: list[int] = []
    client = _open_chaining(spec)
    try:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = begin = time.monotonic()
        claims = client.claim_many(worker_id, LEASE_US, sizer.next_size())
        while claims:
            claimed = time.monotonic()
            for _ in claims:
                _work(spec.work_ms)
            worked = time.monotonic()
            sizer.observe(jobs=len(claims), work_s=worked - claimed)
            # The next batch's claim starts with this acknowledgement.
            _, following = client.succeed_many_and_claim(
                claims, worker_id, LEASE_US, sizer.next_size()
            )
            end = time.monotonic()
            sizes.append(len(claims))
            latencies.extend([int((end - begin) * 1e6)] * len(claims))
            claims, begin = following, worked
    finally:
        client.close()
    return latencies, started, sizes


def _peer(spec: WorkerSpec, barrier: Barrier) -> tuple[list[int], float, list[int]]:
    """Drain a peer library's store through its own calls, one job at a time."""
    latencies: list[int] = []
    queue = resolve_peer(spec.system).open(Path(spec.store))
    try:
        barrier.wait(timeout=WAIT_TIMEOUT_S)
        started = time.monotonic()
        while True:
            begin = time.monotonic()
            item = queue.take()
            if item is None:
                break
            _work(spec.work_ms)
            # A refused acknowledgement (a stale claim) finished nothing: not counted.
            if queue.done(item):
                latencies.append(int((time.monotonic() - begin) * 1e6))
    finally:
        queue.close()
    return latencies, started, []


RUNNERS = {
    "textbook": _textbook,
    "single": _system,
    "chained": _chained,
    "batched": _system,
    "batched-chained": _batched_chained,
    "peer": _peer,
}


def run_worker(spec: WorkerSpec, barrier: Barrier, results: Queue[WorkerReport]) -> None:
    """Process entry point: drain the queue, then report."""
    ignore_interrupts()
    spec.inherited.adopt()
    try:
        latencies, started, sizes = RUNNERS[spec.path_kind](spec, barrier)
    except Exception as error:  # the system failed: say so instead of leaving the parent waiting
        barrier.abort()
        results.put(
            WorkerReport(spec.worker_index, 0, [], 0.0, 0.0, f"{type(error).__name__}: {error}")
        )
        return
    finished = time.monotonic()
    results.put(
        WorkerReport(
            spec.worker_index,
            len(latencies),
            latencies,
            started,
            finished,
            batches=len(sizes),
            largest_batch=max(sizes, default=0),
        )
    )
