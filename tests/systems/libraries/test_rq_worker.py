"""RQ's own worker (``rq worker --with-scheduler``) in a real process on the test's Redis
server: what SIGTERM or SIGINT, a second one, and SIGKILL do to the job its work horse
runs, and a job scheduled with ``enqueue_at``."""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import pytest

from crashqueuelab.systems import JobStatus, resolve_system
from tests.systems.libraries.served import Served, lines, read, serving, submit, wait_for

#: How long RQ's worker may take to exit once its loop has ended. Its teardown unsubscribes
#: its pubsub thread (``run_in_thread(sleep_time=60)``), then stops it: redis-py 8.2's
#: ``PubSubWorkerThread.stop`` joins the thread with no timeout, and a thread that read the
#: unsubscribe reply before the stop flag was cleared waits up to ``sleep_time`` for a new
#: subscription (``get_message``) before it looks at the flag again. Measured: the worker
#: exits within 0.05 s, or 60.0 s later (2 of 8 runs of SIGTERM/SIGINT).
PUBSUB_WAIT_S = 60.0
EXIT_S = PUBSUB_WAIT_S + 10.0


def exits_by_itself(worker: Served, since: float) -> float:
    """How long after ``since`` the worker exited, by itself, with status 0: at once, or
    once its pubsub thread's wait ran out."""
    code, exited = worker.join(EXIT_S)
    assert code == 0
    took = exited - since
    assert took < 5.0 or PUBSUB_WAIT_S - 1.0 < took < PUBSUB_WAIT_S + 5.0, took
    return took


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_lets_the_horse_finish_the_job_in_hand_and_the_worker_exits(
    tmp_path: Path, redis_socket: str, signum: signal.Signals
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("rq", store, "a")
    with serving("rq", store, ledger, work_s=1.5) as worker:
        started = wait_for(ledger, "start", "a")
        # The horse RQ forked runs the job, not the worker.
        assert started.pid != worker.process.pid
        termed = worker.signal(signum)
        ended = wait_for(ledger, "end", "a")
        exits_by_itself(worker, ended.at)
    # Warm shutdown: the job in hand ran to its end after the signal, then the worker exited.
    assert termed < ended.at
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
    with serving("rq", store, ledger, work_s=0.0):
        wait_for(ledger, "end", "a")
        # RQ keeps whole seconds: a due time on a whole second is the one it keeps.
        due = math.ceil(time.time()) + 1.0
        own.schedule(store, "s", due)
        assert read("rq", store).jobs["s"].status is JobStatus.PENDING
        ran = wait_for(ledger, "end", "s")
        # A job run twice would have started again by now.
        time.sleep(1.0)
    runs = [line for line in lines(ledger) if (line.what, line.key) == ("start", "s")]
    assert len(runs) == 1
    assert runs[0].at >= due
    assert ran.at - due < 5.0
    assert read("rq", store).jobs["s"].status is JobStatus.SUCCEEDED


def test_a_second_sigterm_a_second_later_kills_the_horse_and_leaves_the_job_started(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("rq", store, "a")
    with serving("rq", store, ledger, work_s=6.0) as worker:
        wait_for(ledger, "start", "a")
        worker.signal(signal.SIGTERM)
        # RQ ignores a second signal less than a second after it handled the first, which
        # a loaded host may do a while after it was sent.
        time.sleep(2.0)
        again = worker.signal(signal.SIGTERM)
        exits_by_itself(worker, again)
    # Cold shutdown: RQ SIGKILLs the horse and raises SystemExit, "but will still try to
    # register its own death"; the job's work never ended and RQ holds it started.
    assert [line.what for line in lines(ledger)] == ["start"]
    job = read("rq", store).jobs["a"]
    assert (job.native_state, job.status) == ("started", JobStatus.LEASED)


def test_sigkill_of_the_worker_leaves_its_horse_to_finish_and_record_the_job(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("rq", store, "a")
    with serving("rq", store, ledger, work_s=1.5) as worker:
        started = wait_for(ledger, "start", "a")
        killed = worker.signal(signal.SIGKILL)
        code, _ = worker.join()
        # The horse is in a process group of its own: the worker's death does not reach it.
        ended = wait_for(ledger, "end", "a")
        deadline = time.monotonic() + 10.0
        while read("rq", store).jobs["a"].status is not JobStatus.SUCCEEDED:
            assert time.monotonic() < deadline, read("rq", store).jobs["a"]
            time.sleep(0.05)
    assert code == -signal.SIGKILL
    assert ended.pid == started.pid != worker.process.pid
    assert ended.at > killed
    assert [line.what for line in lines(ledger)] == ["start", "end"]
