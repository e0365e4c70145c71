"""A queue on a real three-node RabbitMQ cluster (Debian's rabbitmq-server), the node hosting
its leader killed under a pika load with publisher confirms and manual acknowledgements:
a quorum queue and a classic mirrored queue side by side on one cluster (it takes seconds
to start, so both runs share it), each judged from the files its run kept.

Skipped only without rabbitmq-server (or pika, which the dramatiq extra brings). The cluster
is stopped when the module's tests end, also when one fails; every wait is bounded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crashqueuelab.cli.failover import rabbitmq_result
from crashqueuelab.core.errors import InvalidInput, ServerUnavailable
from crashqueuelab.lab.failover import rabbitcluster, rabbitrun
from crashqueuelab.lab.failover.rabbitcluster import RabbitCluster
from crashqueuelab.lab.failover.rabbitrun import run_rabbit_failover
from crashqueuelab.lab.pages.render import write_report
from crashqueuelab.servers.base import alive
from crashqueuelab.servers.rabbitmq import CRASH_DUMP, ThrowawayRabbitMQ, find_binaries
from tests.conftest import RunCli

pytest.importorskip("pika", reason="pika (the dramatiq extra) drives the load")
pytestmark = pytest.mark.skipif(find_binaries() is None, reason="no rabbitmq-server here")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    # Partitionable, with RabbitMQ's default handling: the kills and the partitions share
    # one cluster start (the nodes' distribution through the proxy changes nothing a kill
    # does: the dead node's connections end either way).
    with RabbitCluster(partition_handling="ignore") as started:
        yield started
    assert not any(alive(pid) for node in started.nodes for pid in node.processes())


@pytest.mark.cluster
def test_three_nodes_form_one_cluster_sharing_an_epmd_and_a_cookie(cluster: RabbitCluster) -> None:
    assert len(cluster.nodes) == 3
    assert cluster.running() == cluster.names
    assert {node.epmd_port for node in cluster.nodes} == {cluster.epmd_port}
    assert len({node.cookie.read_text() for node in cluster.nodes}) == 1
    assert len({node.amqp_port for node in cluster.nodes}) == 3
    assert all(not node.own_epmd and node.epmd is None for node in cluster.nodes)
    # Every connection between two nodes went through the proxy: each node dialled the
    # proxy's path to a peer, never the peer's own port.
    assert cluster.distribution is not None
    dialled = cluster.distribution.connections()
    assert len(dialled) == 6
    for node in cluster.nodes:
        peers = [other.node for other in cluster.nodes if other is not node]
        assert any(
            dialled[f"{node.node}->{peer}"] or dialled[f"{peer}->{node.node}"] for peer in peers
        )
        assert node.settings["cluster_partition_handling"] == "ignore"
        assert "net_ticktime = 4" in node.config.read_text()
    described = cluster.describe()
    assert str(described["version"]).startswith("3.")
    assert described["nodes"] == [node.node for node in cluster.nodes]


@pytest.mark.cluster
def test_a_quorum_and_a_mirrored_queue_each_lose_no_confirmed_job_when_the_leader_dies(
    cluster: RabbitCluster, tmp_path: Path
) -> None:
    records = {}
    for queue_type in ("quorum", "mirrored"):
        out = tmp_path / queue_type
        records[queue_type] = record = run_rabbit_failover(
            # The deadline bounds a drain that ends once the queue reads empty: a busy
            # machine's slower election and rejoin take no more than this.
            out,
            queue_type=queue_type,
            failovers=1,
            jobs=150,
            deadline_s=90.0,
            cluster=cluster,
        )
        failover = record["failovers"][0]
        # The node killed was the one hosting the leader, and a survivor leads after it.
        assert failover["killed_node"] == failover["before"]["leader"]
        assert failover["new_leader"] != failover["killed_node"]
        assert failover["producer_running"]
        assert failover["cut_at_s"] <= failover["killed_at_s"] <= failover["promoted_at_s"]
        # The killed node was started again and rejoined: the next run finds three nodes.
        assert cluster.running() == cluster.names
        assert failover["promoted_s"] < failover["restarted_s"] <= failover["rejoined_s"]
        findings = record["findings"]
        # Every job confirmed, and (the queue drained empty) every one delivered.
        assert findings["enqueues_acknowledged"] == 150, record["headline"]
        assert record["drained"]
        assert record["final_store"]["queue"]["messages"] == 0
        # Neither promise allows losing a confirmed message here (a majority lived; a
        # synchronised mirror was there): none lost.
        assert findings["counts"]["lost_enqueues"] == 0, findings["lost_enqueues"]
        assert findings["broken_promises"] == 0
        assert record["keeps_its_promises"], record["headline"]
        # Every figure comes from the files kept beside the record.
        ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
        confirmed = {event["key"] for event in ledger if event["event"] == "enqueued"}
        assert len(confirmed) == 150
        assert (out / "failover-1" / "after-the-kill" / "queues.txt").is_file()
        assert record["server"]["queue"] in (out / "final" / "queues.txt").read_text()
        # The clients of the killed node were told, and reconnected to a survivor.
        assert any("StreamLostError" in name for name in record["callers_told_failure"])
    quorum, mirrored = records["quorum"], records["mirrored"]
    assert quorum["failovers"][0]["before"]["online"] == quorum["failovers"][0]["before"]["members"]
    assert len(mirrored["failovers"][0]["before"]["synchronised_mirrors"]) == 2
    assert mirrored["server"]["policy"] == {
        "ha-mode": "all",
        "ha-sync-mode": "manual",
        "ha-promote-on-failure": "always",
        "ha-promote-on-shutdown": "when-synced",
    }
    # What the command prints for such a run, from its record.
    code, result = rabbitmq_result(quorum, tmp_path / "quorum")
    assert code == (0 if quorum["ok"] else 1)
    assert result["counts"]["lost_enqueues"] == 0
    assert result["failovers"][0]["killed"] == [quorum["failovers"][0]["killed_node"]]
    assert result["failovers"][0]["survivor_took_over"]
    assert result["report"] == str(tmp_path / "quorum" / "report.html")
    page = write_report(tmp_path / "mirrored").read_text()
    assert "If there is no mirror that is synchronised with the leader" in page
    assert "https://www.rabbitmq.com/docs/3.13/ha#behaviour" in page
    assert "--system rabbitmq --queue-type mirrored --ha-sync-mode manual" in page
    page = write_report(tmp_path / "quorum").read_text()
    assert "quorum-queues#data-safety" in page


@pytest.mark.cluster
def test_a_queue_with_no_leader_is_refused_and_each_node_named_by_its_port(
    cluster: RabbitCluster,
) -> None:
    with pytest.raises(ServerUnavailable, match="no leader to kill"):
        cluster.kill_leader("no-such-queue")
    assert sorted(cluster.port_names().values()) == cluster.names
    first = cluster.nodes[1].node
    assert cluster.urls(first)[0] == cluster.nodes[1].url


@pytest.mark.cluster
def test_a_rejoin_that_does_not_come_names_the_node_asked_and_what_it_said_last(
    cluster: RabbitCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first node as if it had been killed and started again (its restart done), and a
    # fourth name the cluster never runs: the wait for every name to run ends unmet.
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    restart = SimpleNamespace(node=cluster.nodes[0], thread=done, error=None, started=0.0)
    names = [*cluster.names, "rabbit-never@localhost"]
    monkeypatch.setattr(cluster, "_restarting", [restart])
    monkeypatch.setattr(RabbitCluster, "names", property(lambda _: names))
    monkeypatch.setattr(rabbitcluster, "WAIT_S", 1.0)
    with pytest.raises(ServerUnavailable) as refused:
        cluster.rejoin("no-such-queue")
    said = str(refused.value)
    # Asked of a node that was not restarted, which answered with the three that run.
    assert f"did not rejoin in 1 s; {cluster.nodes[1].node} said last: " in said
    assert "'running_nodes': [" in said
    assert all(node.node in said for node in cluster.nodes)


def test_what_each_node_said_is_kept_where_the_cluster_does_not_keep_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not started: the first node as if its VM had written its log and gone, and a run on
    # it that the cluster fails (its rejoin, say).
    def failing(*_: object) -> dict[str, Any]:
        raise ServerUnavailable("a node did not rejoin in 60 s", "rabbitmq")

    monkeypatch.setattr(rabbitrun, "_run", failing)
    unstarted = RabbitCluster(size=2)
    try:
        first, second = unstarted.nodes
        first.logs.mkdir(parents=True, exist_ok=True)
        (first.logs / f"{first.node}.log").write_text("booting\nconnection_closed_abruptly\n")
        said = rabbitrun.keep_logs(unstarted, tmp_path / "kept")
        with pytest.raises(ServerUnavailable) as failed:
            run_rabbit_failover(tmp_path / "run", cluster=unstarted)
    finally:
        unstarted.close()
    assert said == [
        f"{first.node} not running, its log ends: booting / connection_closed_abruptly",
        f"{second.node} not running, its log ends: no log",
    ]
    kept = tmp_path / "kept" / first.node / f"{first.node}.log"
    assert kept.read_text() == "booting\nconnection_closed_abruptly\n"
    assert not (tmp_path / "kept" / second.node).exists()
    # The run's error says the same, and the run's directory keeps the logs.
    assert str(failed.value) == (
        f"rabbitmq server: a node did not rejoin in 60 s (the nodes: {'; '.join(said)};"
        f" their logs: {tmp_path / 'run' / 'nodes'})"
    )
    assert (tmp_path / "run" / "nodes" / first.node / f"{first.node}.log").is_file()


def test_a_node_that_answers_no_ping_is_asked_for_its_crash_dump_which_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first node as if its VM ran and answered nothing; the second as if it ran and
    # answered (a real node's dump: tests/systems/libraries/test_dramatiq_rabbitmq.py).
    unstarted = RabbitCluster(size=2)
    first, second = unstarted.nodes
    asked: list[tuple[str, float]] = []

    def answers(node: ThrowawayRabbitMQ, timeout_s: float) -> bool:
        asked.append((node.node, timeout_s))
        return node is second

    def dump(node: ThrowawayRabbitMQ) -> Path:
        assert node is first
        node.logs.mkdir(parents=True, exist_ok=True)
        (node.logs / CRASH_DUMP).write_text("=erl_crash_dump:0.5\nSlogan: Received SIGUSR1\n")
        return node.logs / CRASH_DUMP

    monkeypatch.setattr(ThrowawayRabbitMQ, "running", property(lambda _: True))
    monkeypatch.setattr(ThrowawayRabbitMQ, "answers", answers)
    monkeypatch.setattr(ThrowawayRabbitMQ, "dump", dump)
    try:
        said = rabbitrun.keep_logs(unstarted, tmp_path / "kept")
    finally:
        monkeypatch.undo()
        unstarted.close()
    assert asked == [(first.node, rabbitrun.PING_S), (second.node, rabbitrun.PING_S)]
    assert said == [
        f"{first.node} running, answered no ping in 15 s: its VM's crash dump kept"
        f" ({CRASH_DUMP}), its log ends: no log",
        f"{second.node} running, its log ends: no log",
    ]
    kept = tmp_path / "kept" / first.node / CRASH_DUMP
    assert "Slogan: Received SIGUSR1" in kept.read_text()
    assert not (tmp_path / "kept" / second.node).exists()


def test_a_node_that_cannot_start_leaves_no_process_and_no_directory(tmp_path: Path) -> None:
    # Scripts standing in for RabbitMQ's: the second node's exits at once, as a node whose
    # port is taken does; the first's waits to be stopped.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    failing = (
        'case "$RABBITMQ_NODENAME" in *) [ -e "$HOME/../fail" ] && exit 1; exec sleep 60;; esac'
    )
    for name, body in (("rabbitmq-server", failing), ("rabbitmqctl", "echo 3.10.8")):
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    cluster = RabbitCluster(size=2, bindir=bindir)
    for node in cluster.nodes:
        node.start_timeout_s = 1.0
    (cluster.nodes[1].root / "fail").touch()
    with pytest.raises(ServerUnavailable, match="did not start"):
        cluster.start()
    assert all(node.processes() == [] for node in cluster.nodes)
    assert cluster.epmd is None
    assert not any(node.root.exists() for node in cluster.nodes)


def test_rabbitmq_options_are_refused_where_they_mean_nothing(
    run_cli: RunCli, tmp_path: Path
) -> None:
    for argv, field in (
        (["--system", "rabbitmq", "--synchronous-commit", "on"], "synchronous_commit"),
        (["--system", "rabbitmq", "--min-replicas-to-write", "1"], "min_replicas_to_write"),
        (["--system", "rabbitmq", "--terminate-waiting"], "terminate_waiting"),
        (["--system", "rabbitmq", "--ha-sync-mode", "automatic"], "ha_sync_mode"),
        (["--queue-type", "quorum"], "queue_type"),
        (["--system", "rq", "--ha-promote-on-failure", "always"], "ha_promote_on_failure"),
        (["--nodes-killed", "2"], "nodes_killed"),
        (["--partition-s", "5"], "partition_s"),
        (["--system", "rabbitmq", "--partition-s", "5"], "partition_s"),
        (["--system", "rabbitmq", "--partition-handling", "autoheal"], "partition_s"),
        (
            [
                "--system",
                "rabbitmq",
                "--partition-s",
                "5",
                "--partition-handling",
                "ignore",
                "--nodes-killed",
                "1",
            ],
            "nodes_killed",
        ),
    ):
        run = run_cli("failover", *argv, "--output-directory", tmp_path / "no")
        assert run.code == 2, run.result
        assert run.result["error"]["field"] == field
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"queue_type": "classic"}, "queue_type"),
        ({"sync_mode": "eager"}, "ha_sync_mode"),
        ({"promote_on_failure": "never"}, "ha_promote_on_failure"),
        ({"failovers": 0}, "failovers"),
        ({"nodes_killed": 3}, "nodes_killed"),
        ({"work_ms": -1}, "work_ms"),
        ({"partition_handling": "heal", "partition_s": 5.0}, "partition_handling"),
        ({"partition_s": 5.0}, "partition_s"),
        ({"partition_handling": "ignore"}, "partition_s"),
        ({"partition_handling": "ignore", "partition_s": -1.0}, "partition_s"),
        ({"partition_handling": "ignore", "partition_s": 5.0, "nodes_killed": 2}, "nodes_killed"),
    ],
)
def test_a_run_it_could_not_make_is_refused_before_anything_starts(
    options: dict[str, Any], field: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInput) as refused:
        run_rabbit_failover(tmp_path / "no", **options)
    assert refused.value.field == field
    assert not (tmp_path / "no").exists()


@pytest.mark.cluster
def test_a_partition_splits_a_mirrored_queue_in_two_and_a_quorum_queue_keeps_one_leader(
    cluster: RabbitCluster, tmp_path: Path
) -> None:
    """The leader's node cut from the other two under load (the workers slower than the
    producer, so the queue holds a backlog): a mirrored queue gets a leader on each side, as
    RabbitMQ's guide says of ``ignore``, and the lab recovers as the guide says (the
    minority's node stopped and started again), giving up what that side held; a quorum
    queue's minority makes no progress and nothing confirmed is lost."""
    records = {}
    for queue_type in ("quorum", "mirrored"):
        out = tmp_path / queue_type
        records[queue_type] = record = run_rabbit_failover(
            out,
            queue_type=queue_type,
            failovers=1,
            jobs=600,
            work_ms=30,
            partition_handling="ignore",
            # Long enough for the majority to notice (net_ticktime, 4 s), elect and answer
            # rabbitmqctl on a busy machine (up to 13.7 s measured).
            partition_s=15.0,
            deadline_s=60.0,
            cluster=cluster,
        )
        failover = record["failovers"][0]
        cut = failover["before"]["leader"]
        assert failover["fault"] == "partition"
        assert failover["partitioned"] == [cut]
        assert failover["killed"] == []
        # The majority named a leader of its own while the window lasted.
        assert failover["survivor_took_over"], failover["majority_view"]
        assert failover["majority_view"]["leader"] != cut
        assert cut not in failover["majority_running"]
        assert failover["promoted_s"] < failover["healed_s"] <= failover["rejoined_s"]
        assert (out / "failover-1" / "during-the-partition" / "queues.txt").is_file()
        # Both sides met again and said they had been partitioned; the lab restarted the
        # minority's node, and the next run finds three nodes.
        assert failover["partitions_seen"], failover
        assert failover["restarted"] == [cut]
        assert cluster.running() == cluster.names
        assert not cluster.cut
        assert record["parameters"]["fault"] == "partition"
        assert record["findings"]["broken_promises"] == 0, record["headline"]
        assert record["judged"], record["reasons"]
    quorum, mirrored = records["quorum"], records["mirrored"]
    assert quorum["findings"]["counts"]["lost_enqueues"] == 0, quorum["findings"]["lost_enqueues"]
    assert "partition_handling: ignore" in quorum["findings"]["promise"]["setting"]
    # The cut-off node kept a leader of its own: the split brain the guide describes.
    minority = mirrored["failovers"][0]["minority_view"]
    assert minority["leader"] == mirrored["failovers"][0]["partitioned"][0], minority
    promise = mirrored["findings"]["promise"]
    assert promise["allows_loss"]
    assert not promise["lost_only_unsynchronised"]
    assert "one leader on each side of the partition" in promise["partition"]
    code, result = rabbitmq_result(mirrored, tmp_path / "mirrored")
    assert code == (0 if mirrored["ok"] else 1)
    assert result["failovers"][0]["partitioned"] == mirrored["failovers"][0]["partitioned"]
    assert result["failovers"][0]["restarted_by_the_lab"] == [minority["leader"]]
    assert result["failovers"][0]["minority_answered"]
    page = write_report(tmp_path / "mirrored").read_text()
    assert "--partition-s 15 --partition-handling ignore" in page
    assert (
        "partitions of the leader&#39;s node" in page or "partitions of the leader's node" in page
    )
