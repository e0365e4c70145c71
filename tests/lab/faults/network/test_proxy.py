"""The fault proxy on real sockets: a client on 127.0.0.1, an echo server on a Unix socket,
and each fault window observed from both ends."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import Condition, FaultWindow, WindowKind

#: Every wait below is bounded by this.
LIMIT_S = 10.0
#: How long a fault window lasts in these tests: long enough to see nothing pass for half
#: of it, though a loaded host delay the check by a good part of that half.
WINDOW_S = 1.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: _EchoServer = self.server  # type: ignore[assignment]
        with server.lock:
            server.connections += 1
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            with server.lock:
                server.received += data
            try:
                self.request.sendall(data)
            except OSError:
                return


class _EchoServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str) -> None:
        super().__init__(path, _Echo)
        self.lock = threading.Lock()
        self.received = b""
        self.connections = 0


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[_EchoServer]:
    server = _EchoServer(str(tmp_path / "echo.sock"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(LIMIT_S)


@pytest.fixture
def proxy(echo: _EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(str(echo.server_address)) as running:
        running.add_path("a")
        running.add_path("b")
        yield running


def _connect(proxy: FaultProxy, path: str) -> socket.socket:
    client = socket.create_connection(proxy.address(path), timeout=LIMIT_S)
    client.settimeout(LIMIT_S)
    return client


def _receive(client: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = client.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _nothing_arrives(client: socket.socket, within_s: float) -> bool:
    client.settimeout(within_s)
    try:
        return client.recv(1) == b"x" and False
    except TimeoutError:
        return True
    finally:
        client.settimeout(LIMIT_S)


def test_without_faults_bytes_go_through_both_ways_and_the_path_is_counted(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    with _connect(proxy, "a") as client:
        client.sendall(b"hello")
        assert _receive(client, 5) == b"hello"
    assert echo.received == b"hello"
    assert proxy.counts["a"]["connections"] == 1
    assert proxy.counts["b"]["connections"] == 0


def test_a_client_that_closes_its_side_closes_the_servers_side(proxy: FaultProxy) -> None:
    with _connect(proxy, "a") as client:
        client.sendall(b"bye")
        client.shutdown(socket.SHUT_WR)
        # The echo, then the end of the stream: the proxy passed the close on both ways.
        assert _receive(client, 10) == b"bye"


def test_latency_delays_every_chunk_each_way(proxy: FaultProxy) -> None:
    proxy.apply(WindowKind.LATENCY, ["a"], seconds=LIMIT_S, amount=150)
    with _connect(proxy, "a") as client:
        started = time.monotonic()
        client.sendall(b"ping")
        assert _receive(client, 4) == b"ping"
        assert time.monotonic() - started >= 0.3


def test_a_stall_holds_bytes_without_closing_and_they_flow_when_it_ends(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    with _connect(proxy, "a") as client:
        client.sendall(b"one")
        assert _receive(client, 3) == b"one"
        window = proxy.apply(WindowKind.STALL, ["a"], seconds=WINDOW_S)
        client.sendall(b"two")
        assert _nothing_arrives(client, WINDOW_S / 2)
        assert echo.received == b"one"
        # Nothing was closed: the held bytes arrive once the window ends.
        assert _receive(client, 3) == b"two"
        assert time.monotonic() >= window.end
    assert echo.received == b"onetwo"


def test_a_stall_on_one_path_leaves_the_others_flowing(proxy: FaultProxy) -> None:
    proxy.apply(WindowKind.STALL, ["a"], seconds=LIMIT_S)
    with _connect(proxy, "b") as client:
        client.sendall(b"free")
        assert _receive(client, 4) == b"free"


def test_a_stall_lets_new_connections_through_and_a_partition_does_not(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    proxy.apply(WindowKind.STALL, ["a"], seconds=LIMIT_S)
    with _connect(proxy, "a") as stalled:
        stalled.sendall(b"s")
        assert _nothing_arrives(stalled, 0.1)
    proxy.apply(WindowKind.PARTITION, ["b"], seconds=WINDOW_S)
    with _connect(proxy, "b") as cut_off:
        cut_off.sendall(b"p")
        assert _nothing_arrives(cut_off, WINDOW_S / 2)
        # The server has seen no connection from path b yet: the stalled one only.
        assert echo.connections == 1
        assert _receive(cut_off, 1) == b"p"
    assert echo.connections == 2


def test_lost_replies_reach_the_server_and_the_client_is_reset_knowing_nothing(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    with _connect(proxy, "a") as client:
        client.sendall(b"before")
        assert _receive(client, 6) == b"before"
        proxy.apply(WindowKind.LOST_REPLIES, ["a"], seconds=WINDOW_S)
        client.sendall(b"commit")
        assert _nothing_arrives(client, WINDOW_S / 2)
        with pytest.raises(ConnectionResetError):
            _receive(client, 6)
    assert echo.received == b"beforecommit"
    assert proxy.counts["a"]["lost_replies"] == 1


def test_a_reset_ends_every_open_connection_of_the_path_and_the_next_one_works(
    proxy: FaultProxy,
) -> None:
    with _connect(proxy, "a") as first, _connect(proxy, "b") as other:
        first.sendall(b"x")
        assert _receive(first, 1) == b"x"
        window = proxy.apply(WindowKind.RESET, ["a"], seconds=5)
        assert window.end == window.start
        assert proxy.settle()  # the proxy's thread has taken it
        assert proxy.counts["a"]["reset"] == 1
        with pytest.raises(ConnectionResetError):
            _receive(first, 1)
        other.sendall(b"y")
        assert _receive(other, 1) == b"y"
    with _connect(proxy, "a") as second:
        second.sendall(b"z")
        assert _receive(second, 1) == b"z"
    assert proxy.counts["a"]["reset"] == 1


def test_a_bandwidth_limit_trickles_the_bytes(proxy: FaultProxy) -> None:
    proxy.apply(WindowKind.BANDWIDTH, ["a"], seconds=LIMIT_S, amount=20_000)
    payload = bytes(4000)
    with _connect(proxy, "a") as client:
        started = time.monotonic()
        client.sendall(payload)
        assert _receive(client, len(payload)) == payload
        # 4,000 bytes at 20,000 bytes a second, less the first slice: the echo of each
        # slice trickles back while the next goes up, so the ways overlap.
        assert time.monotonic() - started >= 0.19


def test_a_server_that_is_down_ends_the_clients_connection(tmp_path: Path) -> None:
    with FaultProxy(str(tmp_path / "nobody.sock")) as proxy:
        proxy.add_path("a")
        # The reset may come before connect() returns, or at the first read.
        with pytest.raises(ConnectionResetError), _connect(proxy, "a") as client:
            _receive(client, 1)
        assert proxy.counts["a"]["refused"] == 1


def test_faults_name_known_paths_and_paths_are_named_once(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="no path named c"):
        proxy.apply(WindowKind.STALL, ["a", "c"], seconds=1)
    with pytest.raises(ValueError, match="already has a path named 'a'"):
        proxy.add_path("a")
    assert proxy.paths == ["a", "b"]
    assert proxy.windows == []


def test_a_window_checks_itself_and_says_where_it_was_in_a_run() -> None:
    with pytest.raises(ValueError, match="cannot end before it starts"):
        FaultWindow(WindowKind.STALL, ("a",), 2.0, 1.0)
    with pytest.raises(ValueError, match="positive amount"):
        FaultWindow(WindowKind.LATENCY, ("a",), 0.0, 1.0)
    window = FaultWindow(WindowKind.BANDWIDTH, ("a", "b"), 12.5, 14.0, 500)
    assert window.to_json(origin=10.0) == {
        "kind": "bandwidth",
        "paths": ["a", "b"],
        "start_s": 2.5,
        "end_s": 4.0,
        "amount": 500,
        "unit": "bytes/s",
    }
    assert "amount" not in FaultWindow(WindowKind.STALL, ("a",), 0.0, 1.0).to_json()


def test_the_windows_in_force_add_up_to_one_condition() -> None:
    windows = [
        FaultWindow(WindowKind.LATENCY, ("a",), 0.0, 10.0, 100),
        FaultWindow(WindowKind.LATENCY, ("a",), 0.0, 10.0, 300),
        FaultWindow(WindowKind.BANDWIDTH, ("a",), 0.0, 10.0, 900),
        FaultWindow(WindowKind.BANDWIDTH, ("a",), 0.0, 10.0, 400),
        FaultWindow(WindowKind.PARTITION, ("a",), 5.0, 6.0),
        FaultWindow(WindowKind.STALL, ("b",), 0.0, 10.0),
        FaultWindow(WindowKind.LOST_REPLIES, ("a",), 0.0, 1.0),
        FaultWindow(WindowKind.RESET, ("a",), 0.0, 0.0),
    ]
    assert Condition.of(windows, "a", 0.5) == Condition(0.3, 400, False, False, True)
    assert Condition.of(windows, "a", 5.5) == Condition(0.3, 400, True, True, False)
    assert Condition.of(windows, "b", 5.5) == Condition(held=True)
    assert Condition.of(windows, "a", 10.0) == Condition()


def test_a_partition_ended_early_lets_held_bytes_through_at_once(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    with _connect(proxy, "a") as client:
        window = proxy.apply(WindowKind.PARTITION, ["a"], seconds=3600.0)
        client.sendall(b"held")
        assert _nothing_arrives(client, WINDOW_S / 2)
        proxy.end(window)
        assert _receive(client, 4) == b"held"
    assert proxy.windows[0].end - proxy.windows[0].start < 3600.0


def test_a_repointed_proxy_sends_new_connections_to_the_new_upstream(
    proxy: FaultProxy, echo: _EchoServer, tmp_path: Path
) -> None:
    other = _EchoServer(str(tmp_path / "other.sock"))
    thread = threading.Thread(target=other.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with _connect(proxy, "a") as before:
            before.sendall(b"one")
            assert _receive(before, 3) == b"one"
            proxy.repoint(str(other.server_address))
            assert proxy.upstream == str(other.server_address)
            with _connect(proxy, "a") as after:
                after.sendall(b"two")
                assert _receive(after, 3) == b"two"
            # The open connection stays with the server it reached.
            before.sendall(b"three")
            assert _receive(before, 5) == b"three"
        assert echo.received == b"onethree"
        assert other.received == b"two"
    finally:
        other.shutdown()
        other.server_close()
        thread.join(LIMIT_S)


def test_a_classified_connection_meets_the_faults_of_its_class_alone(
    echo: _EchoServer, tmp_path: Path
) -> None:
    def classify(origin: str, heard: bytes) -> str | None:
        return f"{origin}/link" if b"REPLCONF" in heard else None

    with FaultProxy(str(echo.server_address), classify=classify) as proxy:
        proxy.add_path("a")
        proxy.add_class("a/link")
        with _connect(proxy, "a") as link, _connect(proxy, "a") as other:
            link.sendall(b"REPLCONF")
            assert _receive(link, 8) == b"REPLCONF"
            proxy.apply(WindowKind.PARTITION, ["a/link"], seconds=3600.0)
            link.sendall(b"held")
            other.sendall(b"free")
            assert _receive(other, 4) == b"free"
            assert _nothing_arrives(link, WINDOW_S / 2)
        assert proxy.counts["a/link"]["connections"] == 1
        assert proxy.counts["a"]["connections"] == 2
    with FaultProxy("x") as idle, pytest.raises(ValueError, match="no path named"):
        idle.apply(WindowKind.PARTITION, ["a/link"], seconds=1.0)


def test_a_path_of_its_own_upstream_reaches_it_whatever_the_proxys_is(
    echo: _EchoServer, tmp_path: Path
) -> None:
    with FaultProxy(str(tmp_path / "nobody.sock")) as proxy:
        proxy.add_path("own", upstream=str(echo.server_address))
        with _connect(proxy, "own") as client:
            client.sendall(b"mine")
            assert _receive(client, 4) == b"mine"
