"""A heartbeat run's worker process: the library's own worker loop (``System.library_worker``)
run until SIGTERM, each job's work a wait (which the SIGTERM does not cut) whose start
(with the pid of the process running it: the library may run it in a process of its own)
and end the handler appends to the worker's ledger, one line each, or a ``cut`` line naming
what interrupted the wait. A loop
that raises leaves its traceback beside the ledger and exits with ``WORKER_FAILED``. A loop
that does not stop when asked is sent ``STACKS_SIGNAL`` before the run kills it: Python's
``faulthandler`` writes every thread's stack to ``WORKER.stacks`` beside the ledger, where a
library's hang at shutdown can be read. The signal is SIGUSR2: Celery's worker takes SIGUSR1
for a handler of its own and its pool children reset SIGUSR1 to an exit, which would replace
the dump; none of the libraries' loops touches SIGUSR2 (Celery only with ``CELERY_RDBSIG``
set), and a child forked from a worker keeps the dump.
``failures`` reads, in the parent, what each worker left.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from crashqueuelab.lab.runs.executions import append_line
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import ignore_interrupts
from crashqueuelab.lab.runs.stopsignals import event_set_by
from crashqueuelab.systems.registry import resolve_system

WORKER_FAILED = 3
#: The longest a job's work waits at once (``work_for``).
WORK_SLICE_S = 0.05
#: What the run sends a worker that did not stop when asked, before it kills it.
STACKS_SIGNAL = signal.SIGUSR2


def stacks_path(ledger: str | Path) -> Path:
    """Where a worker whose ledger is ``ledger`` writes its threads' stacks."""
    return Path(ledger).with_suffix(".stacks")


@dataclass(frozen=True)
class WorkerSpec:
    system: str
    store: str
    worker_id: str
    ledger: str
    work_s: float
    retry_after_s: float
    inherited: Inherited


def work_for(seconds: float) -> None:
    """A job's work: ``seconds`` of the monotonic clock, in slices short enough for an
    exception a library raises into the thread (a time limit) to land within one. The stop
    signal does not end it: a library stopped with a job in hand lets it finish, and a job
    that ended at the signal would hand the worker's thread its next prefetched message at
    the very moment the library's stop begins (the race of dramatiq's pair, real-queues.md)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, WORK_SLICE_S))


def worker_main(spec: WorkerSpec) -> None:
    """Run the library's own loop until SIGTERM; each job's work is ``work_s`` of waiting,
    which the SIGTERM does not cut short."""
    ignore_interrupts()
    spec.inherited.adopt()
    stop = event_set_by(signal.SIGTERM)

    def work(key: str) -> None:
        append_line(spec.ledger, f"start {key} {time.monotonic():.6f} {os.getpid()}\n")
        try:
            work_for(spec.work_s)
        except BaseException as interrupted:
            # The library's own guard (a timeout raised into the job): said, then passed on.
            what = type(interrupted).__name__
            append_line(spec.ledger, f"cut {key} {time.monotonic():.6f} {what}\n")
            raise
        append_line(spec.ledger, f"end {key} {time.monotonic():.6f}\n")

    # Opened before the loop starts (the handler writes from the signal, with no time to
    # open) and registered until the process is gone: a hang after the loop returned (an
    # interpreter waiting for a library's threads as it exits) is a hang at shutdown too.
    # A raw descriptor, no file object: nothing for the interpreter to close or warn about.
    dump = os.open(stacks_path(spec.ledger), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    faulthandler.register(STACKS_SIGNAL, file=dump, all_threads=True)
    try:
        loop = resolve_system(spec.system).library_worker
        assert loop is not None  # the parent checked
        loop.run(Path(spec.store).absolute(), spec.worker_id, work, stop, spec.retry_after_s)
    except Exception:
        Path(spec.ledger + ".error").write_text(traceback.format_exc())
        os._exit(WORKER_FAILED)


def drop_empty_stacks(ledgers: Mapping[str, Path]) -> None:
    """Remove the stacks file of each worker that wrote none (it stopped when asked, or
    died some other way), once every worker is gone."""
    for ledger in ledgers.values():
        stacks = stacks_path(ledger)
        if stacks.is_file() and not stacks.stat().st_size:
            stacks.unlink()


def failures(ledgers: Mapping[str, Path], codes: Mapping[str, int | None]) -> dict[str, str]:
    """Each worker whose loop raised (the last line of its traceback) or that did not exit
    cleanly when asked to stop."""
    failed = {}
    for worker, ledger in ledgers.items():
        error = Path(f"{ledger}.error")
        if error.is_file():
            failed[worker] = error.read_text().strip().splitlines()[-1]
        elif codes[worker] != 0:
            failed[worker] = f"exited with code {codes[worker]}"
            stacks = stacks_path(ledger)
            if stacks.is_file() and stacks.stat().st_size:
                failed[worker] += f"; its threads' stacks when it was killed: {stacks.name}"
    return failed
