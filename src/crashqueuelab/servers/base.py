"""The shape every throwaway server follows (``Throwaway``), and what they share.

A throwaway server lives in a directory of its own under the system temp directory
(``root``: its data directory ``data``, its log ``log``, its socket), made with the object
and removed by ``close``. ``start`` makes what a first start needs and starts the server,
returning once it is ready; every wait is bounded (``start_timeout_s``). A start that fails
raises ``ServerUnavailable`` and leaves none of the server's processes running; its
directory stays until ``close``, so that its log can still be kept as evidence. ``stop``
stops it, ``kill`` kills every process at once, ``restart_after_crash`` crashes it as a
power cut or an OOM kill would and starts it again (what it keeps is what its persistence
had made durable). ``processes`` lists its processes, ``describe`` says what it is (its
name, the version its binary reports, its settings), and ``environment`` gives the
variables that name it to a run's children. As a context manager it is closed on leaving,
also on failure.

Each server says only what is its own: how it is prepared and launched, how it is stopped
and crashed, which processes are its, its version and settings (``servers.postgres``,
``servers.redis``). A server of several processes started together (a primary and its
standby, a replica and its sentinel) is one ``Throwaway`` whose launch starts them all and
whose ``processes`` lists them all.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from crashqueuelab.core.errors import ServerUnavailable

#: Every wait for a server (its start, its processes dying) is bounded by this.
START_TIMEOUT_S = 60.0
#: A binary asked for its version answers at once, or not at all.
VERSION_TIMEOUT_S = 30.0

#: What ``describe`` returns: ``{"server": NAME, "version": VERSION, "settings": {...}}``
#: and whatever else a server says of itself.
Description = dict[str, object]


#: Where the ports of the servers that listen on TCP are chosen: from here up to the kernel's
#: ephemeral range (``ip_local_port_range``), whose ports any outgoing connection's local end
#: may take, also one a server listened on while it is down, and it then cannot start again
#: on the port its clients were given.
LOWEST_PORT = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: How many ports below that range are tried before the kernel's choice is taken instead.
PORT_CANDIDATES = 64


def ephemeral_floor(source: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel gives an outgoing connection (Linux's default where it
    cannot be read)."""
    try:
        return int(source.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(floor: int | None = None, choose: Callable[[int], int] = secrets.randbelow) -> int:
    """A TCP port on the loopback interface that nothing listens on now, below the
    ephemeral range (see ``LOWEST_PORT``), ``choose(n)`` picking among the ``n`` there. Another
    server could still take it first; where no port there binds (or there is no room below
    the range), the kernel's choice."""
    top = ephemeral_floor() if floor is None else floor
    candidates = top - LOWEST_PORT
    for _ in range(PORT_CANDIDATES if candidates > 0 else 0):
        port = LOWEST_PORT + choose(candidates)
        if _binds(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def signal_all(pids: Sequence[int], how: signal.Signals) -> None:
    """Send ``how`` to each of ``pids``, those already gone aside."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    """Whether ``condition`` held within ``timeout_s`` (it is asked at least once)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _kill_and_wait(pids: Sequence[int], deadline: float) -> None:
    """SIGKILL each of ``pids``; return once none is alive, or at ``deadline``."""
    signal_all(pids, signal.SIGKILL)
    wait_until(lambda: not any(alive(pid) for pid in pids), deadline - time.monotonic())


def binary_version(
    command: Sequence[str],
    pattern: str,
    server: str,
    env: Mapping[str, str] | None = None,
) -> str:
    """The version a server's binary reports: the first group of ``pattern`` in what
    ``command`` prints (run with ``env``, when given). A binary that does not say it is
    ``ServerUnavailable``."""
    name = Path(command[0]).name
    try:
        completed = subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ServerUnavailable(f"{name} did not say its version: {error}", server) from error
    found = re.search(pattern, completed.stdout)
    if completed.returncode != 0 or found is None:
        said = (completed.stdout + completed.stderr).strip()[-300:]
        raise ServerUnavailable(
            f"{name} did not say its version (exit {completed.returncode}): {said}", server
        )
    return found.group(1)


class Throwaway(ABC):
    """One server in a temporary directory of its own, removed by ``close``."""

    #: The server's name: ``describe`` says it, and its directory's name starts with it.
    name: ClassVar[str]
    #: The bound on each wait for this server (a test may shorten it).
    start_timeout_s: float = START_TIMEOUT_S

    def __init__(self, root: Path | None = None) -> None:
        # ``root``: the directory of a server another process made (see its subclass).
        self.root = root or Path(tempfile.mkdtemp(prefix=f"crashqueuelab-{self.name}-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._version: str | None = None

    # What each server says of itself.

    @property
    @abstractmethod
    def running(self) -> bool:
        """Whether the server was started and has not been stopped or killed since."""

    @property
    @abstractmethod
    def settings(self) -> Mapping[str, str]:
        """The settings the server runs with (those that name its own files left out)."""

    @abstractmethod
    def prepare(self) -> None:
        """Make what a first start needs (once; it keeps what is already there)."""

    @abstractmethod
    def launch(self) -> None:
        """Start the server on its data directory; return once it is ready (a bounded
        wait), or raise ``ServerUnavailable``."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the server, if it runs; returns once it has (a bounded wait)."""

    @abstractmethod
    def processes(self) -> list[int]:
        """Every process of the server that runs now."""

    @abstractmethod
    def read_version(self) -> str:
        """The version the server's binary reports (asked once: see ``version``)."""

    @abstractmethod
    def environment(self) -> dict[str, str]:
        """The variables that name this server to a run's children, and their values."""

    @abstractmethod
    def forget(self) -> None:
        """The server's processes are gone (killed): what it kept of them is let go."""

    # The same for every server.

    def start(self) -> Self:
        """Prepare (the first time) and start; returns once the server is ready."""
        self.prepare()
        self.start_again()
        return self

    def start_again(self) -> None:
        """Start on the data that is there (after a stop; after a crash, the server's own
        recovery runs here). A start that fails leaves none of the server's processes."""
        try:
            self.launch()
        except BaseException:
            self.kill()
            raise

    def crash(self) -> None:
        """The server dies as a power cut or an OOM kill would leave it."""
        self.kill()

    def restart_after_crash(self) -> None:
        """The server dies as a power cut or OOM kill would leave it, then starts again:
        what it kept is what its persistence had made durable."""
        self.crash()
        self.start_again()

    def kill(self, pids: Sequence[int] | None = None) -> None:
        """Every process of the server dies at once (SIGKILL), as in a power cut; returns
        once they are gone (bounded). ``pids``: the processes as listed before, for a
        server that can no longer list them (its data directory went away under it)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        listed = self.processes() if pids is None else list(pids)
        try:
            while listed:
                _kill_and_wait(listed, deadline)
                # A process being started while the list was made escapes it (a start that
                # timed out: pg_ctl's fork execs the postmaster a moment later): listed again.
                again = pids is None and time.monotonic() < deadline
                listed = self.processes() if again else []
        finally:
            self.forget()

    def version(self) -> str:
        if self._version is None:
            self._version = self.read_version()
        return self._version

    def describe(self) -> Description:
        """What this server is: its name, the version its binary reports, its settings."""
        return {"server": self.name, "version": self.version(), "settings": dict(self.settings)}

    def close(self) -> None:
        """Stop the server (whatever a stop leaves is killed) and remove its directory."""
        try:
            self.stop()
        finally:
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
