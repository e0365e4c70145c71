"""A library's own worker (``System.own_worker``) served in a real process of its own, for
the worker tests: each job's work is a wait, its start and end appended to a ledger with
the wall time and the pid that ran it, and ``exit`` once ``serve`` returned. Every wait is
bounded, and every process the worker left (RQ's work horse and scheduler) is killed on
the way out, whatever the test found."""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.lab.heartbeats.workers import STACKS_SIGNAL
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import forkserver_context, start_owned
from crashqueuelab.systems import JobSpec, OpenRequest, StoreReading, resolve_system

#: The longest any test waits for one thing a worker process does.
WAIT_S = 20.0
#: How long a worker that did not exit has to write its threads' stacks.
STACKS_WAIT_S = 2.0


def _append(ledger: str, line: str) -> None:
    descriptor = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


def serve_main(
    system: str, store: str, ledger: str, work_s: float, inherited: Inherited, worker_id: str = "w1"
) -> None:
    inherited.adopt()
    # A worker that does not exit when the test expects it to leaves its threads' stacks
    # (and those of the processes it forked, which inherit this) beside the ledger.
    stacks = open(f"{ledger}.stacks", "a")  # noqa: SIM115 (open while the process lives)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    own = resolve_system(system).own_worker
    assert own is not None

    def work(key: str) -> None:
        _append(ledger, f"start {key} {time.time():.6f} {os.getpid()}\n")
        time.sleep(work_s)
        _append(ledger, f"end {key} {time.time():.6f} {os.getpid()}\n")

    own.serve(Path(store), worker_id, work)
    _append(ledger, f"exit - {time.time():.6f} {os.getpid()}\n")


@dataclass(frozen=True)
class Line:
    what: str
    key: str
    at: float
    pid: int


def lines(ledger: Path) -> list[Line]:
    if not ledger.exists():
        return []
    found = []
    for text in ledger.read_text().splitlines():
        what, key, at, pid = text.split()
        found.append(Line(what, key, float(at), int(pid)))
    return found


def wait_for(ledger: Path, what: str, key: str, timeout_s: float = WAIT_S) -> Line:
    deadline = time.monotonic() + timeout_s
    while True:
        for line in lines(ledger):
            if (line.what, line.key) == (what, key):
                return line
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    raise AssertionError(f"no {what} {key} within {timeout_s} s: {lines(ledger)}")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The parent's pid follows the state, after the command's closing parenthesis.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


@dataclass
class Served:
    process: Any
    ledger: Path

    def signal(self, signum: int) -> float:
        os.kill(self.process.pid, signum)
        return time.time()

    def join(self, timeout_s: float = WAIT_S) -> tuple[int | None, float]:
        """The worker's exit code (None: still running after ``timeout_s``) and when it was
        seen to exit; a worker still running has its stacks written beside the ledger."""
        self.process.join(timeout_s)
        exited = time.time()
        if self.process.exitcode is None:
            stacks = Path(f"{self.ledger}.stacks")
            for pid in [self.process.pid, *_descendants(self.process.pid)]:
                with suppress(ProcessLookupError):
                    os.kill(pid, STACKS_SIGNAL)
            # Written by each process's signal handler, before the test's way out kills it.
            deadline = time.monotonic() + STACKS_WAIT_S
            while time.monotonic() < deadline and not (stacks.exists() and stacks.stat().st_size):
                time.sleep(0.02)
            time.sleep(0.2)  # the other processes' stacks, after the first
        return self.process.exitcode, exited


@contextmanager
def serving(
    system: str, store: Path, ledger: Path, work_s: float, worker_id: str = "w1"
) -> Iterator[Served]:
    """The system's own worker serving ``store`` as ``worker_id`` (workers on one broker at
    once, each on its own store, are named apart where the broker shares their names:
    Celery's worker's node name on a RabbitMQ vhost)."""
    context = forkserver_context(())
    process = context.Process(
        target=serve_main,
        args=(system, str(store), str(ledger), work_s, Inherited.capture(), worker_id),
        # RQ's worker starts its scheduler as a multiprocessing child, which a daemonic
        # process may not have.
        daemon=False,
    )
    start_owned(process)
    pid = process.pid
    assert pid is not None  # started
    served = Served(process, ledger)
    try:
        yield served
    finally:
        left = set(_descendants(pid)) if process.exitcode is None else set()
        # A process that began a job and never ended it may still run it (RQ's horse).
        ended = {line.key for line in lines(ledger) if line.what == "end"}
        left |= {
            line.pid for line in lines(ledger) if line.what == "start" and line.key not in ended
        } - {pid}
        for each in [pid, *left]:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(each, signal.SIGKILL)
        process.join(WAIT_S)


def submit(system: str, store: Path, *keys: str) -> None:
    from crashqueuelab.core.clock import ManualClock
    from crashqueuelab.core.ids import SeededIds
    from crashqueuelab.core.retry import RetryPolicy

    request = OpenRequest(
        store, clock=ManualClock(10**9), ids=SeededIds(1, "t"), retry=RetryPolicy()
    )
    client = resolve_system(system).open(request)
    try:
        client.submit_many([JobSpec(key, "t", {}, max_attempts=1) for key in keys])
    finally:
        client.close()


def read(system: str, store: Path) -> StoreReading:
    reader = resolve_system(system).reader
    assert reader is not None
    return reader(store)


def kill_each_at_start(ledgers: dict[str, Path], key: str, timeout_s: float = WAIT_S) -> None:
    """SIGKILL the process running ``key`` in each ledger's worker as soon as that worker
    starts it, whichever starts first; fail naming the ledgers whose worker never did."""
    waiting = set(ledgers)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            begun = [
                line for line in lines(ledgers[name]) if (line.what, line.key) == ("start", key)
            ]
            if begun:
                os.kill(begun[0].pid, signal.SIGKILL)
                waiting.discard(name)
        time.sleep(0.02)
    assert not waiting, f"no task started in {sorted(waiting)}"
