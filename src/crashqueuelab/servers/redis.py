"""A throwaway Redis server for one run: ``redis-server`` on a Unix socket in a temporary
directory, with the persistence a system names.

The server listens on no TCP port (``port 0``: nothing to collide with), keeps its data in
its own directory, and is told its persistence on the command line, never by a
configuration file it might share. A server the lab did not start is not supported: the
lab must be free to kill and restart it.

Persistence settings (the names the report shows):

- ``none``: no snapshot, no append-only file. A restart loses everything.
- ``rdb``: Redis's default snapshots (``save 3600 1 300 100 60 10000``), no AOF.
- ``aof-everysec``: the append-only file, synced once a second (Redis's AOF default).
- ``aof-always``: the append-only file, synced before each write is answered.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.judges.resp import RespConnection, RespError

#: Where the children of a run find the server (the run's parent process sets it).
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
#: A ``redis-server`` to use where it is not on PATH.
BINARY_VARIABLE = "CRASHQUEUELAB_REDIS_SERVER"
#: Every wait for the server is bounded.
START_TIMEOUT_S = 60.0
#: How much of the server's log a refusal to start quotes.
LOG_LINES = 2
LOG_CHARACTERS = 600
#: Each persistence setting as ``redis-server`` arguments.
PERSISTENCE: Mapping[str, Sequence[str]] = {
    "none": ("--save", "", "--appendonly", "no"),
    "rdb": ("--save", "3600 1 300 100 60 10000", "--appendonly", "no"),
    "aof-everysec": ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec"),
    "aof-always": ("--save", "", "--appendonly", "yes", "--appendfsync", "always"),
}
#: What each setting promises about a write Redis has answered, in the report's words.
PERSISTENCE_WORDS: Mapping[str, str] = {
    "none": "no persistence: a restart starts empty",
    "rdb": "RDB snapshots only (save 3600 1 300 100 60 10000): a restart keeps the last snapshot",
    "aof-everysec": "AOF, appendfsync everysec: a power cut may take back the last second",
    "aof-always": "AOF, appendfsync always: each write is synced before Redis answers it",
}


def find_redis_server(environ: Mapping[str, str] = os.environ) -> Path | None:
    """``redis-server``: the variable, then PATH, then Debian's place for it."""
    candidates = [
        environ.get(BINARY_VARIABLE),
        shutil.which("redis-server", path=environ.get("PATH")),
    ]
    candidates.append("/usr/bin/redis-server")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def ping(path: Path, timeout_s: float = 2.0) -> bool:
    """Whether a server answers on ``path`` and has finished loading its data."""
    try:
        with RespConnection(path, timeout_s) as connection:
            return connection.command("PING") == "PONG"
    except (OSError, RespError):
        return False


class ThrowawayRedis:
    """One ``redis-server`` in a temporary directory, removed by ``close``."""

    def __init__(self, persistence: str = "rdb", binary: Path | None = None) -> None:
        if persistence not in PERSISTENCE:
            raise ValueError(f"unknown Redis persistence {persistence!r}")
        found = binary if binary is not None else find_redis_server()
        if found is None:
            raise ServerUnavailable(
                f"no redis-server: install Debian's redis-server package, or set {BINARY_VARIABLE}",
                "redis",
            )
        self.binary = found
        self.persistence = persistence
        self.root = Path(tempfile.mkdtemp(prefix="crashqueuelab-redis-"))
        self.data = self.root / "data"
        self.socket = self.root / "redis.sock"
        self.log = self.root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def arguments(self) -> list[str]:
        return [
            str(self.binary),
            "--port", "0",
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--dir", str(self.data),
            "--logfile", str(self.log),
            "--daemonize", "no",
            # Up to here a restart must not be refused for a background save it could not
            # finish: the lab judges what the files hold, not Redis's refusal to write.
            "--stop-writes-on-bgsave-error", "no",
            *PERSISTENCE[self.persistence],
        ]  # fmt: skip

    def start(self) -> Self:
        """Start on this server's data directory; returns once it answers PING (its data
        loaded). A server that exits or does not answer in time is ``ServerUnavailable``."""
        self.data.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            self.arguments(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own process group: a Ctrl-C meant for the lab reaches the lab, which stops
            # the server itself.
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self.socket.exists() and ping(self.socket):
                return self
            time.sleep(0.02)
        self.kill()
        raise ServerUnavailable(f"redis-server did not start: {self.last_words()}", "redis")

    def last_words(self) -> str:
        """The server log's last lines (where Redis says why it stopped), or "no log"."""
        if not self.log.exists():
            return "no log"
        lines = self.log.read_text(errors="replace").strip().splitlines()
        # Each line is "pid:role date time level message": the message is what matters.
        said = [line.split(" ", 5)[-1] for line in lines[-LOG_LINES:]]
        return " / ".join(said)[-LOG_CHARACTERS:] or "no log"

    def kill(self) -> None:
        """The server dies at once (SIGKILL), as a crash leaves it; bounded wait."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        try:
            self.process.wait(timeout=START_TIMEOUT_S)
        finally:
            self.process = None

    def processes(self) -> list[int]:
        return [] if self.process is None else [self.process.pid]

    def restart_after_crash(self) -> None:
        """The server dies as a power cut or OOM kill would leave it, then starts again:
        what it kept is what its persistence wrote."""
        self.kill()
        self.start()

    def close(self) -> None:
        try:
            self.kill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
