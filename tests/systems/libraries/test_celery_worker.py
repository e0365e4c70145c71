"""Celery's own worker (``celery worker``, prefork pool) in a real process on the test's
Redis server: the cells of Celery's acknowledgement matrix that a worker's signal or death
decides, each judged by the lab's reader of Redis (``judges.readers.celery``). SIGTERM is a
warm shutdown (the task in hand finishes, and is acknowledged once with ``task_acks_late``);
the death of the pool child running a task fails it, acknowledged, unless
``task_reject_on_worker_lost`` requeues it; the death of the main process alone takes its
pool child with it, and leaves a late-acknowledged message in kombu's ``unacked`` hash until
another worker puts it back; and a task longer than the visibility timeout runs again beside
itself."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from crashqueuelab.judges.readers.celery import (
    CeleryReading,
    queue_name,
    read_celery_store,
    task_id,
)
from crashqueuelab.systems import JobStatus
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries.celery.client import Settings
from crashqueuelab.systems.libraries.celery.system import celery_system
from tests.systems.libraries.served import (
    WAIT_S,
    Line,
    kill_each_at_start,
    lines,
    read,
    serving,
    submit,
    wait_for,
)

#: The visibility timeout of the cells that wait for kombu to put a message back (kombu's
#: default is an hour): short, so that the redelivery comes inside the test's bounded wait.
VISIBILITY_S = 2


def acks_late_alone() -> System:
    """``task_acks_late`` without ``task_reject_on_worker_lost``."""
    return celery_system("celery-acks-late-alone", Settings(acks_late=True))


def defaults_short_visibility() -> System:
    return celery_system("celery-short-visibility", Settings(visibility_timeout_s=VISIBILITY_S))


def acks_late_short_visibility() -> System:
    return celery_system("celery-acks-late-short-visibility", Settings(True, True, VISIBILITY_S))


# As a user's own factory is named (module:factory), so that the worker's process builds the
# same system.
ACKS_LATE_ALONE = f"{__name__}:acks_late_alone"
DEFAULTS_SHORT = f"{__name__}:defaults_short_visibility"
ACKS_LATE_SHORT = f"{__name__}:acks_late_short_visibility"


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.02)


def redis_holds(store: Path) -> CeleryReading:
    """What the lab's reader finds of the store in Redis, its unacknowledged copies too."""
    return read_celery_store(store)


def unacked(store: Path, key: str) -> bool:
    name = queue_name(store)
    assert name is not None
    return task_id(name, key) in redis_holds(store).unacked


def acknowledged(store: Path, key: str) -> bool:
    return not unacked(store, key)


