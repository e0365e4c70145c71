"""huey's own consumer (``huey_consumer``, at its defaults) in a real process on the
adapter's SqliteHuey file: SIGTERM stops it at once, interrupting the task in hand, as huey
documents; SIGINT lets the task in hand finish; a task scheduled with ``schedule(eta=...)``."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from crashqueuelab.systems import JobStatus, resolve_system
from tests.systems.libraries.served import lines, read, serving, submit, wait_for

#: A task that outlasts any exit: a consumer that exits before it ends did not wait for it
#: (the kill at the context's end stops it otherwise), on a loaded host too.
WORK_S = 10.0
#: Long enough for the consumer to have handled a first signal before the second comes.
HANDLED_S = 1.5


def test_sigterm_stops_the_consumer_at_once_and_the_task_in_hand_is_lost_as_documented(
    tmp_path: Path,
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("huey", store, "a")
    with serving("huey", store, ledger, work_s=WORK_S) as worker:
        started = wait_for(ledger, "start", "a")
        worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    assert code == 0
    # "any running tasks will be interrupted, ensuring the process exits quickly": the
    # consumer exited before the task's work could have ended, and it never did.
    assert exited < started.at + WORK_S
    assert [line.what for line in lines(ledger)] == ["start", "exit"]
    # "if you terminate the consumer without letting it finish any currently-executing
    # tasks, those tasks will be lost": huey deleted the task when it dequeued it, and
    # holds no result.
    reading = read("huey", store)
    assert reading.ok
    assert "a" not in reading.jobs


def test_sigint_lets_the_task_in_hand_finish_and_the_consumer_exits_by_itself(
    tmp_path: Path,
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("huey", store, "a")
    with serving("huey", store, ledger, work_s=1.5) as worker:
        wait_for(ledger, "start", "a")
        signalled = worker.signal(signal.SIGINT)
        code, exited = worker.join()
    assert code == 0
    ended = wait_for(ledger, "end", "a", timeout_s=0)
    assert signalled < ended.at <= exited
    assert [line.what for line in lines(ledger)] == ["start", "end", "exit"]
    assert read("huey", store).jobs["a"].status is JobStatus.SUCCEEDED


def test_a_task_scheduled_with_an_eta_runs_once_and_not_before_it_is_due(
    tmp_path: Path,
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    own = resolve_system("huey").own_worker
    assert own is not None
    assert own.schedule is not None
    with serving("huey", store, ledger, work_s=0.0) as worker:
        # Serving before the clock starts: how late the task runs is the worker's lateness,
        # not its start (seconds on a loaded host).
        submit("huey", store, "warm-up")
        wait_for(ledger, "end", "warm-up")
        due = time.time() + 1.0
        own.schedule(store, "s", due)
        assert read("huey", store).jobs["s"].status is JobStatus.PENDING
        ran = wait_for(ledger, "end", "s")
        worker.signal(signal.SIGINT)
        code, _ = worker.join()
    assert code == 0
    runs = [line for line in lines(ledger) if (line.what, line.key) == ("start", "s")]
    assert len(runs) == 1
    assert runs[0].at >= due
    assert ran.at - due < 5.0
    assert read("huey", store).jobs["s"].status is JobStatus.SUCCEEDED


def test_a_second_sigint_interrupts_the_graceful_shutdown_and_the_task_is_lost(
    tmp_path: Path,
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("huey", store, "a")
    with serving("huey", store, ledger, work_s=WORK_S) as worker:
        started = wait_for(ledger, "start", "a")
        worker.signal(signal.SIGINT)
        time.sleep(HANDLED_S)  # the consumer is in its graceful join by now
        worker.signal(signal.SIGINT)
        code, exited = worker.join()
    # huey's handler makes a second graceful signal raise KeyboardInterrupt in the join:
    # "Received request to shut down now", and the workers are interrupted.
    assert code == 0
    assert exited < started.at + WORK_S
    assert [line.what for line in lines(ledger)] == ["start", "exit"]
    assert "a" not in read("huey", store).jobs


def test_sigkill_loses_the_task_in_hand_as_documented(tmp_path: Path) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("huey", store, "a", "b")
    with serving("huey", store, ledger, work_s=1.5) as worker:
        wait_for(ledger, "start", "a")
        worker.signal(signal.SIGKILL)
        code, _ = worker.join()
    assert code == -signal.SIGKILL
    assert [line.what for line in lines(ledger)] == ["start"]
    # "any tasks that are currently being run by a worker will be lost"; the one it had not
    # dequeued waits in the queue.
    jobs = read("huey", store).jobs
    assert "a" not in jobs
    assert jobs["b"].status is JobStatus.PENDING
