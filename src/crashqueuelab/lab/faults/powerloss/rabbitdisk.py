"""A RabbitMQ node whose data directory (``RABBITMQ_MNESIA_BASE``) is on the power-loss disk.

Each case first starts a node on the disk's backing tree, lets its caller declare what is
to be there before the power comes on (``settle``: the durable queues), and stops it
cleanly, so that what RabbitMQ makes at its first boot (its Mnesia schema, the feature
flags file, the queues' directories) is durable, as on a node that has been running for a
while; then it mounts the disk as a new node's data directory and starts the node on it;
the case's clients use it. The cut, and each crash state started as the data directory of
another node (which recovers its queues from what it finds there, as after a reboot), are
what every server on the disk does (``ondisk.OnDisk``).

RabbitMQ keeps its database in a directory named after the node (``<MNESIA_BASE>/<node>``,
and its quorum queues' Ra data below it), and each quorum queue's Ra server keeps the
absolute path of its data directory in its own ``config`` file. So every node of a case,
the settling one and the ones started on crash states (one after another), runs with the
node name of the case's node and on the path of its data directory, as a machine that
reboots does: a node of another name would find no database and start empty, a node on
another path would have its quorum queues read and write at the old one (measured: a node
started on a copy at another path ran its quorum queue with the backing tree's path as its
data directory, its log says).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from crashqueuelab.lab.faults.powerloss.crashstate import Choice, CrashState, materialize
from crashqueuelab.lab.faults.powerloss.journal import Journal
from crashqueuelab.lab.faults.powerloss.ondisk import (
    SERVER_LOG,
    STATE_SERVER_LOG,
    OnDisk,
    keep_log,
)
from crashqueuelab.servers.rabbitmq import ThrowawayRabbitMQ

__all__ = ["SERVER_LOG", "STATE_SERVER_LOG", "STATISTICS_MS", "RabbitOnDisk", "Settle"]

#: ``rabbitmqctl list_queues`` says a quorum queue's messages as its last tick counted them
#: (every ``quorum_tick_interval``, 5 s by default; 0 before the first): a crash state's
#: queues are read so, so every node of a case ticks often (measured: a node killed with
#: 25 messages in its quorum queue still listed 0 three seconds after its restart).
STATISTICS_MS = 500
#: What a case does on the settling node before it is stopped (it declares its queues).
Settle = Callable[[ThrowawayRabbitMQ], None]


class RabbitOnDisk(OnDisk[ThrowawayRabbitMQ]):
    """One case's RabbitMQ node, its data directory mounted from the power-loss disk."""

    def __init__(self, case_dir: Path, settle: Settle | None = None) -> None:
        """``settle``: run on the first node, on the backing tree, before it stops (None:
        the node boots and stops, declaring nothing)."""
        self.settle = settle
        #: The case's node name, which every node of the case takes (the first one's).
        self.node: str | None = None
        super().__init__(case_dir)

    def new_server(self) -> ThrowawayRabbitMQ:
        server = ThrowawayRabbitMQ(
            advanced=f"[{{rabbit, [{{quorum_tick_interval, {STATISTICS_MS}}}]}}].\n"
        )
        if self.node is None:
            self.node = server.node
        else:
            # Its database is named after the node: a node of another name finds none.
            server.node = self.node
        return server

    def keep_logs(self, server: ThrowawayRabbitMQ, log: Path) -> None:
        """What its script printed, and the node's own log beside it (``.node.log``): what
        RabbitMQ says of its recovery is there."""
        keep_log(server, log)
        node_log = server.logs / f"{server.node}.log"
        if node_log.is_file():
            shutil.copyfile(node_log, log.with_suffix(".node.log"))

    def lay_tree(self) -> None:
        """The settling node runs on the data directory's own path, which then becomes the
        backing tree; the mount point takes its place."""
        data = self.server.data
        with self.new_server() as first:
            first.data = data
            first.start()
            if self.settle is not None:
                self.settle(first)
            # Stopped cleanly: RabbitMQ syncs and closes its files, as at a planned reboot.
            first.stop()
        self.disk.tree.parent.mkdir(parents=True)
        data.rename(self.disk.tree)
        data.mkdir()

    def lay_state(self, journal: Journal, choice: Choice, server: ThrowawayRabbitMQ) -> CrashState:
        """The crash state at the path of the case's data directory (the mount point, the
        disk gone since the cut), where what the state of an earlier choice left is first
        removed."""
        server.data = self.server.data
        shutil.rmtree(server.data)
        return materialize(self.disk.root, journal, choice, server.data)
