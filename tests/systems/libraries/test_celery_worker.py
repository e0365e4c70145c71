"""Celery's own worker (``celery worker``, prefork pool) in a real process on the test's
Redis server: what SIGTERM does to the task in hand (a warm shutdown finishes it, as
Celery documents), and what the death of the pool child running a task does at Celery's
defaults (acknowledged at its start: never run again) and with ``task_acks_late`` and
``task_reject_on_worker_lost`` (put back, and run by the next worker)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from crashqueuelab.systems import JobStatus
from tests.systems.libraries.served import WAIT_S, lines, read, serving, submit, wait_for


def wait_for_state(system: str, store: Path, key: str, state: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        job = read(system, store).jobs.get(key)
        if job is not None and job.native_state == state:
            return
        time.sleep(0.02)
    raise AssertionError(f"{key} never {state}: {read(system, store).jobs}")


def test_sigterm_is_a_warm_shutdown_the_task_in_hand_finishes_then_the_worker_exits(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("celery", store, "a")
    with serving("celery", store, ledger, work_s=1.5) as worker:
        wait_for(ledger, "start", "a")
        termed = worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    # "the worker will finish all currently executing tasks before it actually terminates"
    assert code == 0
    ended = wait_for(ledger, "end", "a", timeout_s=0.0)
    assert termed < ended.at <= exited
    job = read("celery", store).jobs["a"]
    assert (job.native_state, job.attempts, job.status) == ("succeeded", 1, JobStatus.SUCCEEDED)


def test_a_killed_pool_child_loses_its_task_at_the_defaults_and_not_with_reject_on_worker_lost(
    tmp_path: Path, redis_socket: str
) -> None:
    systems = ("celery", "celery-acks-late")
    for system in systems:
        submit(system, tmp_path / system, "a")
    # Both workers at once: each on a store of its own.
    with contextlib.ExitStack() as stack:
        for system in systems:
            ledger = tmp_path / f"{system}.ledger"
            stack.enter_context(serving(system, tmp_path / system, ledger, work_s=1.0))
        for system in systems:
            child = wait_for(tmp_path / f"{system}.ledger", "start", "a")
            os.kill(child.pid, signal.SIGKILL)
        # Rejected with requeue: the main process's next child runs it again.
        wait_for(tmp_path / "celery-acks-late.ledger", "end", "a")
        # Celery records the child's death as the task's failure (WorkerLostError).
        wait_for_state("celery", tmp_path / "celery", "a", "failed")
    found = {
        system: (
            [line.what for line in lines(tmp_path / f"{system}.ledger") if line.key == "a"],
            read(system, tmp_path / system).jobs["a"].native_state,
        )
        for system in systems
    }
    # "the task won't be redelivered to another worker if [...] the worker instance is
    # abruptly killed, mid-execution": acknowledged at its start, it ends failed and never
    # runs again.
    assert found["celery"] == (["start"], "failed")
    assert found["celery-acks-late"] == (["start", "start", "end"], "succeeded")
