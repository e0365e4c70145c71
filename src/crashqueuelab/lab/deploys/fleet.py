"""The deploy run's worker processes and the only things the lab does to them: start one
(in a session of its own, so its session holds whatever it forks), send it a signal,
SIGKILL every process of its session, see that it exited. Every act and every exit is recorded
with its time on the run's clock (seconds from its start), with the jobs a SIGKILLed
worker held and the processes its group still had.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from crashqueuelab.lab.deploys.workers import DeployWorkerSpec
from crashqueuelab.lab.faults.signals import kill_all, session_members
from crashqueuelab.lab.runs.executions import Execution, read_ledger

#: How long the end of a run waits for a worker it asked to stop, before SIGKILL.
FINAL_STOP_S = 30.0


#: The signals a deploy may send, as a process manager leaves them to the worker it starts.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def default_stop_signals() -> None:
    """In the worker's process before it execs: each stop signal's default action, as
    systemd or a container runtime starts a worker. A lab started from a shell's background
    job (``&``, ``nohup``, many CI runners) inherits SIGINT and SIGQUIT ignored, which the
    exec keeps: the worker would then outlive a SIGQUIT until its grace's SIGKILL."""
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_DFL)


@dataclass
class Worker:
    """One worker process and what happened to it (times in seconds from the run's start)."""

    name: str
    slot: int
    generation: int
    ledger: Path
    process: subprocess.Popen[bytes]
    started_s: float
    log: IO[bytes]
    #: Every signal the lab sent it: ``(time, signal name)``.
    signals: list[tuple[float, str]] = field(default_factory=list)
    #: When the first stop signal went, and the end of its grace period.
    stop_s: float | None = None
    grace_end_s: float | None = None
    #: The deploy step that stopped it (its index in the schedule), or None; when that step
    #: fell due (a stop may wait for its worker, ``Rollout.ready``).
    step: int | None = None
    stop_due_s: float | None = None
    #: The jobs its ledger had open when the first stop signal went.
    held_when_stopped: list[str] = field(default_factory=list)
    killed_s: float | None = None
    #: The jobs its ledger had open when the lab SIGKILLed it.
    held_when_killed: list[str] = field(default_factory=list)
    #: The processes of its session the SIGKILL found (the worker and what it forked).
    group_when_killed: list[int] = field(default_factory=list)
    exit_s: float | None = None
    exit_code: int | None = None
    #: Whether its library says when it takes jobs (``OwnWorker.tells_ready``).
    tells_ready: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.exit_s is None

    def serving(self) -> bool:
        """Whether the process reached its worker (its ledger's ``serving`` line), and where
        its library tells, whether that worker takes jobs (its ``ready`` line): before, a
        stop signal finds an interpreter still importing, or a worker still booting, not the
        worker under test."""
        if self.tells_ready:
            return self.ready_at() is not None
        if not self.ledger.is_file():
            return False
        return any(line.startswith("serving ") for line in self.ledger.read_text().splitlines())

    def open_runs(self) -> list[Execution]:
        """The executions its ledger has started and not ended (nor seen cut), in order."""
        if not self.ledger.is_file():
            return []
        return [run for run in read_ledger(self.ledger.read_text(), self.name) if run.end_s is None]

    def jobs_in_hand(self) -> list[str]:
        return [run.key for run in self.open_runs()]

    def ready_at(self) -> float | None:
        """When its library said it takes jobs (the ledger's clock), or None."""
        if not self.ledger.is_file():
            return None
        for line in self.ledger.read_text().splitlines():
            parts = line.split(" ")
            if parts[0] == "ready" and len(parts) == 2:
                with contextlib.suppress(ValueError):
                    return float(parts[1])
        return None

    def exit_word(self) -> str | None:
        code = self.exit_code
        if code is None:
            return None
        if code < 0:
            return signal.Signals(-code).name
        return f"exit {code}"

    def to_json(self) -> dict[str, Any]:
        within = None
        if self.stop_s is not None and self.exit_s is not None:
            within = self.killed_s is None
        return {
            "name": self.name,
            "slot": self.slot,
            "generation": self.generation,
            "pid": self.pid,
            "started_s": round(self.started_s, 3),
            "signals": [{"at_s": round(at, 3), "signal": name} for at, name in self.signals],
            "stop_s": None if self.stop_s is None else round(self.stop_s, 3),
            "grace_end_s": None if self.grace_end_s is None else round(self.grace_end_s, 3),
            "step": self.step,
            "stop_due_s": None if self.stop_due_s is None else round(self.stop_due_s, 3),
            "held_when_stopped": self.held_when_stopped,
            # A stop no deploy made is the end of the run's: the lab's cleanup.
            "stopped_by": "deploy" if self.step is not None else "end of run",
            "killed_s": None if self.killed_s is None else round(self.killed_s, 3),
            "held_when_killed": self.held_when_killed,
            "group_when_killed": self.group_when_killed,
            "exit_s": None if self.exit_s is None else round(self.exit_s, 3),
            "exit_code": self.exit_code,
            "exit": self.exit_word(),
            "exited_within_grace": within,
            "ledger": self.ledger.name,
        }


