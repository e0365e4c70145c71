"""arq's own worker (``arq WorkerSettings``) in a real process on the test's Redis server:
what SIGTERM does to the job in hand (cancelled at once and put back, as arq documents), and
a job scheduled with ``enqueue_job(_defer_until=...)``."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from crashqueuelab.systems import JobSpec, JobStatus, OpenRequest, resolve_system
from tests.systems.libraries.served import lines, read, serving, wait_for


def submit(store: Path, key: str, max_attempts: int) -> None:
    from crashqueuelab.core.clock import ManualClock
    from crashqueuelab.core.ids import SeededIds
    from crashqueuelab.core.retry import RetryPolicy

    request = OpenRequest(
        store, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    client = resolve_system("arq").open(request)
    try:
        client.submit(JobSpec(key, "t", {}, max_attempts=max_attempts))
    finally:
        client.close()


def test_sigterm_cancels_the_job_in_hand_puts_it_back_and_the_next_worker_runs_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit(store, "a", max_attempts=2)
    with serving("arq", store, ledger, work_s=3.0) as worker:
        started = wait_for(ledger, "start", "a")
        termed = worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    # arq's handler cancels the job's task at once and the worker exits: the work (a
    # thread, which no cancellation reaches) ends with the process.
    assert code == 0
    assert exited - termed < 2.0
    assert [line.what for line in lines(ledger)] == ["start", "exit"]
    job = read("arq", store).jobs["a"]
    # "will remain in the queue to be run again": its try counted.
    assert (job.native_state, job.attempts, job.status) == ("queued", 1, JobStatus.PENDING)
    with serving("arq", store, ledger, work_s=0.0):
        again = wait_for(ledger, "end", "a")
    assert again.pid != started.pid
    job = read("arq", store).jobs["a"]
    assert (job.native_state, job.attempts) == ("complete", 2)


def test_a_job_deferred_with_defer_until_runs_once_and_not_before_it_is_due(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit(store, "a", max_attempts=1)
    own = resolve_system("arq").own_worker
    assert own is not None
    assert own.schedule is not None
    with serving("arq", store, ledger, work_s=0.0):
        wait_for(ledger, "end", "a")
        due = time.time() + 1.0
        own.schedule(store, "s", due)
        assert read("arq", store).jobs["s"].native_state == "deferred"
        ran = wait_for(ledger, "end", "s")
        time.sleep(0.6)  # a second run would have started by now (arq polls every 0.5 s)
    runs = [line for line in lines(ledger) if (line.what, line.key) == ("start", "s")]
    assert len(runs) == 1
    assert runs[0].at >= due
    assert ran.at - due < 3.0
    assert read("arq", store).jobs["s"].status is JobStatus.SUCCEEDED
