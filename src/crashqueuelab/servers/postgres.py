"""A throwaway PostgreSQL server for one run: initdb into a temporary directory, pg_ctl.

The server listens on a Unix socket inside its own directory only (no TCP port to collide
with), trusts local connections, and keeps PostgreSQL's durable defaults (``fsync=on``,
``synchronous_commit=on``). PostgreSQL refuses to run as root, so when the lab runs as root
the server runs as the ``postgres`` account (or ``nobody``) and owns its directory.

A server the lab did not start is given by DSN instead (``--dsn``); the lab then never
stops or restarts it. ``ThrowawayServer`` follows the shape of every throwaway server
(``servers.base.Throwaway``); what is PostgreSQL's own is here.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.servers.base import Description, Throwaway, binary_version, signal_all

__all__ = [
    "BIN_VARIABLE",
    "CRASHABLE_VARIABLE",
    "DEBIAN_BINARIES",
    "DSN_VARIABLE",
    "SERVER_ACCOUNTS",
    "SETTINGS",
    "START_TIMEOUT_S",
    "ThrowawayServer",
    "ThrowawayStandby",
    "find_binaries",
    "signal_all",
]

#: Where the children of a run find the server (the run's parent process sets it).
DSN_VARIABLE = "CRASHQUEUELAB_POSTGRES_DSN"
#: The ``synchronous_commit`` level the run's replicated server runs at, which the queue is
#: then opened accepting (a failover campaign at a level that waits less than ``on`` names
#: it to its children); unset, the queue refuses any level but ``on``.
LEVEL_VARIABLE = "CRASHQUEUELAB_POSTGRES_SYNCHRONOUS_COMMIT"
#: Names the directory of a server a run lets its crash children crash and start again.
CRASHABLE_VARIABLE = "CRASHQUEUELAB_POSTGRES_CRASHABLE"
#: A directory holding ``initdb`` and ``pg_ctl``, where they are not on PATH.
BIN_VARIABLE = "CRASHQUEUELAB_POSTGRES_BIN"
#: Where Debian installs the server binaries (one directory per major version).
DEBIAN_BINARIES = Path("/usr/lib/postgresql")
#: Every wait for the server is bounded.
START_TIMEOUT_S = 60
#: Accounts the server may run as when the lab runs as root, in order of preference.
SERVER_ACCOUNTS = ("postgres", "nobody")
#: The server's settings for a lab run: durable, local, and enough connections for chaos.
SETTINGS: Mapping[str, str] = {
    "listen_addresses": "''",
    "port": "5432",
    "max_connections": "120",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "logging_collector": "off",
}


def find_binaries(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The directory with ``initdb`` and ``pg_ctl``: the variable, PATH, then Debian's."""
    candidates: list[Path] = []
    if environ.get(BIN_VARIABLE):
        candidates.append(Path(environ[BIN_VARIABLE]))
    on_path = shutil.which("pg_ctl", path=environ.get("PATH"))
    if on_path:
        candidates.append(Path(on_path).parent)
    if DEBIAN_BINARIES.is_dir():
        versions = sorted(
            (entry for entry in DEBIAN_BINARIES.iterdir() if entry.name.isdigit()),
            key=lambda entry: int(entry.name),
            reverse=True,
        )
        candidates.extend(version / "bin" for version in versions)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    return None


def _server_account() -> pwd.struct_passwd | None:
    """The account to run the server as: None when the lab is not root (it runs as us)."""
    if os.geteuid() != 0:
        return None
    for name in SERVER_ACCOUNTS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise ServerUnavailable(
        "running as root and no unprivileged account to run PostgreSQL as"
        f" ({', '.join(SERVER_ACCOUNTS)})"
    )


