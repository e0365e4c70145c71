"""A fault proxy on the loopback interface, between workers and their server.

Each *path* is a listening TCP socket on 127.0.0.1 of its own, so a fault can strike one
worker, several or all: a worker is told its path's address instead of the server's, and
every byte it exchanges with the server goes through the proxy, which forwards it to the
upstream address (the server's Unix socket, or a TCP address) unless a fault window in
force says otherwise (``windows``). One thread owns every socket and serves them with a
selector; the control calls (``apply``, ``add_path``) may come from any thread.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Self

from crashqueuelab.lab.faults.network.windows import Condition, FaultWindow, WindowKind

#: A server's address: a Unix socket's path, or (host, port).
Upstream = str | tuple[str, int]
#: The most the loop sleeps between looks at the clock (windows end, delayed bytes fall due).
TICK_S = 0.02
#: Bytes read at once from one socket.
CHUNK = 65536
#: How long closing waits for the loop thread.
CLOSE_WAIT_S = 10.0
#: How much of what a client sends first a classifier sees, at most.
CLASSIFY_BYTES = 4096
#: Names a connection by what its client sent first (its listener's path, those bytes): a
#: class of its own, so a fault can strike it alone (a replica's link to its primary, say),
#: or None while it cannot tell yet.
Classifier = Callable[[str, bytes], str | None]


@dataclass
class _Flow:
    """One direction of a proxied connection."""

    source: socket.socket | None
    sink: socket.socket | None
    pending: deque[tuple[float, bytes]] = field(default_factory=deque)
    out: bytearray = field(default_factory=bytearray)
    eof: bool = False
    shut: bool = False
    paced_until: float = 0.0

    @property
    def drained(self) -> bool:
        return self.eof and not self.pending and not self.out


@dataclass
class _Connection:
    #: The path whose faults it meets: the listener's, or the class ``classify`` gave it.
    path: str
    client: socket.socket
    server: socket.socket | None = None
    doomed: bool = False
    up: _Flow = field(init=False)
    down: _Flow = field(init=False)
    #: The listener's path (its upstream), and what the client sent first (to classify it).
    origin: str = ""
    heard: bytes = b""
    classified: bool = False

    def __post_init__(self) -> None:
        self.origin = self.origin or self.path
        self.up = _Flow(self.client, None)
        self.down = _Flow(None, self.client)

    def attach(self, server: socket.socket) -> None:
        self.server = server
        self.up.sink = server
        self.down.source = server

    def sockets(self) -> list[socket.socket]:
        return [self.client] + ([self.server] if self.server is not None else [])


class FaultProxy:
    """Forward each path's connections to ``upstream``, through the faults applied."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        clock: Callable[[], float] = time.monotonic,
        connect_timeout_s: float = 5.0,
        classify: Classifier | None = None,
    ) -> None:
        self._upstream = upstream
        #: A path's own upstream, where it has one (else ``upstream``).
        self._upstreams: dict[str, Upstream] = {}
        self._classify = classify
        self._classes: set[str] = set()
        self._clock = clock
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        #: Resets asked for, and taken by the proxy's thread (``settle`` waits for them).
        self._taken = threading.Condition(self._lock)
        self._resets_asked = 0
        self._resets_taken = 0
        self._windows: list[FaultWindow] = []
        self._resets: list[tuple[str, ...]] = []
        self._new_listeners: list[tuple[str, socket.socket]] = []
        self._addresses: dict[str, tuple[str, int]] = {}
        self._connections: list[_Connection] = []
        self._interest: dict[socket.socket, int] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: Per path: connections accepted, reset by a fault, that lost a reply, refused
        #: (the server could not be reached).
        self.counts: dict[str, Counter[str]] = {}

    # -- control (any thread) -------------------------------------------------------------

    def add_path(
        self, name: str, upstream: Upstream | None = None, *, unix: str | None = None
    ) -> tuple[str, int]:
        """A new path's address on the loopback interface (to ``upstream``, else to the
        proxy's); with ``unix``, a Unix socket at that path instead, named ``(unix, 0)``
        (for a client that reaches its server by a socket file, as the lab's Redis
        clients do)."""
        if unix is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
        else:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(unix)
        listener.listen(64)
        listener.setblocking(False)
        address: tuple[str, int] = listener.getsockname() if unix is None else (unix, 0)
        with self._lock:
            if name in self._addresses:
                listener.close()
                raise ValueError(f"the proxy already has a path named {name!r}")
            self._addresses[name] = address
            self.counts[name] = Counter()
            if upstream is not None:
                self._upstreams[name] = upstream
            self._new_listeners.append((name, listener))
        self._wake()
        return address

    def add_class(self, name: str) -> None:
        """A path with no listener of its own: the connections ``classify`` names so."""
        with self._lock:
            self._classes.add(name)
            self.counts.setdefault(name, Counter())

    def repoint(self, upstream: Upstream) -> None:
        """Send every connection made from now on to ``upstream`` (a failover's new
        primary, as a virtual address or a connection pooler is moved); the open ones stay
        with the server they reached."""
        with self._lock:
            self._upstream = upstream

    @property
    def upstream(self) -> Upstream:
        return self._upstream

    def address(self, name: str) -> tuple[str, int]:
        return self._addresses[name]

    @property
    def paths(self) -> list[str]:
        return list(self._addresses)

    def apply(
        self, kind: WindowKind, paths: Iterable[str], seconds: float, amount: float = 0.0
    ) -> FaultWindow:
        """Start a fault on ``paths`` now, for ``seconds`` (a reset has no length)."""
        chosen = tuple(paths)
        unknown = [
            path for path in chosen if path not in self._addresses | dict.fromkeys(self._classes)
        ]
        if unknown:
            raise ValueError(f"the proxy has no path named {', '.join(unknown)}")
        now = self._clock()
        length = 0.0 if kind is WindowKind.RESET else seconds
        window = FaultWindow(kind, chosen, now, now + length, amount)
        with self._lock:
            self._windows.append(window)
            if kind is WindowKind.RESET:
                self._resets.append(chosen)
                self._resets_asked += 1
        self._wake()
        return window

    def end(self, window: FaultWindow) -> None:
        """End ``window`` now, before its planned end (a link that comes back)."""
        with self._lock:
            self._windows = [
                replace(held, end=max(held.start, self._clock())) if held is window else held
                for held in self._windows
            ]
        self._wake()

    def settle(self, timeout_s: float = 5.0) -> bool:
        """Wait (at most ``timeout_s``) until the proxy's thread has taken every reset
        applied so far: the connections it names are closed. False if it had not by then."""
        with self._taken:
            return self._taken.wait_for(
                lambda: self._resets_taken >= self._resets_asked, timeout=timeout_s
            )

    @property
    def windows(self) -> list[FaultWindow]:
        with self._lock:
            return list(self._windows)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop forwarding and close every socket (bounded)."""
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)
            self._thread = None
        with self._lock:
            listeners = [listener for _, listener in self._new_listeners]
            self._new_listeners.clear()
        for sock in [*self._interest, *listeners]:
            with contextlib.suppress(OSError):
                sock.close()
        for connection in self._connections:
            for sock in connection.sockets():
                with contextlib.suppress(OSError):
                    sock.close()
        self._connections.clear()
        self._interest.clear()
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")

    # -- the loop (its own thread) --------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping.is_set():
            now = self._clock()
            due = self._tend(now)
            for key, events in self._selector.select(max(0.0, min(TICK_S, due - now))):
                self._handle(key, events)

    def _condition(self, path: str, now: float) -> Condition:
        with self._lock:
            return Condition.of(self._windows, path, now)

    def _tend(self, now: float) -> float:
        """Everything the clock decides: new paths, resets, connections that may now reach
        the server, doomed connections whose window ended, delayed bytes that fell due, and
        what each socket should be watched for. Returns when held-back bytes next fall due
        (held connections wait for the tick, as windows end on the clock)."""
        with self._lock:
            listeners, self._new_listeners = self._new_listeners, []
            resets, self._resets = self._resets, []
        for name, listener in listeners:
            self._watch(listener, selectors.EVENT_READ, name)
        for paths in resets:
            for connection in [c for c in self._connections if c.path in paths]:
                self._reset(connection, "reset")
        if resets:
            with self._taken:
                self._resets_taken += len(resets)
                self._taken.notify_all()
        due = now + TICK_S
        for connection in list(self._connections):
            condition = self._condition(connection.path, now)
            if connection.doomed and not condition.drops_replies:
                # Counted once already, when its first answer was dropped.
                self._reset(connection, None)
                continue
            if (
                connection.server is None
                and not condition.refuses_new
                and not self._connect(connection)
            ):
                continue
            if not condition.held:
                for flow in (connection.up, connection.down):
                    self._release(flow, now, condition.bytes_per_s)
                    if flow.pending:
                        due = min(due, max(flow.pending[0][0], flow.paced_until))
            if self._finished(connection):
                self._close(connection)
                continue
            self._update_interest(connection, condition)
        return due

    def _release(self, flow: _Flow, now: float, rate: float | None) -> None:
        while flow.pending and flow.pending[0][0] <= now:
            due, data = flow.pending.popleft()
            if rate is None:
                flow.out += data
                continue
            if flow.paced_until > now:
                flow.pending.appendleft((due, data))
                return
            # A slice worth a hundredth of a second, so a slow path trickles evenly.
            size = max(1, int(rate / 100))
            flow.out += data[:size]
            if data[size:]:
                flow.pending.appendleft((due, data[size:]))
            flow.paced_until = max(flow.paced_until, now) + min(size, len(data)) / rate

    def _finished(self, connection: _Connection) -> bool:
        for flow in (connection.up, connection.down):
            if flow.drained and not flow.shut and flow.sink is not None:
                with contextlib.suppress(OSError):
                    flow.sink.shutdown(socket.SHUT_WR)
                flow.shut = True
        return connection.up.shut and connection.down.shut

    def _update_interest(self, connection: _Connection, condition: Condition) -> None:
        reading = not condition.held
        client = selectors.EVENT_WRITE if connection.down.out else 0
        if reading and not connection.up.eof and connection.server is not None:
            client |= selectors.EVENT_READ
        self._watch(connection.client, client, connection)
        if connection.server is not None:
            server = selectors.EVENT_WRITE if connection.up.out else 0
            # Answers are read even while they are being dropped: the server's side sees
            # its reply sent, as it would across a one-way partition.
            if (reading or condition.drops_replies) and not connection.down.eof:
                server |= selectors.EVENT_READ
            self._watch(connection.server, server, connection)

    def _watch(self, sock: socket.socket, events: int, data: object) -> None:
        was = self._interest.get(sock, 0)
        if events == was:
            return
        if not events:
            self._selector.unregister(sock)
            del self._interest[sock]
        elif not was:
            self._selector.register(sock, events, data)
            self._interest[sock] = events
        else:
            self._selector.modify(sock, events, data)
            self._interest[sock] = events

    def _forget(self, sock: socket.socket) -> None:
        if self._interest.pop(sock, 0):
            self._selector.unregister(sock)

    def _handle(self, key: selectors.SelectorKey, events: int) -> None:
        if key.data is None:
            with contextlib.suppress(BlockingIOError):
                self._wake_read.recv(4096)
            return
        if isinstance(key.data, str):
            self._accept(key.fileobj, key.data)  # type: ignore[arg-type]
            return
        connection: _Connection = key.data
        if connection not in self._connections:
            return
        sock = key.fileobj
        now = self._clock()
        try:
            if events & selectors.EVENT_WRITE:
                flow = connection.down if sock is connection.client else connection.up
                sent = flow.sink.send(flow.out) if flow.sink is not None else 0
                del flow.out[:sent]
            if events & selectors.EVENT_READ:
                flow = connection.up if sock is connection.client else connection.down
                self._receive(connection, flow, now)
        except BlockingIOError:
            return
        except OSError:
            self._reset(connection, None)

    def _receive(self, connection: _Connection, flow: _Flow, now: float) -> None:
        assert flow.source is not None
        data = flow.source.recv(CHUNK)
        if not data:
            flow.eof = True
            return
        if flow is connection.up and not connection.classified:
            self._classify_by(connection, data)
        condition = self._condition(connection.path, now)
        if flow is connection.down and condition.drops_replies:
            if not connection.doomed:
                connection.doomed = True
                self.counts[connection.path]["lost_replies"] += 1
            return
        flow.pending.append((now + condition.latency_s, data))

    def _classify_by(self, connection: _Connection, data: bytes) -> None:
        if self._classify is None:
            connection.classified = True
            return
        connection.heard = (connection.heard + data)[:CLASSIFY_BYTES]
        name = self._classify(connection.origin, connection.heard)
        if name is not None:
            connection.path = name
            self.counts.setdefault(name, Counter())["connections"] += 1
        connection.classified = name is not None or len(connection.heard) >= CLASSIFY_BYTES

    def _accept(self, listener: socket.socket, path: str) -> None:
        try:
            client, _ = listener.accept()
        except BlockingIOError:
            return
        client.setblocking(False)
        if client.family == socket.AF_INET:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connections.append(_Connection(path, client))
        self.counts[path]["connections"] += 1

    def _connect(self, connection: _Connection) -> bool:
        upstream = self._upstreams.get(connection.origin, self._upstream)
        family = socket.AF_UNIX if isinstance(upstream, str) else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.settimeout(self._connect_timeout_s)
        try:
            server.connect(upstream)
        except OSError:
            # The server is down (a restart in progress): the client's connection ends as
            # it would at a closed port.
            server.close()
            self.counts[connection.path]["refused"] += 1
            self._reset(connection, None)
            return False
        server.setblocking(False)
        connection.attach(server)
        return True

    def _reset(self, connection: _Connection, reason: str | None) -> None:
        """Close both sides at once, with a TCP reset where the socket is TCP."""
        if reason is not None:
            self.counts[connection.path][reason] += 1
        for sock in connection.sockets():
            self._forget(sock)
            with contextlib.suppress(OSError):
                if sock.family == socket.AF_INET:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
        with contextlib.suppress(ValueError):
            self._connections.remove(connection)

    def _close(self, connection: _Connection) -> None:
        for sock in connection.sockets():
            self._forget(sock)
            sock.close()
        self._connections.remove(connection)
