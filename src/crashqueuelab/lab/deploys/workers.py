"""One worker process of a deploy run (``python -m crashqueuelab.lab.deploys.workers
SPEC``), started in a session of its own so that its session holds all it forks: the
library's own worker (``System.own_worker.serve``) in this process's main thread with the
library's own signal handlers, or, for a system without one, the lab's own worker
(``labworker``).

Each job's work is a wait as long as the plan says for its key; its start (with the pid of
the process running it), its end, or what cut it are appended to the worker's ledger, one
line each. Before it serves, the worker writes ``serving T PID``. A worker whose setup
raises leaves its traceback beside the ledger (``.error``) and exits ``WORKER_FAILED``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.lab.deploys.labworker import lab_worker
from crashqueuelab.lab.runs.executions import append_line
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.systems.registry import resolve_system

WORKER_FAILED = 3


@dataclass(frozen=True)
class DeployWorkerSpec:
    system: str
    store: str
    worker_id: str
    ledger: str
    #: Each job's work, in seconds, by key (the plan's).
    durations: dict[str, float]
    #: The lab's own worker's lease (unused by a library's own worker).
    lease_s: float
    inherited: Inherited

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "store": self.store,
            "worker_id": self.worker_id,
            "ledger": self.ledger,
            "durations": self.durations,
            "lease_s": self.lease_s,
            "sys_path": list(self.inherited.sys_path),
            "environment": [list(pair) for pair in self.inherited.environment],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeployWorkerSpec:
        return cls(
            system=data["system"],
            store=data["store"],
            worker_id=data["worker_id"],
            ledger=data["ledger"],
            durations={key: float(value) for key, value in data["durations"].items()},
            lease_s=float(data["lease_s"]),
            inherited=Inherited(
                sys_path=tuple(data["sys_path"]),
                environment=tuple((name, value) for name, value in data["environment"]),
            ),
        )


@dataclass(frozen=True)
class LedgerWork:
    """The work of a job (``JobWork``): a wait as long as the plan says, its start, end or
    cut in the ledger, and its receipt where the library tells."""

    spec: DeployWorkerSpec

    def __call__(self, key: str) -> None:
        ledger = self.spec.ledger
        append_line(ledger, f"start {key} {time.monotonic():.6f} {os.getpid()}\n")
        try:
            time.sleep(self.spec.durations.get(key, 0.0))
        except BaseException as interrupted:
            # The library's own handler raised into the job (SIGINT's KeyboardInterrupt).
            what = type(interrupted).__name__
            append_line(ledger, f"cut {key} {time.monotonic():.6f} {what}\n")
            raise
        append_line(ledger, f"end {key} {time.monotonic():.6f}\n")

    def received(self, key: str) -> None:
        append_line(self.spec.ledger, f"received {key} {time.monotonic():.6f}\n")

    def ready(self) -> None:
        append_line(self.spec.ledger, f"ready {time.monotonic():.6f}\n")


def work_for(spec: DeployWorkerSpec) -> LedgerWork:
    """The work of each job of ``spec``'s worker."""
    return LedgerWork(spec)


def serve(spec: DeployWorkerSpec) -> None:
    """Run the system's own worker, or the lab's, until it exits."""
    spec.inherited.adopt()
    system = resolve_system(spec.system)
    worker = system.own_worker or lab_worker(system, Path(spec.ledger), spec.lease_s)
    append_line(spec.ledger, f"serving {time.monotonic():.6f} {os.getpid()}\n")
    worker.serve(Path(spec.store).absolute(), spec.worker_id, work_for(spec))


def main(argv: Sequence[str]) -> int:
    spec = DeployWorkerSpec.from_json(json.loads(Path(argv[0]).read_text()))
    try:
        serve(spec)
    except Exception:
        Path(spec.ledger + ".error").write_text(traceback.format_exc())
        return WORKER_FAILED
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main(sys.argv[1:]))
