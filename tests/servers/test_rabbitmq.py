"""The throwaway RabbitMQ node (``servers.rabbitmq``), on Debian's real ``rabbitmq-server``:
it starts ready on ports and files of its own, names the version its tools report, keeps
its durable metadata across a crash, stops every process it started (its own ``epmd``
too), and a start that fails is ``ServerUnavailable`` and leaves no process behind.

Every node a test starts is in a ``with`` block: it is stopped and removed also when the
test fails. No test sleeps: each wait is the server's own bounded one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.servers import rabbitmq
from crashqueuelab.servers.base import alive
from crashqueuelab.servers.rabbitmq import (
    CONTROL_VARIABLE,
    SETTINGS,
    URL_VARIABLE,
    ThrowawayRabbitMQ,
    amqp_ready,
    control_from,
    find_binaries,
    free_port,
)
from tests.servers.test_servers import left_running

needs_rabbitmq = pytest.mark.skipif(find_binaries() is None, reason="no rabbitmq-server here")


@needs_rabbitmq
def test_a_node_starts_ready_keeps_its_vhosts_across_a_crash_and_leaves_nothing() -> None:
    with ThrowawayRabbitMQ() as server:
        assert server.root.parent == Path(tempfile.gettempdir())
        assert not amqp_ready(server.amqp_port)
        server.start()
        assert amqp_ready(server.amqp_port)
        described = server.describe()
        assert described == {
            "server": "rabbitmq",
            "version": server.rabbitmqctl("version").strip(),
            "settings": dict(SETTINGS),
            "node": server.node,
        }
        assert str(described["version"]).startswith("3.")
        assert server.environment()[URL_VARIABLE].endswith(f":{server.amqp_port}/%2F")
        node, port, cookie = control_from(server.environment()[CONTROL_VARIABLE])
        assert (node, port, cookie) == (server.node, server.epmd_port, server.cookie)
        # Its Mnesia database is in the server's directory, and nowhere else.
        assert (server.data / server.node).is_dir()
        server.rabbitmqctl("add_vhost", "kept-across-a-crash")
        before = server.processes()
        server.restart_after_crash()
        assert not any(alive(pid) for pid in before)
        assert "kept-across-a-crash" in server.rabbitmqctl("list_vhosts").split()
        running = server.processes()
        assert server.epmd is not None
        assert server.epmd.pid in running
        server.stop()
        assert server.processes() == []
        assert not any(alive(pid) for pid in running)
        assert not amqp_ready(server.amqp_port)
    assert not server.root.exists()
    assert left_running(server.root) == []


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
    with ThrowawayRabbitMQ(bindir) as server, pytest.raises(ServerUnavailable, match=refused):
        server.rabbitmqctl("list_queues")


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
