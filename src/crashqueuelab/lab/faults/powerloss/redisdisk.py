"""A Redis server whose data directory is on the power-loss disk.

Each case first starts a server with the system's persistence (``lab.redisserver``) on the
disk's backing tree and stops it, so that the files Redis makes at its first start (the
append-only directory, its base file and manifest) are already there when the power comes
on, as on a server that has been running for a while; then it mounts the disk as a new
server's data directory and starts the server on it; the case's children use it. The cut freezes the
server (SIGSTOP), stops the disk, then kills it: nothing it does after the cut reaches the
disk. Each crash state is then the data directory of another server with the same
persistence, which loads what it finds there (its RDB snapshot or append-only file) as
after a reboot, for the judges and the recovery workload to use. A server that refuses to
load a crash state is reported with its words, as a state that cannot be read.

What a power cut may take back depends only on what Redis synced: ``aof-always`` syncs
each write before answering it, ``aof-everysec`` once a second from a background thread,
``rdb`` when a snapshot is written, ``none`` never writes at all.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from types import TracebackType

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.faults.powerloss.crashstate import Choice, materialize
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk
from crashqueuelab.lab.faults.powerloss.journal import JOURNAL_FILE, Journal
from crashqueuelab.lab.faults.powerloss.targets import DISK_DIRECTORY, Placed
from crashqueuelab.lab.runs.servers import naming
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY
from crashqueuelab.servers.redis import SOCKET_VARIABLE, ThrowawayRedis

SERVER_LOG = "server.log"
STATE_SERVER_LOG = "recovery-server.log"


def _keep_log(server: ThrowawayRedis, target: Path) -> None:
    if server.log.exists():
        shutil.copyfile(server.log, target)


def _settle(tree: Path, persistence: str) -> None:
    """A first start of Redis on ``tree``, which is not yet the disk: what it makes there is
    durable before the case begins."""
    with ThrowawayRedis(persistence) as first:
        first.data = tree
        first.start()


class RedisOnDisk:
    """One case's Redis server, its data directory mounted from the power-loss disk."""

    def __init__(self, case_dir: Path, persistence: str, *, settled: bool = True) -> None:
        """``settled``: False starts the case's server on an empty disk, so that what Redis
        makes at its first start is judged by the cut as well."""
        self.case_dir = case_dir
        self.persistence = persistence
        self.settled = settled
        self.server = ThrowawayRedis(persistence)
        self.disk = PowerLossDisk(self.server.root / DISK_DIRECTORY, self.server.data)
        self._naming = ExitStack()

    def __enter__(self) -> RedisOnDisk:
        try:
            self.disk.tree.mkdir(parents=True)
            if self.settled:
                _settle(self.disk.tree, self.persistence)
            self.server.data.mkdir()
            self.disk.start()
            self.server.start()
            self._naming.enter_context(naming(SOCKET_VARIABLE, str(self.server.socket)))
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
            self.server.kill()
            self.disk.__exit__(kind, error, traceback)
            _keep_log(self.server, self.case_dir / SERVER_LOG)
        finally:
            self.server.close()

    def cut(self) -> Journal:
        """The server stops where it is, the disk stops, then the server dies."""
        for pid in self.server.processes():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        journal = self.disk.cut()
        self.server.kill()
        kept = self.case_dir / DISK_DIRECTORY
        kept.mkdir(exist_ok=True)
        shutil.copyfile(self.disk.root / JOURNAL_FILE, kept / JOURNAL_FILE)
        return journal

    @contextmanager
    def place(self, journal: Journal, choice: Choice, state_dir: Path) -> Iterator[Placed]:
        """The crash state as the data directory of a server started on it."""
        server = ThrowawayRedis(self.persistence)
        try:
            state = materialize(self.disk.root, journal, choice, server.data)
            store = self.case_dir / STORE_DIRECTORY
            if store.is_dir():  # a child that died before opening the store made none
                shutil.copytree(store, state_dir / STORE_DIRECTORY)
            try:
                server.start()
            except ServerUnavailable as refused:
                yield Placed(state, f"the server did not start on the crash state: {refused}")
                return
            with naming(SOCKET_VARIABLE, str(server.socket)):
                yield Placed(state)
        finally:
            _keep_log(server, state_dir / STATE_SERVER_LOG)
            server.close()

    def artifacts(self, relative: Path) -> dict[str, str]:
        return {
            "journal": str(relative / DISK_DIRECTORY / JOURNAL_FILE),
            "server_log": str(relative / SERVER_LOG),
        }
