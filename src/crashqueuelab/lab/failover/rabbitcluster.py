"""A three-node RabbitMQ cluster the run starts: three throwaway nodes (``servers.rabbitmq``),
each its own name, ports and directory, one ``epmd`` they share (the cluster's: a node's
death does not take the others' port mapper with it), one Erlang cookie, joined with
``rabbitmqctl join_cluster``; a queue on it, either a quorum queue or a classic queue
mirrored to every node by a policy, and read by ``rabbitmqctl`` alone.

A failover: the node hosting the queue's leader (a quorum queue's Raft leader, a mirrored
queue's master) is killed (SIGKILL of its Erlang VM and every process below its script),
the survivors elect or promote a new leader, which a survivor's ``rabbitmqctl
list_queues`` then names; the killed node is started again on its own data directory and
rejoins the cluster (a quorum member catches up from the Raft log; a mirror comes back
empty, unsynchronised until the messages it lacks are consumed, as RabbitMQ documents),
ready for the next failover. Every wait is bounded; ``close`` stops every node and the
``epmd``, also when a start fails half way.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.failover.distribution import (
    TICKTIME_S,
    DistributionProxy,
    compile_module,
    find_erlc,
    node_arguments,
)
from crashqueuelab.servers.base import free_port, wait_until
from crashqueuelab.servers.rabbitmq import (
    SETTINGS,
    START_TIMEOUT_S,
    ThrowawayRabbitMQ,
    find_binaries,
    find_epmd,
)

NODES = 3
QUORUM, MIRRORED = "quorum", "mirrored"
QUEUE_TYPES = (QUORUM, MIRRORED)
#: ``ha-sync-mode`` and ``ha-promote-on-failure``'s values (RabbitMQ's defaults first).
SYNC_MODES = ("manual", "automatic")
PROMOTE_ON_FAILURE = ("always", "when-synced")
#: ``cluster_partition_handling``'s values (RabbitMQ's default first).
PARTITION_HANDLING = ("ignore", "pause_minority", "autoheal")
#: RabbitMQ's default for a controlled shutdown; the run's faults are failures, never
#: shutdowns, so it is stated, not varied.
PROMOTE_ON_SHUTDOWN = "when-synced"
POLICY = "crashqueuelab-ha"
#: Every wait for the cluster (a join, an election, a rejoin) is bounded by this.
WAIT_S = 60.0
#: How long one reading in a polling wait may take before it counts as no answer and the
#: next is made (``rabbitmqctl`` answered in up to 4 s on a loaded machine, measured).
READING_S = 20.0
#: What a rejoin that did not come quotes of the cluster's last status.
REJOIN_SAID = ("running_nodes", "disk_nodes", "partitions", "alarms")
#: After a partition, how long the nodes must read as one cluster, no partition reported,
#: before it counts as healed (a report can follow the reconnection by a tick or two).
WHOLE_FOR_S = TICKTIME_S
#: How long the survivors of a kill get to name a new leader before the run counts the
#: queue without one (RabbitMQ took 1 to 4.4 s where it could, measured).
ELECTION_S = 15.0
#: A quorum queue's message counts are the node's statistics, emitted every
#: ``collect_statistics_interval`` (5 s by default): the judges' reading waits less.
STATISTICS_MS = 500
#: A node's name inside an Erlang process id as ``rabbitmqctl`` prints it:
#: ``<crashqueuelab-1a2b3c4d@localhost.1796449251.708.0>``.
_PID_NODE = re.compile(r"<([\w-]+@[\w-]+)\.[\d.]+>")
#: The columns the judges read, by queue type.
COLUMNS = (
    "name", "type", "durable", "policy", "messages", "messages_ready",
    "messages_unacknowledged", "consumers", "pid", "slave_pids", "synchronised_slave_pids",
    "leader", "members", "online",
)  # fmt: skip


class ClusterNode(ThrowawayRabbitMQ):
    """A node of the cluster: the shared ``epmd``, statistics often enough to read, and,
    in a partitionable cluster, its distribution through the lab's proxy
    (``distribution``) with the partition handling the run states."""

    name = "rabbitmq-node"

    def __init__(self, bindir: Path, *, epmd_port: int) -> None:
        # A quorum queue's counts are as of its last tick (quorum_tick_interval, 5 s by
        # default), which rabbitmq.conf cannot set: as often as the statistics here.
        super().__init__(
            bindir,
            epmd_port=epmd_port,
            advanced=f"[{{rabbit, [{{quorum_tick_interval, {STATISTICS_MS}}}]}}].\n",
        )
        #: Set by a partitionable cluster before the first start.
        self.partition_handling: str | None = None
        self.distribution: dict[str, str] = {}

    @property
    def settings(self) -> dict[str, str]:
        extra = {"collect_statistics_interval": str(STATISTICS_MS)}
        if self.partition_handling is not None:
            extra |= {
                "cluster_partition_handling": self.partition_handling,
                "net_ticktime": str(TICKTIME_S),
            }
        return {**super().settings, **extra}

    def control_environment(self) -> dict[str, str]:
        environment = super().control_environment()
        if self.distribution:
            environment |= self.distribution
            # rabbitmqctl's own node must tick as often as the nodes expect.
            environment["RABBITMQ_CTL_ERL_ARGS"] = f"-kernel net_ticktime {TICKTIME_S}"
        return environment

    def prepare(self) -> None:
        super().prepare()
        own = {key: value for key, value in self.settings.items() if key not in SETTINGS}
        with self.config.open("a") as config:
            config.writelines(f"{key} = {value}\n" for key, value in own.items())


def nodes_in(said: str) -> list[str]:
    """The node of each Erlang process id in ``said``, in order."""
    return _PID_NODE.findall(said)


def parse_queues(said: str) -> dict[str, dict[str, Any]]:
    """``rabbitmqctl list_queues`` of ``COLUMNS`` (tab-separated, no headers): per queue, its
    type, counts, and where it lives: ``leader`` (the node of a quorum queue's leader or of
    a classic queue's master), ``members`` and ``online`` (quorum), ``mirrors`` and
    ``synchronised_mirrors`` (classic)."""
    found: dict[str, dict[str, Any]] = {}
    for line in said.splitlines():
        fields = line.split("\t")
        if len(fields) != len(COLUMNS):
            continue
        row = dict(zip(COLUMNS, fields, strict=True))
        entry: dict[str, Any] = {
            "type": row["type"],
            "durable": row["durable"] == "true",
            "policy": row["policy"],
            **{
                key: int(row[key]) if row[key].isdigit() else None
                for key in ("messages", "messages_ready", "messages_unacknowledged", "consumers")
            },
        }
        if row["type"] == "quorum":
            entry["leader"] = row["leader"] or None
            entry["members"] = re.findall(r"[\w-]+@[\w-]+", row["members"])
            entry["online"] = re.findall(r"[\w-]+@[\w-]+", row["online"])
        else:
            masters = nodes_in(row["pid"])
            entry["leader"] = masters[0] if masters else None
            entry["mirrors"] = nodes_in(row["slave_pids"])
            entry["synchronised_mirrors"] = nodes_in(row["synchronised_slave_pids"])
        found[row["name"]] = entry
    return found


class RabbitCluster:
    """Three nodes joined into one cluster; ``kill_leader`` fails a queue over."""

    def __init__(
        self,
        size: int = NODES,
        *,
        bindir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        partition_handling: str | None = None,
    ) -> None:
        """``bindir``: where ``rabbitmq-server`` and ``rabbitmqctl`` are (else Debian's);
        ``partition_handling``: a cluster whose nodes can be partitioned, with that
        ``cluster_partition_handling`` (None: the nodes talk directly)."""
        bindir = bindir or find_binaries()
        if bindir is None:
            raise ServerUnavailable(
                "no rabbitmq-server: install Debian's rabbitmq-server package", "rabbitmq"
            )
        epmd = find_epmd(bindir)
        if epmd is None:
            raise ServerUnavailable("no epmd: install Debian's erlang-base package", "rabbitmq")
        if partition_handling is not None and partition_handling not in PARTITION_HANDLING:
            raise ValueError(f"no partition handling {partition_handling!r}")
        erlc = find_erlc(epmd) if partition_handling is not None else None
        if partition_handling is not None and erlc is None:
            raise ServerUnavailable("no erlc: install Debian's erlang-base package", "rabbitmq")
        self._erlc = erlc
        self._clock = clock
        self.epmd_port = free_port()
        self.nodes = [ClusterNode(bindir, epmd_port=self.epmd_port) for _ in range(size)]
        self._epmd_binary = epmd
        self.epmd: Any = None
        self.down: set[str] = set()
        #: The nodes a partition cuts off now, until the cluster is whole again.
        self.cut: set[str] = set()
        self._restarting: list[_Restart] = []
        self.partition_handling = partition_handling
        self.distribution: DistributionProxy | None = None
        self._modules: Path | None = None
        if partition_handling is not None:
            ports = {node.node: node.dist_port for node in self.nodes}
            self.distribution = DistributionProxy(ports)

    def start(self) -> Self:
        try:
            self.epmd = ThrowawayRabbitMQ.start_epmd(
                self._epmd_binary, self.epmd_port, self.nodes[0].control_environment()
            )
            if self.distribution is not None and self._erlc is not None:
                self._modules = compile_module(
                    Path(tempfile.mkdtemp(prefix="crashqueuelab-erlang-")), self._erlc
                )
                self.distribution.start()
                for node in self.nodes:
                    node.partition_handling = self.partition_handling
                    node.distribution = {
                        **self.distribution.environment(node.node),
                        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": node_arguments(self._modules),
                    }
            cookie = secrets.token_hex(16)
            for node in self.nodes:
                node.home.mkdir(parents=True, exist_ok=True)
                node.cookie.write_text(cookie)
                # Erlang refuses a cookie others can read.
                node.cookie.chmod(0o400)
            self._start_all()
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.rabbitmqctl("stop_app")
                node.rabbitmqctl("join_cluster", first.node)
                node.rabbitmqctl("start_app")
            if not wait_until(lambda: self.running() == self.names, WAIT_S, poll_s=0.1):
                raise ServerUnavailable(
                    f"the nodes did not form one cluster: {self.running()}", "rabbitmq"
                )
        except BaseException:
            self.close()
            raise
        return self

    def _start_all(self) -> None:
        """The nodes boot side by side (each takes seconds); the first failure is raised."""
        failures: list[BaseException] = []

        def boot(node: ClusterNode) -> None:
            try:
                node.start()
            except BaseException as error:  # raised below, in the caller's thread
                failures.append(error)

        threads = [threading.Thread(target=boot, args=(node,)) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(START_TIMEOUT_S * 2)
        if failures:
            raise failures[0]
        if any(thread.is_alive() for thread in threads):
            raise ServerUnavailable("a node did not boot in time", "rabbitmq")

    def close(self) -> None:
        try:
            for restart in self._restarting:
                restart.thread.join(START_TIMEOUT_S * 2)
            # Side by side: each node's stop waits for its VM to end.
            closing = [threading.Thread(target=node.close) for node in self.nodes]
            for thread in closing:
                thread.start()
            for thread in closing:
                thread.join(START_TIMEOUT_S * 2)
        finally:
            if self.epmd is not None:
                self.epmd.kill()
                self.epmd.wait(timeout=START_TIMEOUT_S)
                self.epmd = None
            if self.distribution is not None:
                self.distribution.close()
            if self._modules is not None:
                shutil.rmtree(self._modules, ignore_errors=True)
                self._modules = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def names(self) -> list[str]:
        return sorted(node.node for node in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.node == name)

    def alive(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.node not in self.down and node.running]

    def ctl(self, *arguments: str, on: str | None = None, timeout_s: float = WAIT_S) -> str:
        """``rabbitmqctl`` on node ``on``, else on the first node that runs."""
        if on is None:
            # A node cut off by a partition is asked only by name (it may be paused).
            node = sorted(self.alive(), key=lambda each: each.node in self.cut)[0]
        else:
            node = self.node(on)
        return node.rabbitmqctl(*arguments, timeout_s=timeout_s)

    def status(self, on: str | None = None, timeout_s: float = WAIT_S) -> dict[str, Any]:
        """``cluster_status`` as node ``on`` (else the first that runs) says it; {} where it
        did not answer (in ``timeout_s``)."""
        try:
            said = json.loads(
                self.ctl("cluster_status", "--formatter", "json", on=on, timeout_s=timeout_s)
            )
        except (ServerUnavailable, IndexError, ValueError):
            return {}
        return said if isinstance(said, dict) else {}

    def running(self, on: str | None = None) -> list[str]:
        """The nodes a running node counts as running in its cluster."""
        return sorted(self.status(on).get("running_nodes", []))

    def urls(self, first: str | None = None) -> list[str]:
        """Every node's AMQP URL, ``first``'s (a node name) at the head."""
        ordered = sorted(self.nodes, key=lambda node: node.node != first)
        return [node.url for node in ordered]

    def port_names(self) -> dict[int, str]:
        """Each node's AMQP port -> its name (what a client's connection says)."""
        return {node.amqp_port: node.node for node in self.nodes}

    def set_mirroring(
        self, pattern: str, sync_mode: str, promote_on_failure: str
    ) -> dict[str, Any]:
        """A policy mirroring the queues ``pattern`` matches to every node; its definition."""
        definition = {
            "ha-mode": "all",
            "ha-sync-mode": sync_mode,
            "ha-promote-on-failure": promote_on_failure,
            "ha-promote-on-shutdown": PROMOTE_ON_SHUTDOWN,
        }
        self.ctl("set_policy", POLICY, pattern, json.dumps(definition), "--apply-to", "queues")
        return definition

    def queues(self) -> dict[str, dict[str, Any]]:
        """Every queue as a running node lists it (``parse_queues``)."""
        return parse_queues(self.queues_text())

    def queues_text(self, on: str | None = None) -> str:
        """``rabbitmqctl list_queues`` of ``COLUMNS``, as it printed them."""
        # Bounded: a mirrored queue without a master does not answer.
        return self.ctl("list_queues", "--no-table-headers", "--timeout", "10", *COLUMNS, on=on)

    def queue(self, name: str, on: str | None = None) -> dict[str, Any]:
        return parse_queues(self.queues_text(on)).get(name, {})

    def describe(self) -> dict[str, Any]:
        first = self.nodes[0]
        return {
            "server": f"rabbitmq ({len(self.nodes)}-node cluster)",
            "version": first.version(),
            "nodes": [node.node for node in self.nodes],
            "settings": first.settings,
        }

    def kill_leader(
        self, queue: str, read: Callable[[], object] | None = None, nodes: int = 1
    ) -> dict[str, Any]:
        """The node hosting ``queue``'s leader is killed, with ``nodes`` - 1 more: the
        synchronised mirrors first (a mirrored queue: what is left may be only an
        unsynchronised one), else other members. Returns once a survivor names a new leader
        (``read`` then runs: the judges' reading), the killed nodes starting again in the
        background (``rejoin`` waits for them). Where no survivor takes over within
        ``ELECTION_S`` (a quorum queue without a majority; a mirrored queue that may not
        promote an unsynchronised mirror), that is recorded, the killed nodes are started
        again, and the leader they bring back is awaited."""
        started = self._clock()
        before = self.queue(queue)
        leader = before.get("leader")
        if leader is None or leader not in self.names:
            raise ServerUnavailable(f"no leader to kill for {queue}: {before}", "rabbitmq")
        others = [*before.get("synchronised_mirrors", []), *before.get("mirrors", [])]
        others += [name for name in self.names if name not in others]
        victims = [leader, *[name for name in dict.fromkeys(others) if name != leader]][:nodes]
        record: dict[str, Any] = {"before": before, "killed_node": leader, "killed": victims}
        for name in victims:
            self.node(name).kill()
            self.down.add(name)
        record["primary_killed_s"] = round(self._clock() - started, 6)
        seen: dict[str, Any] = {}

        def elected() -> bool:
            try:
                now = self.queue(queue)
            except ServerUnavailable:
                return False
            seen.update(now)
            return now.get("leader") is not None and now.get("leader") not in victims

        record["survivor_took_over"] = wait_until(elected, ELECTION_S, poll_s=0.05)
        if not record["survivor_took_over"]:
            record["no_leader_while_down"] = dict(seen)
            self._restarting = [_Restart(self.node(name), started, self._clock) for name in victims]
            restarted = self.rejoin(queue)
            if not wait_until(_leader_in(self, queue, seen), WAIT_S, 0.05):
                raise ServerUnavailable(
                    f"no leader of {queue} after the restart: {seen}", "rabbitmq"
                )
            record |= restarted
        record["promoted_s"] = round(self._clock() - started, 6)
        record["after"] = dict(seen)
        record["new_leader"] = seen["leader"]
        if read is not None:
            read()
        if record["survivor_took_over"]:
            self._restarting = [_Restart(self.node(name), started, self._clock) for name in victims]
        return record

    def partition_leader(
        self, queue: str, seconds: float, read: Callable[[], object] | None = None
    ) -> dict[str, Any]:
        """The node hosting ``queue``'s leader is cut from the other two for ``seconds``: every
        distribution connection between them held, none made anew, until the window ends.
        The majority's view is read while the window lasts (``read`` runs on it once its
        nodes name a leader of their own, or at the window's end); the minority's view is
        read too (a paused node does not answer). After the window the cluster is awaited
        whole again: with ``ignore``, RabbitMQ's guide's recovery is the lab's (the nodes of
        the minority stopped and started again, the majority trusted); ``pause_minority``
        and ``autoheal`` heal it themselves."""
        if self.distribution is None:
            raise ValueError("a cluster started without a partition handling cannot be cut")
        started = self._clock()
        before = self.queue(queue)
        leader = before.get("leader")
        if leader is None or leader not in self.names:
            raise ServerUnavailable(f"no leader to cut off for {queue}: {before}", "rabbitmq")
        majority = [name for name in self.names if name != leader]
        record: dict[str, Any] = {
            "fault": "partition",
            "before": before,
            "partitioned": [leader],
            "killed": [],
            "killed_node": None,
            "partition_handling": self.partition_handling,
            "partition_s": seconds,
        }
        window = self.distribution.partition([leader], seconds)
        self.cut = {leader}
        record["primary_killed_s"] = round(self._clock() - started, 6)
        seen: dict[str, Any] = {}

        def elected() -> bool:
            try:
                now = self.queue(queue, on=majority[0])
            except ServerUnavailable:
                return False
            seen.update(now)
            return now.get("leader") not in (None, leader)

        record["survivor_took_over"] = wait_until(elected, seconds, poll_s=0.1)
        record["promoted_s"] = round(self._clock() - started, 6)
        record["majority_view"] = dict(seen)
        record["majority_running"] = self.running(on=majority[0])
        try:
            record["minority_view"] = self.queue(queue, on=leader)
        except ServerUnavailable as error:
            record["minority_view"] = {"unanswered": str(error)[:200]}
        if read is not None:
            read()
        wait_until(lambda: self._clock() >= started + seconds, seconds + 1.0, poll_s=0.05)
        record["healed_s"] = round(self._clock() - started, 6)
        record["window"] = window.to_json(started)
        record |= self._heal(queue, [leader], started)
        return record

    def _heal(self, queue: str, minority: list[str], started: float) -> dict[str, Any]:
        """Once the partition ended: the cluster whole again (bounded), and how it got so.

        The nodes meet again within a tick or two, and may count each other running a moment
        before either reports the partition: the cluster counts as whole only once it has
        read so for ``WHOLE_FOR_S`` on end. A partition reported meanwhile, under
        ``ignore``, is healed as RabbitMQ's guide says: every node of the minority stopped
        and started again, the majority trusted (they restore their state from it)."""
        healed: dict[str, Any] = {"partitions_seen": {}, "restarted": [], "restarted_s": None}
        whole_since: list[float] = []

        def whole() -> bool:
            # One reading per look (each rabbitmqctl takes seconds), from the minority's
            # node, which sees both the partition and who runs.
            status = self.status(on=minority[0])
            found = status.get("partitions") or {}
            reported = dict(found) if isinstance(found, dict) else {"reported": found}
            healed["partitions_seen"].update(reported)
            if reported and self.partition_handling == "ignore" and not healed["restarted"]:
                for name in minority:
                    node = self.node(name)
                    node.stop()
                    node.start_again()
                    healed["restarted"].append(name)
                healed["restarted_s"] = round(self._clock() - started, 6)
            if reported or sorted(status.get("running_nodes", [])) != self.names:
                whole_since.clear()
                return False
            whole_since.append(self._clock())
            return whole_since[-1] - whole_since[0] >= WHOLE_FOR_S

        if not wait_until(whole, WAIT_S, poll_s=0.25):
            raise ServerUnavailable(
                f"the cluster was not whole after the partition: {self.status()}", "rabbitmq"
            )
        self.cut = set()
        healed["rejoined_s"] = round(self._clock() - started, 6)
        healed["rejoined"] = self.queue(queue)
        healed["new_leader"] = healed["rejoined"].get("leader")
        return healed

    def rejoin(self, queue: str) -> dict[str, Any]:
        """Wait (bounded) for the nodes the last ``kill_leader`` killed: started again (in
        the background, while the load goes on) and counted running by the others; seconds
        since their kill, and the queue as read then."""
        restarts, self._restarting = self._restarting, []
        if not restarts:
            return {}
        for restart in restarts:
            restart.thread.join(START_TIMEOUT_S * 2)
            if restart.thread.is_alive() or restart.error is not None:
                raise ServerUnavailable(
                    f"{restart.node.node} did not start again: {restart.error}", "rabbitmq"
                )
            self.down.discard(restart.node.node)
        last: list[dict[str, Any]] = [{}]
        # Asked of a node that was not restarted: one still finishing its boot may take
        # most of the wait to answer one call.
        restarted = {restart.node.node for restart in restarts}
        asked = next((n.node for n in self.alive() if n.node not in restarted), None)

        def rejoined() -> bool:
            last[0] = self.status(on=asked, timeout_s=READING_S)
            return sorted(last[0].get("running_nodes", [])) == self.names

        if not wait_until(rejoined, WAIT_S, poll_s=0.1):
            said = {key: last[0][key] for key in REJOIN_SAID if key in last[0]}
            raise ServerUnavailable(
                f"{restarts[0].node.node} did not rejoin in {WAIT_S:g} s; {asked or 'a node'}"
                f" said last: {said or 'nothing (no answer)'}",
                "rabbitmq",
            )
        return {
            "restarted_s": round(max(each.finished for each in restarts) - restarts[0].started, 6),
            "rejoined_s": round(self._clock() - restarts[0].started, 6),
            "rejoined": self.queue(queue),
        }


class _Restart:
    """A killed node started again in a thread of its own (it takes seconds)."""

    def __init__(self, node: ClusterNode, started: float, clock: Callable[[], float]) -> None:
        self.node = node
        self.started = started
        self.finished = started
        self.error: BaseException | None = None
        self._clock = clock
        self.thread = threading.Thread(target=self._run, name=f"restart {node.node}")
        self.thread.daemon = True
        self.thread.start()

    def _run(self) -> None:
        try:
            self.node.start_again()
        except BaseException as error:  # raised by ``rejoin``, in the caller's thread
            self.error = error
        self.finished = self._clock()


def _leader_in(cluster: RabbitCluster, queue: str, seen: dict[str, Any]) -> Callable[[], bool]:
    """Whether a running node names a leader of ``queue`` (what it said kept in ``seen``)."""

    def named() -> bool:
        try:
            now = cluster.queue(queue)
        except ServerUnavailable:
            return False
        seen.update(now)
        return now.get("leader") is not None

    return named


def mirrored_pattern(queue: str) -> str:
    return f"^{re.escape(queue)}$"
