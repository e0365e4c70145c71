"""A small client of AMQP 0-9-1 over TCP, standard library only: enough to open a
connection, declare a queue passively and take its messages with ``basic.get``.

The judges read a RabbitMQ queue through it, so that their reading depends on no client
library a queue under test brings with it (dramatiq's pika, Celery's py-amqp). It speaks
the protocol as its specification writes it (https://www.rabbitmq.com/resources/specs/amqp0-9-1.pdf):
frames of a type, a channel and a payload ended by ``0xCE``; methods named by class and
method ids; field tables as RabbitMQ encodes them
(https://www.rabbitmq.com/docs/amqp-0-9-1-errata#section_3). Every read and write is bounded
by the socket's timeout.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from decimal import Decimal
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote, urlsplit

#: Every read and write waits at most this long.
TIMEOUT_S = 10.0
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_METHOD, _HEADER, _BODY, _HEARTBEAT = 1, 2, 3, 8
_FRAME_END = 0xCE
#: (class id, method id) of the methods the client sends or waits for.
START, START_OK, TUNE, TUNE_OK, OPEN, OPEN_OK = (
    (10, 10),
    (10, 11),
    (10, 30),
    (10, 31),
    (10, 40),
    (10, 41),
)
CLOSE, CLOSE_OK = (10, 50), (10, 51)
CHANNEL_OPEN, CHANNEL_OPEN_OK, CHANNEL_CLOSE, CHANNEL_CLOSE_OK = (
    (20, 10),
    (20, 11),
    (20, 40),
    (20, 41),
)
DECLARE, DECLARE_OK = (50, 10), (50, 11)
GET, GET_OK, GET_EMPTY = (60, 70), (60, 71), (60, 72)
#: The one channel the client uses.
CHANNEL = 1
#: The basic class's id, which a content header names.
BASIC = 60
#: The largest frame the client takes before the server said its own (the protocol's
#: minimum frame size is 4096; RabbitMQ's default frame_max is 128 KiB).
FRAME_MAX_BEFORE_TUNE = 1 << 20


class AmqpError(Exception):
    """The server closed the channel or the connection (its reply code and text), or said
    something the client cannot read."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Message:
    """One message ``basic.get`` took: its properties' headers and its body."""

    headers: dict[str, Any]
    body: bytes
    redelivered: bool


