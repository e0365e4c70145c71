"""The throwaway RabbitMQ node (``servers.rabbitmq``) when it cannot serve: a start that
fails is ``ServerUnavailable`` with the node's words and leaves no process behind (its own
``epmd`` included), a machine without ``rabbitmq-server`` or ``epmd`` is named with the
package to install, and ``rabbitmqctl`` runs as the node's own. A real node's start, its
version, a crash and a start on the same data, and a stop that leaves nothing are in
``tests/systems/libraries/test_dramatiq_rabbitmq.py``, beside dramatiq's durable queues:
one node for both, each start costing seconds.

Every node a test starts is in a ``with`` block: it is stopped and removed also when the
test fails. No test sleeps: each wait is the server's own bounded one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.servers import rabbitmq
from crashqueuelab.servers.base import free_port
from crashqueuelab.servers.rabbitmq import (
    ThrowawayRabbitMQ,
    amqp_ready,
    find_binaries,
)
from tests.servers.test_servers import left_running

needs_rabbitmq = pytest.mark.skipif(find_binaries() is None, reason="no rabbitmq-server here")


def _stand_in(directory: Path, server_script: str) -> Path:
    """A directory of ``rabbitmq-server`` and ``rabbitmqctl`` scripts that stand in for
    RabbitMQ's (the real ``epmd`` is used beside them)."""
    directory.mkdir()
    for name, body in (("rabbitmq-server", server_script), ("rabbitmqctl", "echo 3.10.8")):
        script = directory / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return directory


@needs_rabbitmq
def test_a_node_that_exits_at_start_is_unavailable_with_its_words_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    bindir = _stand_in(tmp_path / "bin", "echo 'ERROR: distribution port in use' >&2; exit 1")
    with ThrowawayRabbitMQ(bindir) as server:
        with pytest.raises(ServerUnavailable, match="distribution port in use") as raised:
            server.start()
        assert raised.value.reason.startswith("rabbitmq-server did not start")
        assert server.processes() == []
        assert server.epmd is None
    assert left_running(server.root) == []


@needs_rabbitmq
def test_a_node_whose_boot_failed_is_unavailable_with_the_vms_reason_not_its_logs_last_line(
    tmp_path: Path,
) -> None:
    # A node that cannot open its AMQP listener stops its applications in order: its own
    # log ends in "Stopping message store", the cause is the VM's last line.
    script = (
        'mkdir -p "$RABBITMQ_LOG_BASE"; '
        'echo "[info] Stopping message store" > "$RABBITMQ_LOG_BASE/$RABBITMQ_NODENAME.log"; '
        'echo "{\\"init terminating in do_boot\\",{error,{could_not_start_listener}}}"; '
        "echo 'init terminating in do_boot ({error,{could_not_start_listener,"
        "127.0.0.1,'$RABBITMQ_NODE_PORT'}})'; exit 1"
    )
    with ThrowawayRabbitMQ(_stand_in(tmp_path / "bin", script)) as server:
        with pytest.raises(ServerUnavailable) as raised:
            server.start()
        said = raised.value.reason
        assert said.startswith("rabbitmq-server did not start: init terminating in do_boot")
        assert f"could_not_start_listener,127.0.0.1,{server.amqp_port}" in said
        assert "Stopping message store" not in said
        assert server.processes() == []
    assert left_running(server.root) == []


@needs_rabbitmq
def test_a_node_whose_distribution_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    """Another process can bind the port the lab chose before the node does: the node's
    start then says ``dist_port_already_used``, which is the lab's race, so the start is
    tried again on a fresh distribution port (the AMQP port, in its clients' URL, stays);
    a node that keeps failing otherwise is unavailable with its own words."""
    tried = tmp_path / "tried"
    script = (
        f'if [ ! -e {tried} ]; then echo "$RABBITMQ_DIST_PORT" > {tried};'
        ' echo "{dist_port_already_used,$RABBITMQ_DIST_PORT,not_erlang}" >&2; exit 1; fi;'
        ' echo "second start: dist $RABBITMQ_DIST_PORT amqp $RABBITMQ_NODE_PORT" >&2; exit 1'
    )
    bindir = _stand_in(tmp_path / "bin", script)
    with ThrowawayRabbitMQ(bindir) as server:
        first_dist, amqp = server.dist_port, server.amqp_port
        with pytest.raises(ServerUnavailable, match="second start") as raised:
            server.start()
        assert tried.read_text().strip() == str(first_dist)
        assert server.dist_port != first_dist
        # Tried twice: the second start's words, not the first's, decided.
        assert server.log.read_text().count("second start") == 1
        assert f"dist {server.dist_port} amqp {amqp}" in raised.value.reason
        assert server.processes() == []
    assert left_running(server.root) == []


