"""A small client of Redis's own protocol (RESP2) over a Unix socket, standard library only.

The judges read a Redis store with their own commands through it, and the lab's throwaway
server is checked and stopped through it, so that neither depends on the client library a
queue under test brings with it. Every call is bounded by the socket's timeout.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import TracebackType
from typing import Self

#: Every read and write waits at most this long.
TIMEOUT_S = 10.0

Reply = bytes | int | str | list["Reply"] | None


class RespError(Exception):
    """The server answered a command with an error (``-ERR ...``, ``-LOADING ...``)."""


class RespConnection:
    """One connection to a Redis server's Unix socket."""

    def __init__(self, path: Path | str, timeout_s: float = TIMEOUT_S) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(str(path))
        except OSError:
            self.sock.close()
            raise
        self.buffer = b""

    def command(self, *parts: str | bytes | int) -> Reply:
        """Send one command and return its reply (an error reply raises ``RespError``)."""
        encoded = [part if isinstance(part, bytes) else str(part).encode() for part in parts]
        message = b"*%d\r\n" % len(encoded) + b"".join(
            b"$%d\r\n%s\r\n" % (len(part), part) for part in encoded
        )
        self.sock.sendall(message)
        return self._reply()

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection mid-reply")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection mid-reply")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size + 2 :]
        return data

    def _reply(self) -> Reply:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exactly(size)
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise ConnectionError(f"not a RESP reply: {line[:40]!r}")

    def close(self) -> None:
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


def text(reply: Reply) -> str:
    """A bulk or simple string reply as text (bytes decoded as UTF-8)."""
    if isinstance(reply, bytes):
        return reply.decode(errors="replace")
    return "" if reply is None else str(reply)