class _Reader:
    """Reads AMQP's types from one payload, front to back."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise AmqpError("a frame shorter than what it says it holds")
        piece = self.data[self.at : self.at + size]
        self.at += size
        return piece

    def unpack(self, layout: str) -> Any:
        (value,) = struct.unpack(">" + layout, self.take(struct.calcsize(">" + layout)))
        return value

    def shortstr(self) -> str:
        return self.take(self.unpack("B")).decode("utf-8", "replace")

    def longstr(self) -> bytes:
        return self.take(self.unpack("I"))

    def table(self) -> dict[str, Any]:
        inner = _Reader(self.longstr())
        found = {}
        while inner.at < len(inner.data):
            name = inner.shortstr()
            found[name] = inner.value()
        return found

    def value(self) -> Any:
        kind = self.take(1)
        if kind == b"S":
            return self.longstr().decode("utf-8", "replace")
        if kind in _FIXED:
            return self.unpack(_FIXED[kind])
        if kind == b"t":
            return bool(self.unpack("B"))
        if kind == b"D":
            scale, digits = self.unpack("B"), self.unpack("I")
            return Decimal(digits).scaleb(-scale)
        if kind == b"F":
            return self.table()
        if kind == b"A":
            inner = _Reader(self.longstr())
            items = []
            while inner.at < len(inner.data):
                items.append(inner.value())
            return items
        if kind == b"x":
            return self.longstr()
        if kind == b"V":
            return None
        raise AmqpError(f"a field of unknown type {kind!r}")


#: The field types of a fixed size, by their letter, as ``struct`` reads them (RabbitMQ's:
#: ``s`` is a signed short, ``l`` a signed 64-bit integer).
_FIXED = {
    b"b": "b",
    b"B": "B",
    b"s": "h",
    b"u": "H",
    b"I": "i",
    b"i": "I",
    b"l": "q",
    b"f": "f",
    b"d": "d",
    b"T": "Q",
}
#: The basic class's properties in their flag order (bit 15 first), by how each is read;
#: only the headers are kept.
_PROPERTIES = (
    "shortstr", "shortstr", "table", "B", "B", "shortstr", "shortstr", "shortstr", "shortstr",
    "Q", "shortstr", "shortstr", "shortstr", "shortstr",
)  # fmt: skip


def _shortstr(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack(">B", len(encoded)) + encoded


def _longstr(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


#: The client's properties (a field table): it can take a refused login as a connection
#: close that says why, where RabbitMQ otherwise drops the socket without a word.
CLIENT_PROPERTIES = (
    _shortstr("capabilities")
    + b"F"
    + _longstr(_shortstr("authentication_failure_close") + b"t\x01")
)


class AmqpConnection:
    """One connection to a RabbitMQ node, with one channel open, from an ``amqp://`` URL."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        parts = urlsplit(url)
        if parts.scheme != "amqp":
            # No TLS here: an amqps:// node is never read in plain text instead.
            raise AmqpError(f"only amqp:// URLs are read, not {parts.scheme}://")
        self.frame_max = FRAME_MAX_BEFORE_TUNE
        #: The server closed the connection (its close answered): nothing more to send.
        self.closed_by_server = False
        self.sock = socket.create_connection(
            (parts.hostname or "localhost", parts.port or 5672), timeout_s
        )
        self.buffer = b""
        try:
            self._open(
                unquote(parts.username or "guest"),
                unquote(parts.password or "guest"),
                unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
            )
        except BaseException:
            self.sock.close()
            raise

    def _open(self, user: str, password: str, vhost: str) -> None:
        self.sock.sendall(_PROTOCOL_HEADER)
        self._expect(0, START)
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self._send(
            0,
            START_OK,
            _longstr(CLIENT_PROPERTIES)
            + _shortstr("PLAIN")
            + _longstr(response)
            + _shortstr("en_US"),
        )
        tune = self._expect(0, TUNE)
        channels, frame_max = tune.unpack("H"), tune.unpack("I")
        self.frame_max = frame_max or FRAME_MAX_BEFORE_TUNE
        # No heartbeats: the reading is short, and every read is bounded by the timeout.
        self._send(0, TUNE_OK, struct.pack(">HIH", channels, frame_max, 0))
        self._send(0, OPEN, _shortstr(vhost) + _shortstr("") + b"\x00")
        self._expect(0, OPEN_OK)
        self._send(CHANNEL, CHANNEL_OPEN, _shortstr(""))
        self._expect(CHANNEL, CHANNEL_OPEN_OK)

    def declare_passive(self, queue: str) -> tuple[int, int]:
        """The queue's ready messages and consumers; a queue that does not exist raises
        ``AmqpError`` with code 404 (and the channel is closed)."""
        arguments = struct.pack(">H", 0) + _shortstr(queue) + b"\x01" + _longstr(b"")
        self._send(CHANNEL, DECLARE, arguments)
        reply = self._expect(CHANNEL, DECLARE_OK)
        reply.shortstr()
        return reply.unpack("I"), reply.unpack("I")

    def get(self, queue: str) -> Message | None:
        """``basic.get`` without acknowledgement: the next ready message, held by this
        channel until it closes; None when no message is ready."""
        self._send(CHANNEL, GET, struct.pack(">H", 0) + _shortstr(queue) + b"\x00")
        method, reply = self._method(CHANNEL)
        if method == GET_EMPTY:
            return None
        if method != GET_OK:
            raise AmqpError(f"basic.get answered with method {method}")
        reply.unpack("Q")
        redelivered = bool(reply.unpack("B") & 1)
        header = _Reader(self._frame(_HEADER, CHANNEL))
        if header.unpack("H") != BASIC:
            raise AmqpError("a content header of another class than basic")
        header.unpack("H")
        size = header.unpack("Q")
        headers: dict[str, Any] = {}
        flags = header.unpack("H")
        for bit, kind in enumerate(_PROPERTIES):
            if not flags & (1 << (15 - bit)):
                continue
            if kind == "table":
                headers = header.table()
            elif kind == "shortstr":
                header.shortstr()
            else:
                header.unpack(kind)
        body = b""
        while len(body) < size:
            body += self._frame(_BODY, CHANNEL)
        if len(body) != size:
            raise AmqpError(f"a body of {len(body)} bytes where its header said {size}")
        return Message(headers, body, redelivered)

    def close(self) -> None:
        """Close the connection (every message its channel took goes back to its queue)."""
        try:
            if self.closed_by_server:
                return
            self._send(0, CLOSE, struct.pack(">H", 200) + _shortstr("") + struct.pack(">HH", 0, 0))
            self._expect(0, CLOSE_OK)
        except (OSError, AmqpError):
            pass  # the socket's close below is the close that counts
        finally:
            self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, channel: int, method: tuple[int, int], arguments: bytes) -> None:
        payload = struct.pack(">HH", *method) + arguments
        frame = struct.pack(">BHI", _METHOD, channel, len(payload)) + payload + bytes([_FRAME_END])
        self.sock.sendall(frame)

    def _read(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AmqpError("the server closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _frame(self, wanted: int, channel: int) -> bytes:
        """The payload of the next frame of type ``wanted`` on ``channel`` (heartbeats
        skipped; a close of the channel or the connection raises)."""
        while True:
            kind, on, size = struct.unpack(">BHI", self._read(7))
            if size > self.frame_max:
                raise AmqpError(f"a frame of {size} bytes, over the frame_max {self.frame_max}")
            payload = self._read(size)
            if self._read(1)[0] != _FRAME_END:
                raise AmqpError("a frame not ended by 0xCE")
            if kind == _HEARTBEAT:
                continue
            if kind == _METHOD and payload[:4] in (
                struct.pack(">HH", *CLOSE),
                struct.pack(">HH", *CHANNEL_CLOSE),
            ):
                closing = _Reader(payload[4:])
                code, text = closing.unpack("H"), closing.shortstr()
                # Answered, as the protocol asks: the server waits for it.
                if payload[:4] == struct.pack(">HH", *CLOSE):
                    self._send(0, CLOSE_OK, b"")
                    self.closed_by_server = True
                else:
                    self._send(on, CHANNEL_CLOSE_OK, b"")
                raise AmqpError(f"{code} {text}", code)
            if (kind, on) != (wanted, channel):
                raise AmqpError(
                    f"a frame of type {kind} on channel {on}, not {wanted} on {channel}"
                )
            return payload

    def _method(self, channel: int) -> tuple[tuple[int, int], _Reader]:
        reader = _Reader(self._frame(_METHOD, channel))
        return (reader.unpack("H"), reader.unpack("H")), reader

    def _expect(self, channel: int, method: tuple[int, int]) -> _Reader:
        got, reader = self._method(channel)
        if got != method:
            raise AmqpError(f"expected method {method}, the server sent {got}")
        return reader
