"""RQ's own worker (``rq worker --with-scheduler``) in a real process on the test's Redis
server: what SIGTERM does to the job its work horse runs, and a job scheduled with
``enqueue_at``."""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

from crashqueuelab.systems import JobStatus, resolve_system
from tests.systems.libraries.served import lines, read, serving, submit, wait_for


def test_sigterm_lets_the_horse_finish_the_job_in_hand_and_the_worker_exits_by_itself(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("rq", store, "a")
    with serving("rq", store, ledger, work_s=1.5) as worker:
        started = wait_for(ledger, "start", "a")
        # The horse RQ forked runs the job, not the worker.
        assert started.pid != worker.process.pid
        termed = worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    assert code == 0
    ended = wait_for(ledger, "end", "a", timeout_s=0)
    # Warm shutdown: the job in hand ran to its end after SIGTERM, then the worker exited.
    assert termed < ended.at <= exited
    assert [line.what for line in lines(ledger)] == ["start", "end", "exit"]
    assert read("rq", store).jobs["a"].status is JobStatus.SUCCEEDED


def test_a_job_scheduled_with_enqueue_at_runs_once_and_not_before_it_is_due(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("rq", store, "a")  # the store, opened by the adapter as the lab does
    own = resolve_system("rq").own_worker
    assert own is not None
    assert own.schedule is not None
    with serving("rq", store, ledger, work_s=0.0) as worker:
        wait_for(ledger, "end", "a")
        # RQ keeps whole seconds: a due time on a whole second is the one it keeps.
        due = math.ceil(time.time()) + 1.0
        own.schedule(store, "s", due)
        assert read("rq", store).jobs["s"].status is JobStatus.PENDING
        ran = wait_for(ledger, "end", "s")
        worker.signal(signal.SIGTERM)
        code, _ = worker.join()
    assert code == 0
    runs = [line for line in lines(ledger) if (line.what, line.key) == ("start", "s")]
    assert len(runs) == 1
    assert runs[0].at >= due
    assert ran.at - due < 5.0
    assert read("rq", store).jobs["s"].status is JobStatus.SUCCEEDED
