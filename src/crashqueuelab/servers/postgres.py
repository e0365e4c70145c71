"""A throwaway PostgreSQL server for one run: initdb into a temporary directory, pg_ctl.

The server listens on a Unix socket inside its own directory only (no TCP port to collide
with), trusts local connections, and keeps PostgreSQL's durable defaults (``fsync=on``,
``synchronous_commit=on``). PostgreSQL refuses to run as root, so when the lab runs as root
the server runs as the ``postgres`` account (or ``nobody``) and owns its directory.

A server the lab did not start is given by DSN instead (``--dsn``); the lab then never
stops or restarts it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
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

#: Where the children of a run find the server (the run's parent process sets it).
DSN_VARIABLE = "CRASHQUEUELAB_POSTGRES_DSN"
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


def signal_all(pids: Sequence[int], how: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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


class ThrowawayServer:
    """One PostgreSQL cluster in a temporary directory, removed by ``close``."""

    def __init__(
        self,
        bindir: Path | None = None,
        settings: Mapping[str, str] = SETTINGS,
        initdb_options: Sequence[str] = (),
    ):
        found = bindir if bindir is not None else find_binaries()
        if found is None:
            raise ServerUnavailable(
                "no PostgreSQL server binaries (initdb, pg_ctl): install Debian's postgresql"
                f" package, set {BIN_VARIABLE}, or give the DSN of a running server"
            )
        self.bindir = found
        self.settings = dict(settings)
        self.initdb_options = tuple(initdb_options)
        self.account = _server_account()
        self.root = Path(tempfile.mkdtemp(prefix="crashqueuelab-postgres-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.running = False

    @property
    def user(self) -> str:
        return self.account.pw_name if self.account else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def dsn(self) -> str:
        return (
            f"host={self.root} port={self.settings['port']} user={self.user} dbname=postgres"
            " connect_timeout=10"
        )

    def _run(self, arguments: Sequence[str]) -> None:
        command = [str(self.bindir / arguments[0]), *arguments[1:]]
        completed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S + 30,
            check=False,
            user=self.account.pw_uid if self.account else None,
            group=self.account.pw_gid if self.account else None,
            extra_groups=[] if self.account else None,
            cwd=self.root,
        )
        if completed.returncode != 0:
            log_tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise ServerUnavailable(
                f"{arguments[0]} {arguments[1] if len(arguments) > 1 else ''} failed"
                f" (exit {completed.returncode}): {completed.stderr.strip()[-1000:]}"
                + (f"\nserver log: {log_tail}" if log_tail else "")
            )

    def _own(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

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

    def start(self) -> Self:
        """initdb (first time only) and start; returns once the server accepts connections."""
        self.initdb()
        self.start_again()
        return self

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

    def processes(self) -> list[int]:
        """The server's processes: the postmaster (from its pid file) and its children."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    # Field 4 of stat is the parent; the name before it may hold spaces.
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry.name))
        return [postmaster, *children]

    def kill(self, pids: Sequence[int]) -> None:
        """Every process of the server dies at once (SIGKILL), as in a power cut; returns
        once they are gone (bounded)."""
        self.running = False
        signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)

    def start_again(self) -> None:
        """Start the existing cluster (after a stop, crash recovery runs here).

        The socket goes into this server's directory even when the cluster was copied from
        another one (its configuration names the other's)."""
        socket = f"-k {shlex.quote(str(self.root))}"
        pg_ctl = ["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", socket]
        self._run([*pg_ctl, "-w", "-t", str(START_TIMEOUT_S), "start"])
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``; ``immediate`` is a crash: no checkpoint, recovery at start."""
        if self.running:
            self.running = False
            self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def restart_after_crash(self) -> None:
        """The server dies as a power cut or OOM kill would leave it, then starts again."""
        self.stop("immediate")
        self.start_again()

    def close(self) -> None:
        try:
            if not (self.data / "PG_VERSION").exists():
                # Its data directory went away under it (a power cut's mount): nothing to stop.
                self.running = False
            self.stop("fast")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
