"""Where a power-loss case keeps what the power cut may take: the disk a system writes to.

A system of files keeps its store on the disk itself (``StoreOnDisk``): the case's store
directory is the mount point. A system with a server keeps its data in the server's data
directory, so that directory is what goes on the disk (``serverdisk.ServerOnDisk``). Either
target gives the same three things to a case: ``cut`` (the power goes: the journal of what
was pending), ``place`` (one crash state made and ready to be read, as the restarted machine
would find it, unless its bytes are those of a state already placed) and ``artifacts``
(where the evidence is kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Protocol

from crashqueuelab.lab.faults.powerloss.crashstate import (
    Choice,
    CrashState,
    DistinctStates,
    materialize,
)
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk
from crashqueuelab.lab.faults.powerloss.journal import JOURNAL_FILE, Journal
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY

DISK_DIRECTORY = "disk"


class PlacedState(Protocol):
    state: CrashState
    #: Why the crash state cannot be read at all (a server that would not start on it).
    problem: str | None
    #: Its bytes are those of a state placed before (``DistinctStates.skipped`` says which):
    #: nothing was started on it, and nothing is to be judged.
    repeated: bool


class Placed:
    def __init__(
        self, state: CrashState, problem: str | None = None, *, repeated: bool = False
    ) -> None:
        self.state = state
        self.problem = problem
        self.repeated = repeated


class PowerLossTarget(Protocol):
    def __enter__(self) -> PowerLossTarget: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def cut(self) -> Journal: ...

    def place(
        self, journal: Journal, choice: Choice, state_dir: Path, distinct: DistinctStates
    ) -> AbstractContextManager[PlacedState]: ...

    def artifacts(self, relative: Path) -> dict[str, str]: ...


class StoreOnDisk:
    """The case's store directory is the mount point; its backing tree is ``disk/tree``."""

    def __init__(self, case_dir: Path) -> None:
        self.disk = PowerLossDisk(case_dir / DISK_DIRECTORY, case_dir / STORE_DIRECTORY)

    def __enter__(self) -> StoreOnDisk:
        self.disk.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.disk.__exit__(kind, error, traceback)

    def cut(self) -> Journal:
        return self.disk.cut()

    @contextmanager
    def place(
        self, journal: Journal, choice: Choice, state_dir: Path, distinct: DistinctStates
    ) -> Iterator[Placed]:
        store = state_dir / STORE_DIRECTORY
        state = materialize(self.disk.root, journal, choice, store)
        yield Placed(state, repeated=not distinct.new_bytes(choice, store))

    def artifacts(self, relative: Path) -> dict[str, str]:
        return {
            "disk": str(relative / DISK_DIRECTORY),
            "journal": str(relative / DISK_DIRECTORY / JOURNAL_FILE),
        }
