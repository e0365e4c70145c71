"""The judges' AMQP client (``judges.amqp``): field tables of every type RabbitMQ writes, and
frames it cannot read said as errors (the node itself: ``test_amqp_reader.py``)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from decimal import Decimal

import pytest

from crashqueuelab.judges.amqp import (
    CHANNEL,
    CLOSE,
    FRAME_MAX_BEFORE_TUNE,
    GET_EMPTY,
    AmqpConnection,
    AmqpError,
    _Reader,
)


def _short(text: str) -> bytes:
    return bytes([len(text)]) + text.encode()


def _long(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def test_a_table_of_every_field_type_reads_back() -> None:
    fields = [
        ("s", b"S" + _long("héllo".encode())),
        ("t", b"t\x01"),
        ("b", b"b" + struct.pack(">b", -2)),
        ("B", b"B\x07"),
        ("short", b"s" + struct.pack(">h", -300)),
        ("u", b"u" + struct.pack(">H", 65000)),
        ("I", b"I" + struct.pack(">i", -70000)),
        ("i", b"i" + struct.pack(">I", 4_000_000_000)),
        ("l", b"l" + struct.pack(">q", -(2**40))),
        ("f", b"f" + struct.pack(">f", 0.5)),
        ("d", b"d" + struct.pack(">d", 0.25)),
        ("T", b"T" + struct.pack(">Q", 1_700_000_000)),
        ("D", b"D\x02" + struct.pack(">i", 12345)),
        ("F", b"F" + _long(_short("k") + b"V")),
        ("A", b"A" + _long(b"V" + b"I" + struct.pack(">i", 3))),
        ("x", b"x" + _long(b"\x00\x01")),
        ("V", b"V"),
    ]
    encoded = b"".join(_short(name) + value for name, value in fields)
    assert _Reader(_long(encoded)).table() == {
        "s": "héllo", "t": True, "b": -2, "B": 7, "short": -300, "u": 65000, "I": -70000,
        "i": 4_000_000_000, "l": -(2**40), "f": 0.5, "d": 0.25, "T": 1_700_000_000,
        "D": Decimal("123.45"), "F": {"k": None}, "A": [None, 3], "x": b"\x00\x01", "V": None,
    }  # fmt: skip


def test_a_field_of_an_unknown_type_or_a_short_payload_is_an_error() -> None:
    with pytest.raises(AmqpError, match="unknown type b'Z'"):
        _Reader(_long(_short("k") + b"Z")).table()
    with pytest.raises(AmqpError, match="shorter than what it says"):
        _Reader(b"\x00\x00\x00\x09abc").table()


@pytest.fixture
def wire() -> Iterator[tuple[AmqpConnection, socket.socket]]:
    """A client whose socket's other end is the test's (no handshake)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    client = object.__new__(AmqpConnection)
    client.sock, client.buffer = ours, b""
    client.frame_max, client.closed_by_server = FRAME_MAX_BEFORE_TUNE, False
    try:
        yield client, theirs
    finally:
        ours.close()
        theirs.close()