class Fleet:
    """Starts, signals and kills the run's worker processes; ``clock`` is the run's clock
    (seconds from its start)."""

    def __init__(
        self,
        directory: Path,
        spec_for: Callable[[str, Path], DeployWorkerSpec],
        clock: Callable[[], float],
        tells_ready: bool = False,
    ) -> None:
        self.directory = directory
        self.spec_for = spec_for
        self.clock = clock
        #: Whether the workers' library says when each takes jobs.
        self.tells_ready = tells_ready
        self.workers: list[Worker] = []

    def start(self, slot: int) -> Worker:
        generation = sum(1 for worker in self.workers if worker.slot == slot)
        name = f"w{slot}.{generation}"
        ledger = self.directory / f"{name}.ledger"
        spec = self.spec_for(name, ledger)
        spec_file = self.directory / f"{name}.spec.json"
        spec_file.write_text(json.dumps(spec.to_json()))
        log = (self.directory / f"{name}.log").open("wb")
        command = [sys.executable, "-m", "crashqueuelab.lab.deploys.workers", str(spec_file)]
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            # Between fork and exec, only sigaction: no lock another thread could hold. A
            # reset by the worker itself would leave its interpreter's start unguarded.
            preexec_fn=default_stop_signals,  # noqa: PLW1509
        )
        worker = Worker(
            name, slot, generation, ledger, process, self.clock(), log,
            tells_ready=self.tells_ready,
        )  # fmt: skip
        self.workers.append(worker)
        return worker

    def running(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.running]

    def send(self, worker: Worker, name: str) -> None:
        """Send the worker's own process (never its group: as a process manager's stop
        reaches the main process) the signal ``name``."""
        if not worker.running:
            return
        worker.signals.append((self.clock(), name))
        # It may have exited between the poll and the signal: poll() sees it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.Signals[name])

    def kill(self, worker: Worker) -> None:
        """SIGKILL every process of the worker's session, noting the jobs it held and the
        processes the session had."""
        worker.group_when_killed = session_members(worker.pid)
        if not worker.group_when_killed:
            return
        at = self.clock()
        worker.killed_s = at
        worker.signals.append((at, "SIGKILL"))
        worker.held_when_killed = worker.jobs_in_hand()
        kill_all(worker.group_when_killed)

    def poll(self) -> list[Worker]:
        """Note every worker that exited since the last poll; those workers."""
        ended = []
        for worker in self.running():
            code = worker.process.poll()
            if code is not None:
                worker.exit_s = self.clock()
                worker.exit_code = code
                worker.log.close()
                ended.append(worker)
        return ended

    def close(self, wait: Callable[[float], None]) -> None:
        """Stop whatever still runs: SIGTERM, up to ``FINAL_STOP_S``, then SIGKILL of its
        session; and SIGKILL what any worker's session left behind."""
        for worker in self.running():
            self.send(worker, "SIGTERM")
        ends = self.clock() + FINAL_STOP_S
        while self.running() and self.clock() < ends:
            self.poll()
            wait(0.05)
        for worker in self.running():
            self.kill(worker)
            worker.process.wait(10.0)
        self.poll()
        for worker in self.workers:
            kill_all(session_members(worker.pid))
