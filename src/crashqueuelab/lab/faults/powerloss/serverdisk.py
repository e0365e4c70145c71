"""A PostgreSQL server whose data directory is on the power-loss disk.

One cluster is made per campaign (``ClusterTemplate``: initdb once, stopped cleanly, as a
freshly installed server is). Each case copies it to the disk's backing tree (it is
durable: it was there before the power came on), mounts the disk as a new server's data
directory and starts the server on it; the case's children use that server. The cut freezes
every server process (SIGSTOP), stops the disk, then kills them: nothing they do after the
cut reaches the disk. Each crash state is then copied out as the data directory of another
server, which starts on it (WAL recovery runs here, as after a reboot) for the judges and
the recovery workload to use.

The server's background writers are made as slow as their settings allow (the WAL writer
every 10 s, no background page writes, checkpoints hourly): what a commit did not sync
itself is then still unsynced at the cut, which is the worst case a power cut can meet and
makes a catch certain rather than a matter of timing. A commit that syncs (the default,
``synchronous_commit=on``) is unaffected.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.faults.powerloss.crashstate import Choice, materialize
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk
from crashqueuelab.lab.faults.powerloss.journal import JOURNAL_FILE, Journal
from crashqueuelab.lab.faults.powerloss.targets import DISK_DIRECTORY, Placed
from crashqueuelab.lab.runs.servers import naming_server
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY

if TYPE_CHECKING:
    from crashqueuelab.servers.postgres import ThrowawayServer

#: Added to the server's settings for a power-loss campaign (see the module's docstring).
SLOW_BACKGROUND: Mapping[str, str] = {
    "wal_writer_delay": "10000ms",
    "bgwriter_lru_maxpages": "0",
    "checkpoint_timeout": "1h",
    "max_wal_size": "1GB",
}
#: Every case copies the cluster once and each crash state once more: 1 MB WAL segments
#: instead of 16 and no template0 (nothing here creates a database) halve what is copied.
SMALL_CLUSTER = ("--wal-segsize=1",)
SERVER_LOG = "server.log"
STATE_SERVER_LOG = "recovery-server.log"


def _server() -> ThrowawayServer:
    from crashqueuelab.servers.postgres import SETTINGS, ThrowawayServer

    return ThrowawayServer(settings={**SETTINGS, **SLOW_BACKGROUND}, initdb_options=SMALL_CLUSTER)


class ClusterTemplate:
    """A stopped, freshly made cluster that every case of a campaign starts from."""

    def __init__(self) -> None:
        self.server = _server()

    @property
    def data(self) -> Path:
        return self.server.data

    def __enter__(self) -> ClusterTemplate:
        try:
            self.server.start()
            _drop_template0(self.server.dsn)
            self.server.stop("fast")
        except BaseException:
            self.server.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.server.close()


def _drop_template0(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER DATABASE template0 IS_TEMPLATE false")
        conn.execute("DROP DATABASE template0")


def _keep_log(server: ThrowawayServer, target: Path) -> None:
    if server.log.exists():
        shutil.copyfile(server.log, target)


class ServerOnDisk:
    """One case's server, its data directory mounted from the power-loss disk."""

    def __init__(self, case_dir: Path, template: ClusterTemplate) -> None:
        self.case_dir = case_dir
        self.template = template
        self.server = _server()
        # The backing tree lives beside the server, in the system temp directory: a cluster
        # is 20 MB, and what a reader needs (the journal, the logs) is copied to the case.
        self.disk = PowerLossDisk(self.server.root / DISK_DIRECTORY, self.server.data, shared=True)
        self._naming = ExitStack()

    def __enter__(self) -> ServerOnDisk:
        try:
            tree = self.disk.tree
            tree.parent.mkdir(parents=True)
            self.server.adopt(self.template.data)
            # The template's copy becomes the disk's backing tree, and the mount point takes
            # its place as the data directory.
            self.server.data.rename(tree)
            self.server.data.mkdir()
            self.server.adopt(self.server.data)
            self.disk.start()
            self.server.start_again()
            self._naming.enter_context(naming_server(self.server.dsn))
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
                self.server.kill(self.server.processes())
            self.disk.__exit__(kind, error, traceback)
            _keep_log(self.server, self.case_dir / SERVER_LOG)
        finally:
            self.server.close()

    def cut(self) -> Journal:
        """Every server process stops where it is, the disk stops, then they all die."""
        from crashqueuelab.servers.postgres import signal_all

        pids = self.server.processes()
        signal_all(pids, signal.SIGSTOP)
        journal = self.disk.cut()
        self.server.kill(pids)
        kept = self.case_dir / DISK_DIRECTORY
        kept.mkdir(exist_ok=True)
        shutil.copyfile(self.disk.root / JOURNAL_FILE, kept / JOURNAL_FILE)
        return journal

    @contextmanager
    def place(self, journal: Journal, choice: Choice, state_dir: Path) -> Iterator[Placed]:
        """The crash state as the data directory of a server started on it."""
        server = _server()
        try:
            state = materialize(self.disk.root, journal, choice, server.data)
            server.adopt(server.data)
            store = self.case_dir / STORE_DIRECTORY
            if store.is_dir():  # a child that died before opening the store made none
                shutil.copytree(store, state_dir / STORE_DIRECTORY)
            try:
                server.start_again()
            except ServerUnavailable as refused:
                yield Placed(state, f"the server did not start on the crash state: {refused}")
                return
            with naming_server(server.dsn):
                yield Placed(state)
        finally:
            _keep_log(server, state_dir / STATE_SERVER_LOG)
            # The state is thrown away: no checkpoint to wait for.
            server.stop("immediate")
            server.close()

    def artifacts(self, relative: Path) -> dict[str, str]:
        return {
            "journal": str(relative / DISK_DIRECTORY / JOURNAL_FILE),
            "server_log": str(relative / SERVER_LOG),
        }