def _frame(kind: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + bytes([end])


def test_heartbeats_are_skipped_and_a_closed_channel_says_its_code(
    wire: tuple[AmqpConnection, socket.socket],
) -> None:
    client, server = wire
    server.sendall(_frame(8, 0, b"") + _frame(1, CHANNEL, struct.pack(">HH", *GET_EMPTY) + b"\x00"))
    assert client.get("q") is None
    closing = struct.pack(">HH", 20, 40) + struct.pack(">H", 404) + _short("NOT_FOUND - no queue")
    server.sendall(_frame(1, CHANNEL, closing + struct.pack(">HH", 50, 10)))
    with pytest.raises(AmqpError, match="404 NOT_FOUND") as refused:
        client.declare_passive("q")
    assert refused.value.code == 404


def test_a_frame_it_cannot_read_is_an_error_and_close_never_raises(
    wire: tuple[AmqpConnection, socket.socket],
) -> None:
    client, server = wire
    server.sendall(_frame(1, CHANNEL, struct.pack(">HH", *GET_EMPTY), end=0x00))
    with pytest.raises(AmqpError, match="not ended by 0xCE"):
        client.get("q")
    server.sendall(_frame(1, 7, struct.pack(">HH", *GET_EMPTY)))
    with pytest.raises(AmqpError, match="a frame of type 1 on channel 7"):
        client.get("q")
    server.sendall(_frame(1, CHANNEL, struct.pack(">HH", 60, 99)))
    with pytest.raises(AmqpError, match=r"basic\.get answered with method"):
        client.get("q")
    server.sendall(_frame(1, 0, struct.pack(">HH", *CLOSE) + b"\x01\x40" + _short("forced")))
    with pytest.raises(AmqpError, match="320 forced"):
        client._method(0)
    server.shutdown(socket.SHUT_WR)
    with pytest.raises(AmqpError, match="closed the connection"):
        client.get("q")
    client.close()  # no Close-Ok comes: the close is the socket's


def _method(method: tuple[int, int], arguments: bytes) -> bytes:
    return _frame(1, CHANNEL, struct.pack(">HH", *method) + arguments)


def test_a_message_is_read_with_its_properties_and_a_body_over_several_frames(
    wire: tuple[AmqpConnection, socket.socket],
) -> None:
    client, server = wire
    get_ok = struct.pack(">Q", 7) + b"\x01" + _short("") + _short("q") + struct.pack(">I", 0)
    # Flags: content-type (bit 15), headers (13), delivery-mode (12), message-id (7),
    # timestamp (6): the headers are found among the properties before and after them.
    flags = (1 << 15) | (1 << 13) | (1 << 12) | (1 << 7) | (1 << 6)
    properties = (
        _short("application/json")
        + _long(_short("id") + b"S" + _long(b"task-1") + _short("retries") + b"I" + b"\0\0\0\2")
        + b"\x02"
        + _short("m-1")
        + struct.pack(">Q", 1_700_000_000)
    )
    header = struct.pack(">HHQH", 60, 0, 10, flags) + properties
    server.sendall(
        _method((60, 71), get_ok)
        + _frame(2, CHANNEL, header)
        + _frame(3, CHANNEL, b"01234")
        + _frame(3, CHANNEL, b"56789")
    )
    message = client.get("q")
    assert message is not None
    assert (message.headers, message.body, message.redelivered) == (
        {"id": "task-1", "retries": 2},
        b"0123456789",
        True,
    )


def test_a_header_of_another_class_a_body_too_long_or_a_frame_too_big_are_errors(
    wire: tuple[AmqpConnection, socket.socket],
) -> None:
    client, server = wire
    get_ok = struct.pack(">Q", 1) + b"\x00" + _short("") + _short("q") + struct.pack(">I", 0)
    server.sendall(
        _method((60, 71), get_ok) + _frame(2, CHANNEL, struct.pack(">HHQH", 50, 0, 1, 0))
    )
    with pytest.raises(AmqpError, match="another class than basic"):
        client.get("q")
    long_body = _frame(2, CHANNEL, struct.pack(">HHQH", 60, 0, 2, 0)) + _frame(3, CHANNEL, b"abc")
    server.sendall(_method((60, 71), get_ok) + long_body)
    with pytest.raises(AmqpError, match="a body of 3 bytes where its header said 2"):
        client.get("q")
    client.frame_max = 16
    server.sendall(_frame(1, CHANNEL, b"x" * 17))
    with pytest.raises(AmqpError, match="over the frame_max 16"):
        client.get("q")


def test_a_server_s_close_is_answered_and_the_client_then_closes_without_waiting(
    wire: tuple[AmqpConnection, socket.socket],
) -> None:
    client, server = wire
    server.sendall(_frame(1, 0, struct.pack(">HH", *CLOSE) + b"\x01\x40" + _short("forced")))
    with pytest.raises(AmqpError, match="320 forced"):
        client.get("q")
    client.close()
    said = server.recv(4096)
    # The client's GET, then its close-ok (10, 51); no close of its own after the server's.
    assert said.endswith(_frame(1, 0, struct.pack(">HH", 10, 51)))
    assert struct.pack(">HH", 10, 50) not in said


def test_an_amqps_url_is_refused_rather_than_read_in_plain_text() -> None:
    with pytest.raises(AmqpError, match="only amqp:// URLs"):
        AmqpConnection("amqps://guest:guest@127.0.0.1:5671/")
