"""procrastinate's own worker (``procrastinate worker``, at its defaults) in a real process
on the adapter's schema: SIGTERM lets the job in hand finish, and a job deferred with
``schedule_at``."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from crashqueuelab.systems import JobStatus, resolve_system
from tests.systems.libraries.served import lines, read, serving, submit, wait_for

#: procrastinate's worker looks for due jobs every 5 s (``fetch_job_polling_interval``)
#: when no notification wakes it, and a job deferred for later wakes it only at its defer.
POLLING_S = 5.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_lets_the_job_in_hand_finish_and_the_worker_exits_by_itself(
    tmp_path: Path, postgres_dsn: str, signum: signal.Signals
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("procrastinate", store, "a")
    with serving("procrastinate", store, ledger, work_s=1.5) as worker:
        wait_for(ledger, "start", "a")
        termed = worker.signal(signum)
        code, exited = worker.join()
    assert code == 0
    ended = wait_for(ledger, "end", "a", timeout_s=0)
    assert termed < ended.at <= exited
    assert [line.what for line in lines(ledger)] == ["start", "end", "exit"]
    assert read("procrastinate", store).jobs["a"].status is JobStatus.SUCCEEDED


def test_a_job_deferred_with_schedule_at_runs_once_and_not_before_it_is_due(
    tmp_path: Path, postgres_dsn: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    own = resolve_system("procrastinate").own_worker
    assert own is not None
    assert own.schedule is not None
    with serving("procrastinate", store, ledger, work_s=0.0) as worker:
        # Serving before the clock starts: how late the task runs is the worker's lateness,
        # not its start (seconds on a loaded host).
        submit("procrastinate", store, "warm-up")
        wait_for(ledger, "end", "warm-up")
        due = time.time() + 1.0
        own.schedule(store, "s", due)
        assert read("procrastinate", store).jobs["s"].status is JobStatus.PENDING
        ran = wait_for(ledger, "end", "s")
        worker.signal(signal.SIGTERM)
        code, _ = worker.join()
    assert code == 0
    runs = [line for line in lines(ledger) if (line.what, line.key) == ("start", "s")]
    assert len(runs) == 1
    assert runs[0].at >= due
    assert ran.at - due < POLLING_S + 2.0
    assert read("procrastinate", store).jobs["s"].status is JobStatus.SUCCEEDED


@pytest.mark.parametrize(
    "second", [signal.SIGTERM, signal.SIGKILL], ids=["second SIGTERM", "SIGKILL"]
)
def test_a_second_sigterm_or_sigkill_ends_the_worker_at_once_leaving_the_job_doing(
    tmp_path: Path, postgres_dsn: str, second: signal.Signals
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("procrastinate", store, "a")
    with serving("procrastinate", store, ledger, work_s=10.0) as worker:
        started = wait_for(ledger, "start", "a")
        if second is signal.SIGTERM:
            worker.signal(signal.SIGTERM)
            time.sleep(1.5)  # draining by now, on a loaded host too
        worker.signal(second)
        code, exited = worker.join()
    # "it will terminate immediately, possibly leaving jobs with the doing status": the
    # first signal put the default action back, and the second takes it (the exit is the
    # signal's own), long before the job could have ended.
    assert code == -second
    assert exited < started.at + 10.0
    assert [line.what for line in lines(ledger)] == ["start"]
    job = read("procrastinate", store).jobs["a"]
    assert (job.native_state, job.status) == ("doing", JobStatus.LEASED)


def test_a_second_sigint_does_not_end_the_worker_at_once_the_job_in_hand_still_finishes(
    tmp_path: Path, postgres_dsn: str
) -> None:
    # procrastinate documents a second SIGINT as "terminate immediately" (SHUTDOWN). Its
    # first signal puts back the SIGINT handler asyncio's runner installed, which cancels
    # the worker's task; the worker takes that cancel for a stop request and keeps waiting
    # for the job, then asyncio.run raises KeyboardInterrupt. Measured, not judged here.
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("procrastinate", store, "a")
    with serving("procrastinate", store, ledger, work_s=4.0) as worker:
        wait_for(ledger, "start", "a")
        worker.signal(signal.SIGINT)
        time.sleep(1.5)  # draining by now, on a loaded host too
        again = worker.signal(signal.SIGINT)
        code, exited = worker.join()
    ended = wait_for(ledger, "end", "a", timeout_s=0)
    assert again < ended.at <= exited
    assert code == 1  # KeyboardInterrupt out of asyncio.run, after the drain
    assert [line.what for line in lines(ledger)] == ["start", "end"]
    assert read("procrastinate", store).jobs["a"].status is JobStatus.SUCCEEDED
