"""A throwaway server whose data directory is on the power-loss disk: what every server's
case does alike (``OnDisk``); each server's own steps are in its module (``serverdisk``:
PostgreSQL, ``redisdisk``: Redis).

A case lays the disk's backing tree (what was durable before the power came on), mounts the
disk as a new server's data directory, starts the server on it and names it to the case's
children. The cut freezes every server process (SIGSTOP), stops the disk, then kills them:
nothing they do after the cut reaches the disk. Each crash state is then laid as the data
directory of another server of the same kind, which starts on it as after a reboot (its own
recovery runs here), for the judges and the recovery workload to use; a server that refuses
to start on a crash state is reported with its words, as a state that cannot be read.
"""

from __future__ import annotations

import shutil
import signal
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Generic, Self, TypeVar

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.faults.powerloss.crashstate import Choice, CrashState, DistinctStates
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk
from crashqueuelab.lab.faults.powerloss.journal import JOURNAL_FILE, Journal
from crashqueuelab.lab.faults.powerloss.targets import DISK_DIRECTORY, Placed
from crashqueuelab.lab.runs.servers import named
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY
from crashqueuelab.servers.base import Throwaway, signal_all

#: The case's server's log, kept in the case directory.
SERVER_LOG = "server.log"
#: The log of the server started on a crash state, kept in the state's directory.
STATE_SERVER_LOG = "recovery-server.log"

Server = TypeVar("Server", bound=Throwaway)


def keep_log(server: Throwaway, target: Path) -> None:
    if server.log.exists():
        shutil.copyfile(server.log, target)


class OnDisk(ABC, Generic[Server]):
    """One case's server, its data directory mounted from the power-loss disk."""

    #: Whether other accounts may use the mount (a server that runs as its own account).
    shared: ClassVar[bool] = False

    def __init__(self, case_dir: Path) -> None:
        self.case_dir = case_dir
        self.server = self.new_server()
        # The backing tree lives beside the server, in the system temp directory: what a
        # reader needs (the journal, the logs) is copied to the case.
        self.disk = PowerLossDisk(
            self.server.root / DISK_DIRECTORY, self.server.data, shared=self.shared
        )
        self._naming = ExitStack()

    @abstractmethod
    def new_server(self) -> Server:
        """A server of this case's kind and settings, not started."""

    @abstractmethod
    def lay_tree(self) -> None:
        """The disk's backing tree as the power comes on, and the mount point."""

    @abstractmethod
    def lay_state(self, journal: Journal, choice: Choice, server: Server) -> CrashState:
        """The crash state ``choice`` of the disk as ``server``'s data directory."""

    def keep_logs(self, server: Server, log: Path) -> None:
        """What ``server`` said, kept at ``log`` (a server that keeps a log of its own
        beside what it prints keeps that too)."""
        keep_log(server, log)

    def __enter__(self) -> Self:
        try:
            self.lay_tree()
            self.disk.start()
            self.server.start()
            self._naming.enter_context(named(self.server))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self._naming.close()
            if self.server.running:
                self.server.kill()
            self.disk.__exit__(kind, error, traceback)
            self.keep_logs(self.server, self.case_dir / SERVER_LOG)
        finally:
            self.server.close()

    def cut(self) -> Journal:
        """Every server process stops where it is, the disk stops, then they all die."""
        # Listed before the cut: a server whose data directory is gone cannot list them.
        pids = self.server.processes()
        signal_all(pids, signal.SIGSTOP)
        journal = self.disk.cut()
        self.server.kill(pids)
        kept = self.case_dir / DISK_DIRECTORY
        kept.mkdir(exist_ok=True)
        shutil.copyfile(self.disk.root / JOURNAL_FILE, kept / JOURNAL_FILE)
        return journal

    @contextmanager
    def place(
        self, journal: Journal, choice: Choice, state_dir: Path, distinct: DistinctStates
    ) -> Iterator[Placed]:
        """The crash state as the data directory of a server started on it (none is started
        on the bytes of a state placed before)."""
        server = self.new_server()
        try:
            state = self.lay_state(journal, choice, server)
            if not distinct.new_bytes(choice, server.data):
                yield Placed(state, repeated=True)
                return
            store = self.case_dir / STORE_DIRECTORY
            if store.is_dir():  # a child that died before opening the store made none
                shutil.copytree(store, state_dir / STORE_DIRECTORY)
            try:
                server.start()
            except ServerUnavailable as refused:
                yield Placed(state, f"the server did not start on the crash state: {refused}")
                return
            with named(server):
                yield Placed(state)
        finally:
            self.keep_logs(server, state_dir / STATE_SERVER_LOG)
            # The state is thrown away: no checkpoint to wait for.
            server.crash()
            server.close()

    def artifacts(self, relative: Path) -> dict[str, str]:
        return {
            "journal": str(relative / DISK_DIRECTORY / JOURNAL_FILE),
            "server_log": str(relative / SERVER_LOG),
        }
