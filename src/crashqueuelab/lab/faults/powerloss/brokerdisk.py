"""A system on a RabbitMQ broker, its results in Redis: the broker's machine loses power.

The node's data directory is on the power-loss disk (``rabbitdisk.RabbitOnDisk``), settled
first with what the system declares on its broker for the case's store (its durable
queues: ``System.declare_broker``), as on a node that has been running for a while. The
results' Redis server stands for another machine, as the effect ledger does: the cut does
not touch it. It is the case's own, so that what the cut leaves there can be given whole to
each crash state: at the cut Redis writes its snapshot (``SAVE``), which is kept in the case
directory, and each crash state's node starts beside a Redis server loaded from that
snapshot; a state's recovery then writes results no other state sees.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

from crashqueuelab.judges.resp import RespConnection
from crashqueuelab.lab.faults.powerloss.crashstate import Choice, DistinctStates
from crashqueuelab.lab.faults.powerloss.journal import Journal
from crashqueuelab.lab.faults.powerloss.rabbitdisk import RabbitOnDisk
from crashqueuelab.lab.faults.powerloss.targets import PlacedState
from crashqueuelab.lab.runs.servers import named, started
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY
from crashqueuelab.servers.rabbitmq import ThrowawayRabbitMQ
from crashqueuelab.servers.redis import ThrowawayRedis
from crashqueuelab.systems.contract import System

#: The results' Redis snapshot at the cut, kept in the case directory.
RESULTS_AT_CUT = "results-at-cut.rdb"
#: The name Redis gives its snapshot in its data directory (its default ``dbfilename``).
SNAPSHOT = "dump.rdb"


class BrokerOnDisk:
    """One case's RabbitMQ node on the power-loss disk, and its results' Redis server."""

    def __init__(self, case_dir: Path, system: System) -> None:
        self.case_dir = case_dir
        self.persistence = system.persistence or "rdb"
        declare = system.declare_broker
        store = case_dir / STORE_DIRECTORY

        def settle(node: ThrowawayRabbitMQ) -> None:
            if declare is not None:
                store.mkdir(exist_ok=True)
                declare(store, node.url)

        # The node first: a machine without RabbitMQ refuses it before Redis makes a
        # directory that nothing would remove.
        self.node = RabbitOnDisk(case_dir, settle=settle)
        try:
            self.results = ThrowawayRedis(self.persistence)
        except BaseException:
            self.node.server.close()
            raise
        self._started = ExitStack()

    def __enter__(self) -> Self:
        try:
            # Redis first: the system's declaration may open its results backend too.
            self._started.enter_context(started(self.results))
            self._started.enter_context(self.node)
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
            self._started.close()
        finally:
            # Each closes once; a node never entered still has a directory to remove.
            self.node.server.close()
            self.results.close()

    def cut(self) -> Journal:
        """The node's machine loses power; Redis, on its own machine, writes what it holds."""
        journal = self.node.cut()
        with RespConnection(self.results.socket) as redis:
            redis.command("SAVE")
        shutil.copyfile(self.results.data / SNAPSHOT, self.case_dir / RESULTS_AT_CUT)
        return journal

    @contextmanager
    def place(
        self, journal: Journal, choice: Choice, state_dir: Path, distinct: DistinctStates
    ) -> Iterator[PlacedState]:
        """The crash state as the data directory of a node started on it, beside a Redis
        server holding what the case's held at the cut (none for a state that is not
        judged)."""
        with self.node.place(journal, choice, state_dir, distinct) as placed:
            if placed.repeated or placed.problem is not None:
                yield placed
                return
            with ThrowawayRedis(self.persistence) as results:
                results.prepare()
                shutil.copyfile(self.case_dir / RESULTS_AT_CUT, results.data / SNAPSHOT)
                results.start()
                with named(results):
                    yield placed

    def artifacts(self, relative: Path) -> dict[str, str]:
        return {**self.node.artifacts(relative), "results_at_cut": str(relative / RESULTS_AT_CUT)}
