"""A throwaway RabbitMQ node for one run: Debian's ``rabbitmq-server`` on ports of its own,
with every file it writes in a temporary directory.

The node has its own name (``crashqueuelab-<hex>@localhost``), its own AMQP port (on the
loopback interface only), its own Erlang distribution port and its own ``epmd``, on a port
of its own (``ERL_EPMD_PORT``), which the lab starts and stops itself: a node started here
never registers with, nor is stopped by, an ``epmd`` or a ``rabbitmq-server`` service anyone
else runs. The ports are chosen below the kernel's ephemeral range
(``servers.base.free_port``), so that no client's outgoing connection takes one while the
node restarts after a crash. The nodes of a cluster find each other through one ``epmd``:
given ``epmd_port``, a node registers with the one its caller runs there and starts none
(the cluster's, ``lab.failover.rabbitcluster``, which outlives any node it kills). Its database
(``RABBITMQ_MNESIA_BASE``), its logs, its configuration file, its enabled-plugins file
(none: the node starts with no plugin) and its Erlang cookie (``HOME``) are under the
server's directory; ``/etc/rabbitmq`` is never read (``RABBITMQ_CONF_ENV_FILE`` and the
configuration files are the server's own).

Durability is the clients': a queue survives a restart when it is declared durable, a
message when it is published persistent (delivery mode 2) to a durable queue, and a
publisher knows RabbitMQ has it only once a publisher confirm came back. The server's
settings say nothing of it; a system that runs on this server names what its clients
declare. RabbitMQ's own metadata (vhosts, users, durable queues) is kept in its Mnesia
database in the data directory, written before RabbitMQ answers the command.

``ThrowawayRabbitMQ`` follows the shape of every throwaway server
(``servers.base.Throwaway``); what is RabbitMQ's own is here.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.servers.base import (
    Description,
    Throwaway,
    alive,
    binary_version,
    free_port,
    signal_all,
    wait_until,
)

#: Where the children of a run find the server: its AMQP URL.
URL_VARIABLE = "CRASHQUEUELAB_RABBITMQ_URL"
#: How ``rabbitmqctl`` reaches the node, for the judges' reader: "node,epmd-port,cookie".
CONTROL_VARIABLE = "CRASHQUEUELAB_RABBITMQ_CONTROL"
#: A directory holding ``rabbitmq-server`` and ``rabbitmqctl``, where Debian's is not used.
BIN_VARIABLE = "CRASHQUEUELAB_RABBITMQ_BIN"
#: Where Debian's package puts the scripts that run the server as the caller (the ones in
#: /usr/sbin switch to the rabbitmq account and its home).
DEBIAN_BINARIES = Path("/usr/lib/rabbitmq/bin")
#: Every wait for the server is bounded.
START_TIMEOUT_S = 90.0
#: The settings of every node the lab starts (the AMQP listener is added per node).
SETTINGS: Mapping[str, str] = {
    # The lab judges what a queue keeps, not RabbitMQ's refusal to accept publishes on a
    # small temporary file system (its default alarm is at 50 MB free).
    "disk_free_limit.absolute": "1MB",
    "log.console": "false",
    "log.file.level": "info",
}
#: How much of the node's log a refusal to start quotes.
LOG_CHARACTERS = 600
#: What RabbitMQ answers first on a connection that sent AMQP 0-9-1's protocol header: a
#: method frame (type 1) on channel 0, Connection.Start.
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_METHOD_FRAME = 1


def find_binaries(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The directory with ``rabbitmq-server`` and ``rabbitmqctl``: the variable, then
    Debian's."""
    candidates = [Path(environ[BIN_VARIABLE])] if environ.get(BIN_VARIABLE) else []
    candidates.append(DEBIAN_BINARIES)
    for candidate in candidates:
        if (candidate / "rabbitmq-server").is_file() and (candidate / "rabbitmqctl").is_file():
            return candidate
    return None