def dead(pid: int) -> bool:
    """Gone, or a zombie: nothing of it runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # The state follows the command's closing parenthesis.
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def what_ran(ledger: Path, key: str) -> list[str]:
    return [line.what for line in lines(ledger) if line.key == key]


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
    systems = ("celery", "celery-acks-late")
    for system in systems:
        submit(system, tmp_path / system, "a")
    stopped: dict[str, tuple[float, int | None, float]] = {}
    # Both workers at once: each on a store of its own.
    with contextlib.ExitStack() as stack:
        workers = {
            system: stack.enter_context(
                serving(system, tmp_path / system, tmp_path / f"{system}.ledger", work_s=3.0)
            )
            for system in systems
        }
        # Each worker stopped as its own task starts: Celery's workers, seconds apart to
        # start on a loaded host, would otherwise have ended the first task before its stop.
        signalled: dict[str, float] = {}
        for system, worker in workers.items():
            wait_for(tmp_path / f"{system}.ledger", "start", "a")
            signalled[system] = worker.signal(signal.SIGTERM)
        for system, worker in workers.items():
            stopped[system] = (signalled[system], *worker.join())
    for system, (termed, code, exited) in stopped.items():
        # "the worker will finish all currently executing tasks before it actually terminates"
        assert code == 0, system
        ended = wait_for(tmp_path / f"{system}.ledger", "end", "a", timeout_s=0.0)
        assert termed < ended.at <= exited, system
        assert what_ran(tmp_path / f"{system}.ledger", "a") == ["start", "end"]
        job = read(system, tmp_path / system).jobs["a"]
        assert (job.native_state, job.attempts, job.status) == ("succeeded", 1, JobStatus.SUCCEEDED)
        # Acknowledged once: early at the defaults, after the task with task_acks_late; no
        # copy is left in the queue or in kombu's unacked hash to run again.
        assert redis_holds(tmp_path / system).jobs == {"a": ("succeeded", 1)}, system
        assert redis_holds(tmp_path / system).unacked == (), system


def test_a_killed_pool_child_fails_its_task_unless_reject_on_worker_lost_requeues_it(
    tmp_path: Path, redis_socket: str
) -> None:
    stores = {"celery": "defaults", "celery-acks-late": "reject", ACKS_LATE_ALONE: "late"}
    for system, store in stores.items():
        submit(system, tmp_path / store, "a")
    with contextlib.ExitStack() as stack:
        for system, store in stores.items():
            ledger = tmp_path / f"{store}.ledger"
            # Long enough that each child is killed mid-task on a busy machine too.
            stack.enter_context(serving(system, tmp_path / store, ledger, work_s=3.0))
        # Each child killed as soon as its own task starts, whichever starts first.
        kill_each_at_start({store: tmp_path / f"{store}.ledger" for store in stores.values()}, "a")
        # Rejected with requeue: the main process's next child runs it again.
        wait_for(tmp_path / "reject.ledger", "end", "a")
        # Celery records the child's death as the task's failure (WorkerLostError).
        wait_for_state("celery", tmp_path / "defaults", "a", "failed")
        wait_for_state(ACKS_LATE_ALONE, tmp_path / "late", "a", "failed")
        # With task_acks_late the acknowledgement follows the stored result: the worker
        # lives until it is in Redis.
        for store in ("late", "reject"):
            wait_until(f"{store} acknowledged", partial(acknowledged, tmp_path / store, "a"))
    found = {
        store: (what_ran(tmp_path / f"{store}.ledger", "a"), redis_holds(tmp_path / store))
        for store in stores.values()
    }
    # "the task won't be redelivered to another worker if [...] the worker instance is
    # abruptly killed, mid-execution": acknowledged at its start, it ends failed and never
    # runs again.
    assert found["defaults"] == (["start"], CeleryReading(True, {"a": ("failed", 1)}))
    # "the worker will acknowledge the message if the child process executing the task is
    # terminated [...] even when acks_late is enabled": failed, acknowledged, not run again.
    assert found["late"] == (["start"], CeleryReading(True, {"a": ("failed", 1)}))
    assert found["reject"] == (
        ["start", "start", "end"],
        CeleryReading(True, {"a": ("succeeded", 1)}),
    )


def test_a_killed_main_process_takes_its_pool_child_and_acks_late_waits_for_the_timeout(
    tmp_path: Path, redis_socket: str
) -> None:
    stores = {DEFAULTS_SHORT: "defaults", ACKS_LATE_SHORT: "late"}
    for system, store in stores.items():
        submit(system, tmp_path / store, "a")
    children: dict[str, Line] = {}
    with contextlib.ExitStack() as stack:
        workers = {
            store: stack.enter_context(
                # Long enough to be running still when the later worker has started its own,
                # on a loaded host too: the kill ends it.
                serving(system, tmp_path / store, tmp_path / f"{store}.ledger", work_s=30.0)
            )
            for system, store in stores.items()
        }
        for store in stores.values():
            children[store] = wait_for(tmp_path / f"{store}.ledger", "start", "a")
        # Killed after Celery's early acknowledgement (sent by the main process when its
        # child accepted the task), so that the cell is the documented one.
        wait_until("the task acknowledged", partial(acknowledged, tmp_path / "defaults", "a"))
        for worker in workers.values():
            worker.signal(signal.SIGKILL)
            assert worker.join()[0] == -signal.SIGKILL
        # Celery's pool children die with their main process (PR_SET_PDEATHSIG, SIGKILL).
        for store, child in children.items():
            wait_until(f"{store}'s pool child dead", partial(dead, child.pid))
    for store in stores.values():
        assert what_ran(tmp_path / f"{store}.ledger", "a") == ["start"], store
    # "currently executing tasks will be lost (i.e., unless the tasks have the acks_late
    # option set)": acknowledged as it started, the task is started for good, and Redis holds
    # no copy of its message to deliver again.
    assert redis_holds(tmp_path / "defaults") == CeleryReading(True, {"a": ("started", 1)})
    # With acks_late the message waits unacknowledged in kombu's unacked hash.
    assert redis_holds(tmp_path / "late").jobs == {"a": ("started", 1)}
    assert unacked(tmp_path / "late", "a")
    # kombu puts back messages received longer ago than the visibility timeout as a consumer
    # starts, and then only on every 10th of its 10 s maintenance ticks (a worker already
    # running put one back 90.8 s after its start, measured once): the message was received
    # before its child's start, so a worker started after this finds it due at once.
    time.sleep(max(0.0, children["late"].at + VISIBILITY_S + 0.2 - time.time()))
    with serving(ACKS_LATE_SHORT, tmp_path / "late", tmp_path / "again.ledger", work_s=0.5):
        again = wait_for(tmp_path / "again.ledger", "end", "a")
        wait_until("acknowledged", partial(acknowledged, tmp_path / "late", "a"))
    assert again.pid != children["late"].pid
    assert what_ran(tmp_path / "again.ledger", "a") == ["start", "end"]
    assert redis_holds(tmp_path / "late") == CeleryReading(True, {"a": ("succeeded", 1)})


# Timing-sensitive: the second worker must start, and put the message back, while the first
# run of the 7 s task still goes on.
@pytest.mark.quiet
def test_a_task_longer_than_the_visibility_timeout_runs_again_beside_itself(
    tmp_path: Path, redis_socket: str
) -> None:
    store, first_ledger, second_ledger = (
        tmp_path / "store",
        tmp_path / "1.ledger",
        tmp_path / "2.ledger",
    )
    submit(ACKS_LATE_SHORT, store, "a")
    ledgers = (first_ledger, second_ledger)

    def starts() -> list[Line]:
        return [line for ledger in ledgers for line in lines(ledger) if line.what == "start"]

    with serving(ACKS_LATE_SHORT, store, first_ledger, work_s=7.0):
        first = wait_for(first_ledger, "start", "a")
        # The running worker looks for overdue messages again only some 90 s after its start
        # (kombu's restore acts on every 10th of its 10 s ticks): a second worker, started
        # once the message is overdue, puts it back as it starts.
        time.sleep(max(0.0, first.at + VISIBILITY_S + 0.2 - time.time()))
        with serving(ACKS_LATE_SHORT, store, second_ledger, work_s=7.0):
            wait_until("a second execution", lambda: len(starts()) == 2)
            second = starts()[1]
            assert second.pid != first.pid
            ended = wait_for(first_ledger, "end", "a")
            # "If a task isn't acknowledged within the Visibility Timeout the task will be
            # redelivered to another worker and executed": the first was still running.
            assert (ended.pid, first.at < second.at < ended.at) == (first.pid, True)
            # Both copies carry the one delivery tag kombu gave the message as it was sent:
            # the first execution's acknowledgement removes the second's from the unacked
            # hash, so nothing is left to put back while the second still runs.
            wait_until("the first acknowledged", lambda: redis_holds(store).unacked == ())
            assert redis_holds(store) == CeleryReading(True, {"a": ("succeeded", 1)})
            assert [line.what for line in lines(first_ledger) + lines(second_ledger)].count(
                "end"
            ) == 1