@needs_rabbitmq
def test_a_node_that_never_answers_is_killed_when_its_wait_ends(tmp_path: Path) -> None:
    bindir = _stand_in(tmp_path / "bin", "exec sleep 60")
    with ThrowawayRabbitMQ(bindir) as server:
        server.start_timeout_s = 0.3
        with pytest.raises(ServerUnavailable, match="no log"):
            server.start()
        assert server.processes() == []
    assert left_running(server.root) == []


def test_no_rabbitmq_server_installed_is_named_with_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rabbitmq, "DEBIAN_BINARIES", tmp_path / "absent")
    monkeypatch.delenv(rabbitmq.BIN_VARIABLE, raising=False)
    assert find_binaries() is None
    with pytest.raises(ServerUnavailable, match="install Debian's rabbitmq-server") as raised:
        ThrowawayRabbitMQ()
    assert str(raised.value).startswith("rabbitmq server: ")


def test_no_epmd_is_named_with_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rabbitmq, "find_epmd", lambda bindir: None)
    with pytest.raises(ServerUnavailable, match="erlang-base"):
        ThrowawayRabbitMQ(_stand_in(tmp_path / "bin", "exit 1"))


def test_a_failing_rabbitmqctl_is_unavailable_with_what_it_said(tmp_path: Path) -> None:
    bindir = _stand_in(tmp_path / "bin", "exit 1")
    (bindir / "rabbitmqctl").write_text("#!/bin/sh\necho 'node down' >&2\nexit 69\n")
    found = rabbitmq.find_epmd(bindir)
    if found is None:
        pytest.skip("no epmd here")
    refused = r"list_queues failed \(exit 69\): node down"
    with ThrowawayRabbitMQ(bindir) as server:
        with pytest.raises(ServerUnavailable, match=refused):
            server.rabbitmqctl("list_queues")
        # It is run as the node's own: its name, and nothing of the caller's RabbitMQ.
        (bindir / "rabbitmqctl").write_text('#!/bin/sh\necho "$* $HOME $ERL_EPMD_PORT"\n')
        said = server.rabbitmqctl("list_queues").split()
        assert said == ["-n", server.node, "-q", "list_queues", str(server.home),
                        str(server.epmd_port)]  # fmt: skip
        (bindir / "rabbitmqctl").write_text("#!/bin/sh\nexec sleep 5\n")
        with pytest.raises(ServerUnavailable, match="rabbitmqctl status timed out"):
            server.rabbitmqctl("status", timeout_s=0.2)


def test_nothing_answers_amqp_on_a_port_nobody_listens_on() -> None:
    assert not amqp_ready(free_port(), timeout_s=0.5)


def test_a_node_given_an_epmd_port_uses_that_epmd_and_starts_none(tmp_path: Path) -> None:
    bindir = _stand_in(tmp_path / "bin", "exit 1")
    if rabbitmq.find_epmd(bindir) is None:
        pytest.skip("no epmd here")
    port = free_port()
    with ThrowawayRabbitMQ(bindir, epmd_port=port) as server:
        assert not server.own_epmd
        assert server.control_environment()["ERL_EPMD_PORT"] == str(port)
        with pytest.raises(ServerUnavailable):
            server.start()
        assert server.epmd is None


def test_the_version_is_read_where_it_is_installed_or_asked_on_the_nodes_own_epmd_port(
    tmp_path: Path,
) -> None:
    """No Erlang VM for the version where the install's directory names it: a
    ``rabbitmqctl`` run with Erlang's default epmd port leaves an ``epmd -daemon`` behind.
    Elsewhere ``rabbitmqctl version`` is asked with the node's own port."""
    installed = tmp_path / "lib" / "rabbitmq_server-3.99.1" / "sbin"
    installed.parent.mkdir(parents=True)
    _stand_in(installed, "exit 1")
    (installed / "rabbitmqctl").write_text("#!/bin/sh\nexit 1\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("rabbitmq-server", "rabbitmqctl"):
        (bindir / name).symlink_to(installed / name)
    assert ThrowawayRabbitMQ(bindir).read_version() == "3.99.1"
    elsewhere = _stand_in(tmp_path / "elsewhere", "exit 1")
    (elsewhere / "rabbitmqctl").write_text(
        '#!/bin/sh\n[ "$ERL_EPMD_PORT" = 4399 ] && echo 3.10.8 || exit 1\n'
    )
    assert ThrowawayRabbitMQ(elsewhere, epmd_port=4399).read_version() == "3.10.8"
