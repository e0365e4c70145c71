"""Chaos with network faults on the PostgreSQL system, against a real server: each process
reaches it through the fault proxy, every kind of fault lands, and nothing is lost."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.cli.replay import replayed
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.faults.network.plan import NetworkPlan, RunNetwork, run_server, upstream_of
from crashqueuelab.servers.redis import SOCKET_VARIABLE
from tests.conftest import RunCli


def test_chaos_with_every_network_fault_loses_nothing_and_shades_each_window(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    directory = tmp_path / "x"
    outcome = run_cli(
        "chaos", "--system", "postgres", "--dsn", postgres_dsn, "--seed", "7", "--jobs", "500",
        "--workers", "3", "--kills", "6", "--pauses", "1", "--stalls", "2", "--partitions", "1",
        "--lost-replies", "2", "--connection-resets", "2", "--latency-ms", "1",
        "--lease-ms", "300", "--quiet", "--output-directory", str(directory),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["reasons"]
    assert outcome.result["network_faults_delivered"] == {
        "stall": 2,
        "partition": 1,
        "lost replies": 2,
        "connection reset": 2,
    }
    accounting = outcome.result["accounting"]
    assert (accounting["succeeded"], accounting["lost"], accounting["duplicated_effects"]) == (
        500,
        0,
        0,
    )
    assert accounting["acknowledged_twice"] == 0
    assert accounting["judge_ok"]
    report = json.loads((directory / "chaos.json").read_text())
    network = report["network"]
    assert network["plan"]["window_ms"] == 450
    kinds = [window["kind"] for window in network["windows"]]
    assert sorted(kinds) == ["lost-replies"] * 2 + ["partition"] + ["reset"] * 2 + ["stall"] * 2
    partition = next(w for w in network["windows"] if w["kind"] == "partition")
    assert set(partition["paths"]) == {"maintenance", "worker-0", "worker-1", "worker-2"}
    assert partition["end_s"] - partition["start_s"] == pytest.approx(0.45)
    # Every worker and the maintenance process went through the proxy.
    assert all(counts["connections"] >= 1 for counts in network["paths"].values())
    page = (directory / "report.html").read_text()
    assert "cut the server off from every process" in page
    assert "shaded: a stalled connection" in page
    # The replay carries the network faults with the rest of the schedule.
    again = replayed(directory)
    assert (again["stalls"], again["partitions"], again["lost_replies"]) == (2, 1, 2)
    assert (again["connection_resets"], again["latency_ms"], again["network_fault_ms"]) == (
        2,
        1.0,
        450,
    )


def test_a_partition_of_one_worker_spares_the_others_and_a_bandwidth_limit_holds_all_run(
    postgres_dsn: str, tmp_path: Path, run_cli: RunCli
) -> None:
    directory = tmp_path / "x"
    outcome = run_cli(
        "chaos", "--system", "postgres", "--dsn", postgres_dsn, "--seed", "5", "--jobs", "300",
        "--workers", "3", "--kills", "2", "--pauses", "0", "--partitions", "2",
        "--partition-workers", "1", "--bandwidth-bytes-s", "200000", "--lease-ms", "300",
        "--quiet", "--output-directory", str(directory),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["reasons"]
    assert outcome.result["network_faults_delivered"]["partition"] == 2
    accounting = outcome.result["accounting"]
    assert (accounting["lost"], accounting["duplicated_effects"]) == (0, 0)
    assert accounting["acknowledged_twice"] == 0
    report = json.loads((directory / "chaos.json").read_text())
    partitions = [w for w in report["network"]["windows"] if w["kind"] == "partition"]
    assert [len(window["paths"]) for window in partitions] == [1, 1]
    assert all(window["paths"][0].startswith("worker-") for window in partitions)
    limits = [w for w in report["network"]["windows"] if w["kind"] == "bandwidth"]
    assert limits == []  # run-long limits are the plan's, not windows on the timeline
    assert report["network"]["plan"]["bandwidth_bytes_s"] == 200000
    assert report["network"]["plan"]["partition_workers"] == 1
    page = (directory / "report.html").read_text()
    assert f"cut {partitions[0]['paths'][0]} off from the server" in page
    assert "at most 200,000 bytes/s each way" in page
    again = replayed(directory)
    assert (again["partition_workers"], again["bandwidth_bytes_s"]) == (1, 200000)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--system", "sqlite", "--stalls", "1"], "network"),
        (["--system", "postgres", "--network-fault-ms", "0", "--stalls", "1"], "network_fault_ms"),
    ],
)
def test_network_faults_the_run_cannot_deliver_are_refused_up_front(
    postgres_dsn: str, tmp_path: Path, extra: list[str], field: str, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", *extra, "--dsn", postgres_dsn, "--jobs", "100", "--kills", "0",
        "--pauses", "0", "--output-directory", str(tmp_path / "x"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["field"] == field
    assert not (tmp_path / "x").exists()


def test_a_proxy_path_is_named_as_a_dsn_the_client_can_use(postgres_dsn: str) -> None:
    upstream, through = upstream_of(postgres_dsn)
    assert isinstance(upstream, str)
    assert upstream.endswith("/.s.PGSQL.5432")
    dsn = through(("127.0.0.1", 40001))
    assert "host=127.0.0.1" in dsn
    assert "port=40001" in dsn
    tcp, _ = upstream_of("host=db.example port=6543 dbname=q")
    assert tcp == ("db.example", 6543)


def test_a_rabbitmq_node_is_reached_through_tcp_paths_named_as_amqp_urls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashqueuelab.servers.rabbitmq import URL_VARIABLE

    monkeypatch.delenv(URL_VARIABLE, raising=False)
    with pytest.raises(InvalidInput, match="the run's RabbitMQ node"):
        run_server("rabbitmq")
    monkeypatch.setenv(URL_VARIABLE, "amqp://guest:guest@127.0.0.1:41234/%2F")
    server = run_server("rabbitmq")
    assert (server.variable, server.upstream, server.unix) == (
        URL_VARIABLE, ("127.0.0.1", 41234), False,
    )  # fmt: skip
    assert server.through(("127.0.0.1", 50001)) == "amqp://guest:guest@127.0.0.1:50001/%2F"
    # A URL without credentials or a port: AMQP's own port, and none added.
    monkeypatch.setenv(URL_VARIABLE, "amqp://node.example/vhost")
    bare = run_server("rabbitmq")
    assert bare.upstream == ("node.example", 5672)
    assert bare.through(("127.0.0.1", 50002)) == "amqp://127.0.0.1:50002/vhost"
    monkeypatch.setenv(URL_VARIABLE, "amqps://u:p@node.example/")
    assert run_server("rabbitmq").upstream == ("node.example", 5671)


def test_a_redis_server_is_reached_through_unix_socket_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(SOCKET_VARIABLE, raising=False)
    with pytest.raises(InvalidInput, match="the run's Redis server"):
        run_server("redis")
    monkeypatch.setenv(SOCKET_VARIABLE, str(tmp_path / "redis.sock"))
    server = run_server("redis")
    assert (server.variable, server.upstream, server.unix) == (
        SOCKET_VARIABLE, str(tmp_path / "redis.sock"), True,
    )  # fmt: skip
    assert server.through(("/tmp/x/worker-0.sock", 0)) == "/tmp/x/worker-0.sock"
    # Each path's listener is a socket file in a directory of the run's own, gone after it.
    with RunNetwork(NetworkPlan(stalls=1), server=server, lease_ms=400, started=0.0) as network:
        named = dict(network.inherited("worker-0").environment)[SOCKET_VARIABLE]
        assert named.endswith("/worker-0.sock")
        assert Path(named).is_socket()
    assert not Path(named).parent.exists()


def test_a_network_plan_checks_itself_and_reads_back_what_it_wrote() -> None:
    plan = NetworkPlan(stalls=1, partitions=2, lost_replies=3, connection_resets=4, latency_ms=5)
    assert plan.faults == 10
    assert plan.window_s(400) == pytest.approx(0.6)
    assert NetworkPlan.from_json(plan.to_json(400)) == NetworkPlan(1, 2, 3, 4, 5.0, 600.0)
    assert not NetworkPlan().active
    assert NetworkPlan(latency_ms=1).active
    with pytest.raises(InvalidInput, match="stall"):
        NetworkPlan(stalls=-1).check()
    with pytest.raises(InvalidInput, match="latency_ms"):
        NetworkPlan(latency_ms=-1).check()
    with pytest.raises(InvalidInput, match="partition_workers"):
        NetworkPlan(partitions=1, partition_workers=0).check()
    with pytest.raises(InvalidInput, match="bandwidth_bytes_s"):
        NetworkPlan(bandwidth_bytes_s=-1).check()
    assert NetworkPlan(bandwidth_bytes_s=1).active
    partial = NetworkPlan(partitions=1, partition_workers=2, bandwidth_bytes_s=5.0)
    assert NetworkPlan.from_json(partial.to_json(400)) == replace(partial, window_ms=600.0)
    assert partial.partition_paths(2, 3) == ["worker-2", "worker-0"]
    assert partial.partition_paths(0, 1) == ["worker-0"]
    assert NetworkPlan(partitions=1).partition_paths(0, 3) is None


@pytest.mark.parametrize("value", ["soon", "-1", "inf"])
def test_a_latency_that_is_not_a_number_of_milliseconds_is_a_usage_error(
    tmp_path: Path, value: str, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", "--system", "postgres", "--latency-ms", value,
        "--output-directory", str(tmp_path / "x"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_USAGE
    assert "milliseconds" in json.dumps(outcome.result) or "finite" in json.dumps(outcome.result)
    assert not (tmp_path / "x").exists()
