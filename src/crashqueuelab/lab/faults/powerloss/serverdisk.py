"""A PostgreSQL server whose data directory is on the power-loss disk.

One cluster is made per campaign (``ClusterTemplate``: initdb once, stopped cleanly, as a
freshly installed server is). Each case copies it to the disk's backing tree (it is
durable: it was there before the power came on), mounts the disk as a new server's data
directory and starts the server on it; the case's children use that server. The cut, and
each crash state started as the data directory of another server (WAL recovery runs here,
as after a reboot), are what every server on the disk does (``ondisk.OnDisk``).

The server's background writers are made as slow as their settings allow (the WAL writer
every 10 s, no background page writes, checkpoints hourly): what a commit did not sync
itself is then still unsynced at the cut, which is the worst case a power cut can meet and
makes a catch certain rather than a matter of timing. A commit that syncs (the default,
``synchronous_commit=on``) is unaffected.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from crashqueuelab.lab.faults.powerloss.crashstate import Choice, CrashState, materialize
from crashqueuelab.lab.faults.powerloss.journal import Journal
from crashqueuelab.lab.faults.powerloss.ondisk import SERVER_LOG, STATE_SERVER_LOG, OnDisk
from crashqueuelab.servers.postgres import SETTINGS, ThrowawayServer

__all__ = [
    "SERVER_LOG",
    "SLOW_BACKGROUND",
    "SMALL_CLUSTER",
    "STATE_SERVER_LOG",
    "ClusterTemplate",
    "ServerOnDisk",
]

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


def _server() -> ThrowawayServer:
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


class ServerOnDisk(OnDisk[ThrowawayServer]):
    """One case's server, its data directory mounted from the power-loss disk (a cluster is
    20 MB: its backing tree lives beside the server, in the system temp directory)."""

    #: The server runs as its own account and owns its data directory on the mount.
    shared = True

    def __init__(self, case_dir: Path, template: ClusterTemplate) -> None:
        self.template = template
        super().__init__(case_dir)

    def new_server(self) -> ThrowawayServer:
        return _server()

    def lay_tree(self) -> None:
        """The template's copy becomes the disk's backing tree, and the mount point takes
        its place as the data directory."""
        tree = self.disk.tree
        tree.parent.mkdir(parents=True)
        self.server.adopt(self.template.data)
        self.server.data.rename(tree)
        self.server.data.mkdir()
        self.server.adopt(self.server.data)

    def lay_state(self, journal: Journal, choice: Choice, server: ThrowawayServer) -> CrashState:
        state = materialize(self.disk.root, journal, choice, server.data)
        server.adopt(server.data)
        return state
