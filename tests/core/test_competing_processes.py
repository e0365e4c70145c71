"""Competing processes: released together through a barrier, each job is claimed exactly
once; and a carrier of other processes' claims killed before its commit."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.process
import os
from collections import Counter
from pathlib import Path

from crashqueuelab import DurableQueue, JobState, ManualClock
from crashqueuelab.core import requestslots
from crashqueuelab.core.requestslots import SlotState
from crashqueuelab.core.turns import TurnLock
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from crashqueuelab.lab.faults.hooks import CRASH_EXIT_CODE
from tests.core.process_workers import (
    BARRIER_TIMEOUT_S,
    carry_and_die,
    claim_one,
    claim_until_empty,
)

PROCESSES = 8
JOBS = 240


def test_spawned_workers_claim_every_job_exactly_once(tmp_path: Path) -> None:
    database = tmp_path / "queue.sqlite"
    # Submission time lies in the past so the workers' system clocks see every job ready.
    with DurableQueue(database, clock=ManualClock(1)) as queue:
        submitted = {
            queue.submit(idempotency_key=f"k{i}", job_type="t", payload={"i": i}).job.job_id
            for i in range(JOBS)
        }
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    records = [tmp_path / f"worker-{n}.json" for n in range(PROCESSES)]
    workers = [
        context.Process(
            target=claim_until_empty, args=(str(database), f"worker-{n}", barrier, str(record))
        )
        for n, record in enumerate(records)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=BARRIER_TIMEOUT_S * 2)
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join()
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    claims = [claim for record in records for claim in json.loads(record.read_text())]
    per_job = Counter(claim["job_id"] for claim in claims)
    assert set(per_job) == submitted
    assert set(per_job.values()) == {1}
    assert len({claim["token"] for claim in claims}) == JOBS
    with DurableQueue(database, create=False) as queue:
        assert queue.counts()[JobState.SUCCEEDED] == JOBS
        assert all(len(queue.attempts(job_id)) == 1 for job_id in submitted)
    assert check_database(database).ok
    assert replay_database(database).ok


def test_a_carrier_killed_before_its_commit_leaves_every_carried_claim_to_its_writer(
    tmp_path: Path,
) -> None:
    database = tmp_path / "queue.sqlite"
    with DurableQueue(database, clock=ManualClock(1)) as queue:
        for i in range(4):
            queue.submit(idempotency_key=f"k{i}", job_type="t", payload={"i": i})
    sidecar = os.open(f"{database}-turns", os.O_RDONLY)
    line = TurnLock(Path(f"{database}-turns"))
    context = multiprocessing.get_context("spawn")
    records = {name: tmp_path / f"{name}.json" for name in ("carrier", "f1", "f2", "f3")}
    processes: list[multiprocessing.process.BaseProcess] = []

    def start(name: str) -> None:
        target = carry_and_die if name == "carrier" else claim_one
        in_line = context.Event()
        process = context.Process(
            target=target, args=(str(database), name, str(records[name]), in_line)
        )
        process.start()
        processes.append(process)
        assert in_line.wait(BARRIER_TIMEOUT_S), f"{name} never took its ticket"

    try:
        # This test holds the line; the carrier queues behind it, the followers behind the
        # carrier and post their claims; then the line moves and the carrier takes them.
        first = line.acquire(timeout_s=BARRIER_TIMEOUT_S)
        for name in ("carrier", "f1", "f2", "f3"):
            start(name)
        posted = range(first + 2, first + 5)
        assert all(
            requestslots.read_header(sidecar, ticket).state is SlotState.POSTED for ticket in posted
        )
        line.release(first)
        for process in processes:
            process.join(timeout=BARRIER_TIMEOUT_S)
        assert [process.exitcode for process in processes] == [CRASH_EXIT_CODE, 0, 0, 0]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        line.close()
        os.close(sidecar)
    # When it died, the carrier had taken the three claims and run them in its
    # transaction (each noted a row as its result);
    slots = {
        ticket: (state, result)
        for ticket, state, result in json.loads(records["carrier"].read_text())
    }
    assert all(slots[ticket][0] == "TAKEN" and slots[ticket][1] > 0 for ticket in posted)
    claims = [json.loads(records[name].read_text()) for name in ("f1", "f2", "f3")]
    # its transaction died with it: each follower found its claim not committed and ran it
    # once itself.
    assert len({claim["job_id"] for claim in claims}) == 3
    with DurableQueue(database, create=False) as queue:
        assert queue.counts()[JobState.LEASED] == 3
        assert queue.counts()[JobState.QUEUED] == 1
        for claim in claims:
            assert [attempt.lease_token for attempt in queue.attempts(claim["job_id"])] == [
                claim["token"]
            ]
    assert check_database(database).ok
    assert replay_database(database).ok
