"""The pieces of a partitionable RabbitMQ cluster that need no node: the variables a node's
port mapper module reads, the proxy's paths between the two sides of a cut, the module's
compilation, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.lab.failover import rabbitcluster
from crashqueuelab.lab.failover.distribution import (
    MODULE,
    DistributionProxy,
    compile_module,
    find_erlc,
    node_arguments,
    port_variable,
)
from crashqueuelab.lab.failover.rabbitcluster import RabbitCluster
from crashqueuelab.servers.rabbitmq import find_binaries

A, B, C = "crashqueuelab-aa@localhost", "crashqueuelab-bb@localhost", "crashqueuelab-cc@localhost"


def test_each_node_is_told_the_proxy_port_of_each_peer_under_a_name_a_shell_passes_on() -> None:
    assert port_variable(A) == "CRASHQUEUELAB_DIST_PORT_crashqueuelab_aa"
    distribution = DistributionProxy({A: 1001, B: 1002, C: 1003})
    try:
        told = distribution.environment(A)
        assert set(told) == {port_variable(B), port_variable(C)}
        # Each path leads to its peer's own distribution port, through a port of its own.
        ports = {int(port) for port in told.values()}
        assert len(ports) == 2
        assert not ports & {1001, 1002, 1003}
        cut = distribution.paths_between([A])
        assert sorted(cut) == sorted([f"{A}->{B}", f"{A}->{C}", f"{B}->{A}", f"{C}->{A}"])
        window = distribution.partition([A], 5.0)
        assert set(window.paths) == set(cut)
        assert window.end - window.start == 5.0
        assert distribution.connections() == dict.fromkeys(distribution.proxy.paths, 0)
    finally:
        distribution.close()


def test_a_module_erlc_refuses_is_a_server_unavailable(tmp_path: Path) -> None:
    erlc = tmp_path / "erlc"
    erlc.write_text("#!/bin/sh\necho 'syntax error before: end' >&2\nexit 1\n")
    erlc.chmod(0o755)
    with pytest.raises(ServerUnavailable, match=f"could not compile {MODULE}: syntax error"):
        compile_module(tmp_path / "out", erlc)
    assert find_erlc(tmp_path / "epmd") == erlc
    assert node_arguments(tmp_path) == f"-pa {tmp_path} -epmd_module {MODULE}"


@pytest.mark.skipif(find_binaries() is None, reason="no rabbitmq-server here")
def test_a_cluster_is_partitionable_only_when_asked_and_only_with_erlc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = compile_module(tmp_path / "beam", find_erlc(Path("/usr/bin/epmd")) or Path("erlc"))
    assert (compiled / f"{MODULE}.beam").is_file()
    with pytest.raises(ValueError, match="no partition handling 'split'"):
        RabbitCluster(partition_handling="split")
    plain = RabbitCluster()
    assert plain.distribution is None
    with pytest.raises(ValueError, match="cannot be cut"):
        plain.partition_leader("queue", 1.0)
    plain.close()
    monkeypatch.setattr(rabbitcluster, "find_erlc", lambda epmd: None)
    with pytest.raises(ServerUnavailable, match="no erlc"):
        RabbitCluster(partition_handling="ignore")
