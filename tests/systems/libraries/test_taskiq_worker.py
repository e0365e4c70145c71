"""taskiq's own worker process (``taskiq worker module:broker``'s ``start_listen``) in a real
process on the test's Redis server: SIGTERM lets the task in hand finish and acknowledges it
(taskiq's shutdown awaits running tasks), and SIGKILL leaves its entry pending in the
consumer group, where the reader finds it held by the dead consumer."""

from __future__ import annotations

import signal
from pathlib import Path

from crashqueuelab.judges.readers.taskiq import read_taskiq_store
from crashqueuelab.systems import JobStatus
from tests.systems.libraries.served import lines, read, serving, submit, wait_for


def test_sigterm_lets_the_task_in_hand_finish_and_acknowledges_it(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("taskiq", store, "a")
    with serving("taskiq", store, ledger, work_s=1.0) as worker:
        wait_for(ledger, "start", "a")
        termed = worker.signal(signal.SIGTERM)
        code, exited = worker.join()
    assert code == 0
    # The task's one second of work, then the exit: nothing waits for a poll or a timeout.
    assert exited - termed < 5.0
    assert [line.what for line in lines(ledger)] == ["start", "end", "exit"]
    job = read("taskiq", store).jobs["a"]
    assert (job.native_state, job.attempts, job.status) == ("succeeded", 1, JobStatus.SUCCEEDED)


def test_sigkill_leaves_the_entry_pending_for_the_dead_consumer(
    tmp_path: Path, redis_socket: str
) -> None:
    store, ledger = tmp_path / "store", tmp_path / "ledger"
    submit("taskiq", store, "a")
    with serving("taskiq", store, ledger, work_s=30.0) as worker:
        wait_for(ledger, "start", "a")
        worker.signal(signal.SIGKILL)
        worker.join()
    reading = read_taskiq_store(store)
    (entry,) = reading.entries
    assert (entry.key, entry.state, entry.deliveries) == ("a", "pending", 1)
    assert reading.consumers == {entry.consumer: 1}
    assert reading.jobs == {"a": ("pending", 1)}