def find_epmd(bindir: Path, environ: Mapping[str, str] = os.environ) -> Path | None:
    """Erlang's port mapper: beside the server's scripts (a test's stand-in), on PATH, or
    in the Erlang runtime's own directory."""
    found = [bindir / "epmd", *(Path(each) / "epmd" for each in environ.get("PATH", "").split(":"))]
    found.extend(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd")))
    return next((each for each in found if each.is_file()), None)


#: What Erlang says when the node's distribution port is taken, and how many times a start
#: that says it is tried again on another port.
DIST_PORT_TAKEN = "dist_port_already_used"
#: How the Erlang VM's last line begins when the node's boot failed (its reason follows: an
#: AMQP port taken says ``could_not_start_listener``).
BOOT_FAILED = "init terminating in do_boot"
#: The Erlang VM's crash dump (``ERL_CRASH_DUMP``), in the node's log directory: written when
#: the VM dies of an error or is asked for it (``ThrowawayRabbitMQ.dump``).
CRASH_DUMP = "erl_crash.dump"
PORT_RETRIES = 2


def amqp_ready(port: int, timeout_s: float = 2.0) -> bool:
    """Whether a broker on ``port`` answers AMQP 0-9-1's header with a method frame: it
    has booted (RabbitMQ opens its listener last)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
            connection.sendall(_PROTOCOL_HEADER)
            said = connection.recv(1)
    except OSError:
        return False
    return said == bytes([_METHOD_FRAME])


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found.extend(children)
        frontier.extend(children)
    return [pid for pid in found if alive(pid)]


class ThrowawayRabbitMQ(Throwaway):
    """One RabbitMQ node and its ``epmd`` in a temporary directory, removed by ``close``.

    ``stop`` asks the node to stop (SIGTERM: RabbitMQ closes its queues and connections and
    exits), then stops its ``epmd``; ``kill`` kills them all at once, as a power cut
    would."""

    name = "rabbitmq"
    start_timeout_s = START_TIMEOUT_S

    def __init__(
        self,
        bindir: Path | None = None,
        *,
        epmd_port: int | None = None,
        settings: Mapping[str, str] | None = None,
        advanced: str = "",
    ) -> None:
        """``epmd_port``: an ``epmd`` the caller runs there (the nodes of a cluster find each
        other through one); the node then starts none of its own. ``settings``: added to
        ``SETTINGS`` in the node's configuration file; ``advanced``: the Erlang terms of its
        ``advanced.config``, for what ``rabbitmq.conf`` cannot say."""
        found = bindir if bindir is not None else find_binaries()
        if found is None:
            raise ServerUnavailable(
                f"no rabbitmq-server: install Debian's rabbitmq-server package, or set"
                f" {BIN_VARIABLE}",
                "rabbitmq",
            )
        epmd = find_epmd(found)
        if epmd is None:
            raise ServerUnavailable("no epmd: install Debian's erlang-base package", "rabbitmq")
        self.bindir = found
        self.epmd_binary = epmd
        super().__init__()
        self.node = f"crashqueuelab-{secrets.token_hex(4)}@localhost"
        self.amqp_port = free_port()
        self.dist_port = free_port()
        self.own_epmd = epmd_port is None
        self.epmd_port = free_port() if epmd_port is None else epmd_port
        self.home = self.root / "home"
        self.logs = self.root / "logs"
        self.config = self.root / "rabbitmq.conf"
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.own_settings = dict(settings or {})
        self.advanced = advanced

    @property
    def url(self) -> str:
        """The AMQP URL of the default vhost, as RabbitMQ's default ``guest`` account (which
        it lets in from the loopback interface only)."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def cookie(self) -> Path:
        return self.home / ".erlang.cookie"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def settings(self) -> dict[str, str]:
        return {**SETTINGS, **self.own_settings}

    def environment(self) -> dict[str, str]:
        return {
            URL_VARIABLE: self.url,
            CONTROL_VARIABLE: f"{self.node},{self.epmd_port},{self.cookie}",
        }

    def control_environment(self) -> dict[str, str]:
        """What ``rabbitmq-server`` and ``rabbitmqctl`` are run with: only this node's
        files and ports, nothing of the caller's RabbitMQ variables."""
        inherited = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RABBITMQ_", "ERL_"))
        }
        return {
            **inherited,
            "HOME": str(self.home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.data),
            "RABBITMQ_LOG_BASE": str(self.logs),
            "RABBITMQ_CONFIG_FILE": str(self.config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.root / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.root / "rabbitmq.pid"),
            "ERL_CRASH_DUMP": str(self.logs / CRASH_DUMP),
        }

    def rabbitmqctl(self, *arguments: str, timeout_s: float | None = None) -> str:
        """``rabbitmqctl -n NODE ...``'s output; a command that fails is
        ``ServerUnavailable`` with what it said."""
        command = [str(self.bindir / "rabbitmqctl"), "-n", self.node, "-q", *arguments]
        try:
            completed = subprocess.run(
                command,
                env=self.control_environment(),
                capture_output=True,
                text=True,
                timeout=self.start_timeout_s if timeout_s is None else timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise ServerUnavailable(f"rabbitmqctl {arguments[0]} timed out", self.name) from error
        if completed.returncode != 0:
            said = (completed.stdout + completed.stderr).strip()[-LOG_CHARACTERS:]
            raise ServerUnavailable(
                f"rabbitmqctl {arguments[0]} failed (exit {completed.returncode}): {said}",
                self.name,
            )
        return completed.stdout

    def read_version(self) -> str:
        """The installed release, "3.10.8": from the directory it is installed in, where
        ``rabbitmqctl`` leads (Debian's ``.../rabbitmq_server-3.10.8/sbin/rabbitmqctl``), or
        else ``rabbitmqctl version`` with this node's own ``epmd`` port. Never with Erlang's
        default port: the VM ``rabbitmqctl`` starts leaves an ``epmd -daemon`` on 4369
        behind, which nothing of the lab's would stop."""
        installed = re.search(
            r"rabbitmq_server-(\d+\.\d+\.\d+)", str((self.bindir / "rabbitmqctl").resolve())
        )
        if installed is not None:
            return installed.group(1)
        return binary_version(
            [str(self.bindir / "rabbitmqctl"), "version"],
            r"(\d+\.\d+\.\d+)",
            self.name,
            env=self.control_environment(),
        )

    def describe(self) -> Description:
        return {**super().describe(), "node": self.node}

    def prepare(self) -> None:
        for directory in (self.data, self.home, self.logs):
            directory.mkdir(parents=True, exist_ok=True)
        lines = [f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}"]
        lines += [f"{key} = {value}" for key, value in {**SETTINGS, **self.own_settings}.items()]
        self.config.write_text("\n".join(lines) + "\n")
        (self.root / "enabled_plugins").write_text("[].\n")
        if self.advanced:
            (self.root / "advanced.config").write_text(self.advanced)
        (self.root / "rabbitmq-env.conf").write_text("")
        if not self.cookie.exists():
            self.cookie.write_text(secrets.token_hex(16))
            # Erlang refuses a cookie others can read.
            self.cookie.chmod(0o400)

    def launch(self) -> None:
        """Start ``epmd``, then the node; returns once the node answers on its AMQP port. A
        node that exits or does not answer in time is ``ServerUnavailable``, but for one
        that found its distribution port taken (another process bound it between the lab's
        choice and the node's start: the lab's race, never the node's failure), which is
        started again on a fresh one, ``PORT_RETRIES`` times at most. Only that port: the
        AMQP port is in the URL the node's clients were given."""
        logs = (self.logs / f"{self.node}.log", self.log)
        for attempt in range(PORT_RETRIES + 1):
            sizes = [log.stat().st_size if log.is_file() else 0 for log in logs]
            try:
                self._launch_once()
                return
            except ServerUnavailable:
                # This start's own words: the logs are appended to, start after start.
                said = b"".join(
                    log.read_bytes()[size:]
                    for log, size in zip(logs, sizes, strict=True)
                    if log.is_file()
                )
                if attempt == PORT_RETRIES or DIST_PORT_TAKEN.encode() not in said:
                    raise
                self.dist_port = free_port()

    def _launch_once(self) -> None:
        environment = self.control_environment()
        if self.own_epmd:
            self.epmd = self.start_epmd(self.epmd_binary, self.epmd_port, environment)
        with self.log.open("ab") as log:
            process = self.process = subprocess.Popen(
                [str(self.bindir / "rabbitmq-server")],
                env=environment,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C meant for the lab reaches the lab, which stops
                # the node itself.
                start_new_session=True,
            )

        def settled() -> bool:
            return process.poll() is not None or amqp_ready(self.amqp_port)

        if wait_until(settled, self.start_timeout_s, poll_s=0.05) and process.poll() is None:
            return
        self.kill()
        raise ServerUnavailable(f"rabbitmq-server did not start: {self.last_words()}", self.name)

    @staticmethod
    def start_epmd(
        binary: Path, port: int, environment: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """An ``epmd`` on ``port``, in a session of its own."""
        return subprocess.Popen(
            [str(binary), "-port", str(port)],
            env=dict(environment),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def last_words(self) -> str:
        """Why the Erlang VM gave up booting, when its script printed it (a node whose boot
        failed stops its applications in order, so its own log ends in their stopping, not
        the cause), else the end of the node's own log, else of what its script printed, or
        "no log"."""
        if self.log.is_file():
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith(BOOT_FAILED):
                    return line[:LOG_CHARACTERS]
        for log in (self.logs / f"{self.node}.log", self.log):
            if log.is_file() and log.stat().st_size:
                said = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
                return said[-LOG_CHARACTERS:]
        return "no log"

    def processes(self) -> list[int]:
        """The node's script, the Erlang VM and its helpers (each of them below the
        script), and its ``epmd``."""
        found = []
        if self.process is not None and self.process.poll() is None:
            found = [self.process.pid, *descendants(self.process.pid)]
        if self.epmd is not None and self.epmd.poll() is None:
            found.append(self.epmd.pid)
        return found

    def vm(self) -> int | None:
        """The node's Erlang VM (``beam.smp``, below its script), while it runs."""
        for pid in self.processes():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp":
                    return pid
        return None

    def answers(self, timeout_s: float) -> bool:
        """Whether the node answers ``rabbitmqctl ping`` within ``timeout_s``."""
        try:
            self.rabbitmqctl("ping", timeout_s=timeout_s)
        except ServerUnavailable:
            return False
        return True

    def dump(self) -> Path | None:
        """What a node that answers nothing is doing: SIGUSR1 makes its VM write a crash
        dump (each scheduler's and each Erlang process's state) into its log directory and
        halt; SIGCONT after it, so that a paused VM does it too. The dump once the VM is gone
        (bounded wait), or None: no VM running, or no dump written in time."""
        pid = self.vm()
        if pid is None:
            return None
        os.kill(pid, signal.SIGUSR1)
        os.kill(pid, signal.SIGCONT)
        wait_until(lambda: not alive(pid), self.start_timeout_s, 0.1)
        dump = self.logs / CRASH_DUMP
        return dump if dump.is_file() and not alive(pid) else None

    def forget(self) -> None:
        """The killed processes the lab started are reaped (bounded)."""
        for process in (self.process, self.epmd):
            if process is not None:
                process.wait(timeout=START_TIMEOUT_S)
        self.process = self.epmd = None

    def stop(self) -> None:
        """SIGTERM to the node (RabbitMQ stops cleanly on it), a bounded wait, then its
        ``epmd``; whatever is left is killed."""
        listed = self.processes()
        if self.process is not None:
            signal_all(listed, signal.SIGTERM)
            wait_until(lambda: not any(alive(pid) for pid in listed), self.start_timeout_s, 0.05)
        self.kill(listed)


def control_from(value: str) -> tuple[str, int, Path]:
    """The node, ``epmd`` port and cookie a ``CONTROL_VARIABLE`` names."""
    node, port, cookie = value.split(",", 2)
    return node, int(port), Path(cookie)
