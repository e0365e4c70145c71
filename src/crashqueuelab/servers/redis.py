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

``ThrowawayRedis`` follows the shape of every throwaway server (``servers.base.Throwaway``);
what is Redis's own is here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.judges.resp import RespConnection, RespError
from crashqueuelab.servers.base import Description, Throwaway, binary_version, wait_until

#: Where the children of a run find the server (the run's parent process sets it).
SOCKET_VARIABLE = "CRASHQUEUELAB_REDIS_SOCKET"
#: Where a replicated server's clients find its Sentinels ("host:port,...") instead, and
#: the name they know the primary by.
SENTINELS_VARIABLE = "CRASHQUEUELAB_REDIS_SENTINELS"
MASTER_VARIABLE = "CRASHQUEUELAB_REDIS_MASTER"
#: Redis's WAIT after each write a client acknowledges: "REPLICAS,TIMEOUT_MS".
WAIT_VARIABLE = "CRASHQUEUELAB_REDIS_WAIT"
#: A ``redis-server`` to use where it is not on PATH.
BINARY_VARIABLE = "CRASHQUEUELAB_REDIS_SERVER"
#: Every wait for the server is bounded.
START_TIMEOUT_S = 60.0
#: The options that name one server's own files (``describe`` leaves them out).
PATH_OPTIONS = frozenset({"--unixsocket", "--dir", "--logfile"})
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


class ThrowawayRedis(Throwaway):
    """One ``redis-server`` in a temporary directory, removed by ``close``.

    Stopping it kills it, as a crash does: nothing is saved at the stop that its persistence
    had not written already (a ``SHUTDOWN`` would write a snapshot first)."""

    name = "redis"
    start_timeout_s = START_TIMEOUT_S

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
        super().__init__()
        self.socket = self.root / "redis.sock"
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

    @property
    def settings(self) -> dict[str, str]:
        """The command line's options, those that name this server's files left out."""
        words = self.arguments()[1:]
        return {
            option.removeprefix("--"): value
            for option, value in zip(words[::2], words[1::2], strict=True)
            if option not in PATH_OPTIONS
        }

    def environment(self) -> dict[str, str]:
        return {SOCKET_VARIABLE: str(self.socket)}

    def read_version(self) -> str:
        """``redis-server --version``: "Redis server v=7.0.15 sha=..." says 7.0.15."""
        return binary_version([str(self.binary), "--version"], r"\bv=(\S+)", self.name)

    def describe(self) -> Description:
        return {**super().describe(), "persistence": self.persistence}

    def prepare(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)

    def launch(self) -> None:
        """Start on this server's data directory; returns once it answers PING (its data
        loaded). A server that exits or does not answer in time is ``ServerUnavailable``."""
        self.socket.unlink(missing_ok=True)
        process = self.process = subprocess.Popen(
            self.arguments(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own process group: a Ctrl-C meant for the lab reaches the lab, which stops
            # the server itself.
            start_new_session=True,
        )

        def settled() -> bool:
            return process.poll() is not None or (self.socket.exists() and ping(self.socket))

        if wait_until(settled, self.start_timeout_s, poll_s=0.02) and process.poll() is None:
            return
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

    def processes(self) -> list[int]:
        """The server's one process while it runs (once it has exited and been reaped, its
        number may be another's)."""
        if self.process is None or self.process.poll() is not None:
            return []
        return [self.process.pid]

    def forget(self) -> None:
        """The killed server is reaped (bounded)."""
        process, self.process = self.process, None
        if process is not None:
            process.wait(timeout=START_TIMEOUT_S)

    def stop(self) -> None:
        """Killed: see the class."""
        self.kill()