def _process_table() -> dict[int, tuple[int, list[str]]]:
    """Every process now: its parent and its command line (empty for a zombie)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Field 4 of stat is the parent; the name before it may hold spaces.
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if argv[-1] == "":
                argv.pop()
            table[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), argv)
    return table


class ThrowawayServer(Throwaway):
    """One PostgreSQL cluster in a temporary directory, removed by ``close``."""

    name = "postgres"
    start_timeout_s = START_TIMEOUT_S

    def __init__(
        self,
        bindir: Path | None = None,
        settings: Mapping[str, str] = SETTINGS,
        initdb_options: Sequence[str] = (),
        root: Path | None = None,
    ):
        found = bindir if bindir is not None else find_binaries()
        if found is None:
            raise ServerUnavailable(
                "no PostgreSQL server binaries (initdb, pg_ctl): install Debian's postgresql"
                f" package, set {BIN_VARIABLE}, or give the DSN of a running server"
            )
        self.bindir = found
        self._settings = dict(settings)
        self.initdb_options = tuple(initdb_options)
        self.account = _server_account()
        super().__init__(root)
        self._running = False

    @classmethod
    def running_at(cls, root: Path) -> ThrowawayServer:
        """The server another process of the run started in ``root`` (its socket's
        directory), for this one to crash and start again: never to close, which would
        remove the other's directory."""
        server = cls(root=root)
        server._running = True
        return server

    @property
    def running(self) -> bool:
        return self._running

    @property
    def settings(self) -> dict[str, str]:
        """What this server's configuration adds to PostgreSQL's defaults."""
        return self._settings

    @property
    def user(self) -> str:
        return self.account.pw_name if self.account else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def dsn(self) -> str:
        return (
            f"host={self.root} port={self.settings['port']} user={self.user} dbname=postgres"
            " connect_timeout=10"
        )

    def environment(self) -> dict[str, str]:
        return {DSN_VARIABLE: self.dsn}

    def read_version(self) -> str:
        """``pg_ctl --version``: "pg_ctl (PostgreSQL) 15.18 (Debian ...)" says 15.18."""
        return binary_version(
            [str(self.bindir / "pg_ctl"), "--version"], r"\(PostgreSQL\) (\S+)", self.name
        )

    def describe(self) -> Description:
        return {**super().describe(), "initdb_options": list(self.initdb_options)}

    def _run(self, arguments: Sequence[str]) -> None:
        command = [str(self.bindir / arguments[0]), *arguments[1:]]
        what = f"{arguments[0]} {arguments[1] if len(arguments) > 1 else ''}"
        timeout_s = self.start_timeout_s + 30
        try:
            completed = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                user=self.account.pw_uid if self.account else None,
                group=self.account.pw_gid if self.account else None,
                extra_groups=[] if self.account else None,
                cwd=self.root,
            )
        except subprocess.TimeoutExpired as error:
            raise ServerUnavailable(f"{what} did not finish in {timeout_s:.0f} s") from error
        if completed.returncode != 0:
            log_tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise ServerUnavailable(
                f"{what} failed"
                f" (exit {completed.returncode}): {completed.stderr.strip()[-1000:]}"
                + (f"\nserver log: {log_tail}" if log_tail else "")
            )

    def _own(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def prepare(self) -> None:
        self.initdb()

    def initdb(self) -> None:
        """Create the cluster (once), with this server's settings in its configuration."""
        self._own(self.root)
        if not self.data.exists():
            initdb = ["initdb", "-D", str(self.data), "-U", self.user, "--auth=trust"]
            self._run([*initdb, "-E", "UTF8", "--no-instructions", *self.initdb_options])
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write("\n# crashqueuelab throwaway server\n")
                conf.write(f"unix_socket_directories = '{self.root}'\n")
                for name, value in self.settings.items():
                    conf.write(f"{name} = {value}\n")

    def adopt(self, cluster: Path) -> None:
        """Make the (stopped or crashed) cluster directory ``cluster`` this server's data, as
        the server's account owns a data directory. Its ``postmaster.pid`` is dropped: the
        process it names is gone (a reboot), and its number may belong to another by now."""
        self._own(self.root)
        if cluster != self.data:
            shutil.copytree(cluster, self.data, symlinks=True)
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        for directory, _, files in os.walk(self.data):
            self._own(Path(directory))
            for name in files:
                self._own(Path(directory) / name)
        self.data.chmod(0o700)

    def _on_this_data(self, argv: Sequence[str]) -> bool:
        """Whether a command line is a postmaster's on this data directory, or one of those
        ``pg_ctl start`` runs to become it (pg_ctl's own fork, then the shell that execs the
        postmaster)."""
        data = str(self.data)
        if any(flag == "-D" and value == data for flag, value in itertools.pairwise(argv)):
            return True
        return len(argv) == 3 and argv[1] == "-c" and f'-D "{data}"' in argv[2]

    def processes(self) -> list[int]:
        """The server's processes: the postmaster and its children. The postmaster is the
        process its pid file names, if that one runs on this data directory (after a crash
        the number may be another's by now); else the one ``pg_ctl`` is starting on it (a
        start that failed before the postmaster wrote its pid file)."""
        table = _process_table()
        try:
            named = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            named = None
        if named is not None and self._on_this_data(table.get(named, (0, []))[1]):
            postmasters = [named]
        else:
            postmasters = [pid for pid, (_, argv) in table.items() if self._on_this_data(argv)]
        children = [
            pid for pid, (parent, _) in table.items() if parent in postmasters and pid != parent
        ]
        return [*postmasters, *children]

    def forget(self) -> None:
        self._running = False

    def launch(self) -> None:
        """Start the existing cluster (after a stop, crash recovery runs here); ``pg_ctl -w``
        waits until it accepts connections.

        The socket goes into this server's directory even when the cluster was copied from
        another one (its configuration names the other's)."""
        socket = f"-k {shlex.quote(str(self.root))}"
        pg_ctl = ["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", socket]
        self._run([*pg_ctl, "-w", "-t", str(int(self.start_timeout_s)), "start"])
        self._running = True

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``; ``immediate`` is a crash: no checkpoint, recovery at start."""
        if not (self.data / "PG_VERSION").exists():
            # Its data directory went away under it (a power cut's mount): nothing to stop.
            self._running = False
        if self._running:
            self._running = False
            self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every process quits at once, nothing is written;
        the next start runs crash recovery."""
        self.stop("immediate")


class ThrowawayStandby(ThrowawayServer):
    """A streaming standby of a running ``ThrowawayServer``: ``pg_basebackup -R`` of the
    primary into this server's own directory (its socket there too), replicating
    asynchronously unless the primary names it in ``synchronous_standby_names``;
    ``promote`` makes it a primary, as a failover does."""

    name = "postgres-standby"

    def __init__(self, primary: ThrowawayServer, upstream: str | None = None) -> None:
        # pg_basebackup lives beside the real pg_ctl (a PATH entry may be a link to it).
        real = (primary.bindir / "pg_ctl").resolve().parent
        bindir = primary.bindir if (primary.bindir / "pg_basebackup").is_file() else real
        super().__init__(bindir, primary.settings, primary.initdb_options)
        self.primary = primary
        #: The connection string the standby streams through, when not the primary's own
        #: socket (a fault proxy's address, so that a fault can make the standby lag).
        self.upstream = upstream

    def prepare(self) -> None:
        """The base backup, once: the primary's data as of now, streamed WAL included, and
        ``standby.signal`` with the primary's connection (``-R``), or ``upstream``."""
        self._own(self.root)
        if not self.data.exists():
            backup = ["pg_basebackup", "-D", str(self.data), "-R", "-X", "stream"]
            self._run([*backup, "--checkpoint=fast", "-d", self.primary.dsn])
            if self.upstream is not None:
                # The last setting in the file wins over the one -R wrote.
                conninfo = self.upstream.replace("'", "''")
                with (self.data / "postgresql.auto.conf").open("a") as conf:
                    conf.write(f"primary_conninfo = '{conninfo}'\n")

    def describe(self) -> Description:
        return {**super().describe(), "standby_of": str(self.primary.root)}

    def promote(self) -> None:
        """``pg_ctl promote``, waiting until it accepts writes."""
        self._run(["pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote"])
