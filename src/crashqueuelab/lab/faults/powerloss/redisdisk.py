"""A Redis server whose data directory is on the power-loss disk.

Each case first starts a server with the system's persistence (``servers.redis``) on the
disk's backing tree and stops it, so that the files Redis makes at its first start (the
append-only directory, its base file and manifest) are already there when the power comes
on, as on a server that has been running for a while; then it mounts the disk as a new
server's data directory and starts the server on it; the case's children use it. The cut,
and each crash state started as the data directory of another server with the same
persistence, which loads what it finds there (its RDB snapshot or append-only file) as
after a reboot, are what every server on the disk does (``ondisk.OnDisk``).

What a power cut may take back depends only on what Redis synced: ``aof-always`` syncs
each write before answering it, ``aof-everysec`` once a second from a background thread,
``rdb`` when a snapshot is written, ``none`` never writes at all.
"""

from __future__ import annotations

from pathlib import Path

from crashqueuelab.lab.faults.powerloss.crashstate import Choice, CrashState, materialize
from crashqueuelab.lab.faults.powerloss.journal import Journal
from crashqueuelab.lab.faults.powerloss.ondisk import SERVER_LOG, STATE_SERVER_LOG, OnDisk
from crashqueuelab.servers.redis import ThrowawayRedis

__all__ = ["SERVER_LOG", "STATE_SERVER_LOG", "RedisOnDisk"]


def _settle(tree: Path, persistence: str) -> None:
    """A first start of Redis on ``tree``, which is not yet the disk: what it makes there is
    durable before the case begins."""
    with ThrowawayRedis(persistence) as first:
        first.data = tree
        first.start()


class RedisOnDisk(OnDisk[ThrowawayRedis]):
    """One case's Redis server, its data directory mounted from the power-loss disk."""

    def __init__(self, case_dir: Path, persistence: str, *, settled: bool = True) -> None:
        """``settled``: False starts the case's server on an empty disk, so that what Redis
        makes at its first start is judged by the cut as well."""
        self.persistence = persistence
        self.settled = settled
        super().__init__(case_dir)

    def new_server(self) -> ThrowawayRedis:
        return ThrowawayRedis(self.persistence)

    def lay_tree(self) -> None:
        self.disk.tree.mkdir(parents=True)
        if self.settled:
            _settle(self.disk.tree, self.persistence)
        self.server.data.mkdir()

    def lay_state(self, journal: Journal, choice: Choice, server: ThrowawayRedis) -> CrashState:
        return materialize(self.disk.root, journal, choice, server.data)
