"""Competing processes: released together through a barrier, each job is claimed exactly once."""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter
from pathlib import Path

from crashqueuelab import DurableQueue, JobState, ManualClock
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from tests.process_workers import BARRIER_TIMEOUT_S, claim_until_empty

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
