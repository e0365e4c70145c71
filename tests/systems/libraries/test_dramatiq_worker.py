"""dramatiq's own worker (the ``dramatiq`` command) in a real process on the test's Redis
server: what SIGTERM does to the message in hand (finished, as dramatiq documents) and to
the one it prefetched (put back, and run by the next worker), and a message enqueued with a
delay (run once, not before its eta)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.systems import JobStatus, resolve_system
from tests.systems.libraries.served import lines, read, serving, submit, wait_for


def test_sigterm_finishes_the_message_in_hand_and_puts_the_prefetched_one_back(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("dramatiq", store, "a", "b")
    with serving("dramatiq", store, ledger, work_s=1.5) as worker:
        wait_for(ledger, "start", "a")
        termed = worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    # "worker threads will finish processing the work they have in flight".
    assert code == 0
    ended = wait_for(ledger, "end", "a", timeout_s=0.0)
    assert ended.at > termed
    assert exited > ended.at
    assert [(line.what, line.key) for line in lines(ledger)] == [
        ("start", "a"),
        ("end", "a"),
        ("exit", "-"),
    ]
    reading = read("dramatiq", store)
    assert reading.jobs["a"].status is JobStatus.SUCCEEDED
    # "Any tasks still in worker memory at this point are re-queued on the broker."
    assert reading.jobs["b"].native_state == "queued"
    own = resolve_system("dramatiq").own_worker
    assert own is not None
    assert own.schedule is not None
    due = time.time() + 1.0
    own.schedule(store, "s", due)
    assert read("dramatiq", store).jobs["s"].native_state == "delayed"
    with serving("dramatiq", store, ledger, work_s=0.0):
        wait_for(ledger, "end", "b")
        ran = wait_for(ledger, "start", "s")
        wait_for(ledger, "end", "s")
    reading = read("dramatiq", store)
    assert reading.jobs["b"].status is JobStatus.SUCCEEDED
    # Delayed to its eta (dramatiq keeps milliseconds), and run once.
    assert ran.at >= due - 0.002
    assert [line.key for line in lines(ledger) if line.what == "start"].count("s") == 1
    assert reading.jobs["s"].status is JobStatus.SUCCEEDED


def test_a_worker_of_a_store_never_opened_is_refused(tmp_path: Path) -> None:
    system = resolve_system("dramatiq")
    assert system.own_worker is not None
    assert system.library_worker is not None
    with pytest.raises(SystemUnavailable, match="no dramatiq store"):
        system.own_worker.serve(tmp_path / "none", "w1", lambda key: None)
    assert system.own_worker.schedule is not None
    with pytest.raises(SystemUnavailable, match="no dramatiq store"):
        system.own_worker.schedule(tmp_path / "none", "k", 0.0)
