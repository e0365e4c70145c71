"""The shape every throwaway server follows (``servers.base.Throwaway``), on the real servers:
each starts in a directory of its own under the system temp directory, is ready when
``start`` returns, names the version its binary reports, keeps across a crash what its
persistence promises, stops, is removed by ``close``, and a start that fails raises
``ServerUnavailable`` and leaves no process and no directory behind.

Every server a test starts is in a ``with`` block: it is stopped and removed also when the
test fails. No test sleeps: each wait is the server's own bounded one.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from crashqueuelab.core.errors import ServerUnavailable
from crashqueuelab.judges.resp import RespConnection, text
from crashqueuelab.lab.runs.servers import started
from crashqueuelab.servers.base import (
    LOWEST_PORT,
    PORT_CANDIDATES,
    Throwaway,
    alive,
    ephemeral_floor,
    free_port,
)
from crashqueuelab.servers.postgres import (
    DSN_VARIABLE,
    SETTINGS,
    ThrowawayServer,
    find_binaries,
)
from crashqueuelab.servers.redis import SOCKET_VARIABLE, ThrowawayRedis, find_redis_server, ping

needs_postgres = pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries")
needs_redis = pytest.mark.skipif(find_redis_server() is None, reason="no redis-server here")


def left_running(root: Path) -> list[int]:
    """Every process that still works in ``root`` (its working directory or its command
    line there): what a server that was stopped must not leave."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if (cwd.startswith(str(root)) or str(root) in argv) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


# What a test needs to know of each server: how to make one, ask it whether it serves, what
# version it says it runs, and write and read one value.


def _pg_query(server: Throwaway, sql: str, *params: str) -> list[tuple[object, ...]]:
    import psycopg

    assert isinstance(server, ThrowawayServer)
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _pg_ready(server: Throwaway) -> bool:
    import psycopg

    try:
        return _pg_query(server, "SELECT 1") == [(1,)]
    except psycopg.OperationalError:
        return False


def _pg_version(server: Throwaway) -> str:
    [(said,)] = _pg_query(server, "SHOW server_version")
    return str(said).split()[0]


def _pg_set(server: Throwaway, key: str, value: str) -> None:
    _pg_query(server, "CREATE TABLE IF NOT EXISTS kv (key text PRIMARY KEY, value text)")
    _pg_query(server, "INSERT INTO kv VALUES (%s, %s)", key, value)


def _pg_get(server: Throwaway, key: str) -> str:
    rows = _pg_query(server, "SELECT value FROM kv WHERE key = %s", key)
    return str(rows[0][0]) if rows else ""


def _redis(server: Throwaway, *command: str) -> str:
    assert isinstance(server, ThrowawayRedis)
    with RespConnection(server.socket) as connection:
        return text(connection.command(*command))


def _redis_set(server: Throwaway, key: str, value: str) -> None:
    assert _redis(server, "SET", key, value) == "OK"


def _redis_ready(server: Throwaway) -> bool:
    assert isinstance(server, ThrowawayRedis)
    return ping(server.socket)


def _redis_version(server: Throwaway) -> str:
    [said] = re.findall(r"^redis_version:(\S+)", _redis(server, "INFO", "server"), re.M)
    return str(said)


@dataclass(frozen=True)
class Kind:
    make: Callable[[], Throwaway]
    ready: Callable[[Throwaway], bool]
    version: Callable[[Throwaway], str]
    set: Callable[[Throwaway, str, str], None]
    get: Callable[[Throwaway, str], str]


POSTGRES = Kind(ThrowawayServer, _pg_ready, _pg_version, _pg_set, _pg_get)


def redis(persistence: str) -> Kind:
    return Kind(
        lambda: ThrowawayRedis(persistence),
        _redis_ready,
        _redis_version,
        _redis_set,
        lambda server, key: _redis(server, "GET", key),
    )


KINDS = [
    pytest.param(POSTGRES, id="postgres", marks=needs_postgres),
    pytest.param(redis("rdb"), id="redis", marks=needs_redis),
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_starts_ready_in_its_own_directory_stops_and_is_removed(kind: Kind) -> None:
    with kind.make() as server:
        assert server.root.parent == Path(tempfile.gettempdir())
        assert server.root.name.startswith(f"crashqueuelab-{server.name}-")
        assert server.processes() == []
        assert server.start() is server
        assert server.running
        assert kind.ready(server)
        pids = server.processes()
        assert pids
        # The server's main process; a child may be on its way out already (the backend of
        # the readiness check's closed connection).
        assert alive(pids[0])
        server.stop()
        assert not kind.ready(server)
        assert server.processes() == []
        assert not any(alive(pid) for pid in pids)
        assert left_running(server.root) == []
        server.start_again()
        assert kind.ready(server)
    assert not server.root.exists()
    assert left_running(server.root) == []


@needs_postgres
def test_postgres_describes_itself_with_the_version_its_binary_and_server_say() -> None:
    with ThrowawayServer() as server:
        said = subprocess.run(
            [str(server.bindir / "pg_ctl"), "--version"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        server.start()
        described = server.describe()
        assert described == {
            "server": "postgres",
            "version": _pg_version(server),
            "settings": dict(SETTINGS),
            "initdb_options": [],
        }
        assert f"(PostgreSQL) {described['version']}" in said
        assert re.fullmatch(r"\d+\.\d+", str(described["version"]))


@needs_redis
def test_redis_describes_itself_with_the_version_its_binary_and_server_say() -> None:
    with ThrowawayRedis("aof-always") as server:
        said = subprocess.run(
            [str(server.binary), "--version"], capture_output=True, text=True, check=False
        ).stdout
        server.start()
        described = server.describe()
        assert described == {
            "server": "redis",
            "version": _redis_version(server),
            "settings": {
                "port": "0",
                "unixsocketperm": "700",
                "daemonize": "no",
                "stop-writes-on-bgsave-error": "no",
                "save": "",
                "appendonly": "yes",
                "appendfsync": "always",
            },
            "persistence": "aof-always",
        }
        assert f"v={described['version']} " in said
        assert re.fullmatch(r"\d+\.\d+\.\d+", str(described["version"]))


@pytest.mark.parametrize(
    ("kind", "kept"),
    [
        # PostgreSQL's durable defaults: a committed write survives a crash.
        pytest.param(POSTGRES, "42", id="postgres", marks=needs_postgres),
        # Each write synced before Redis answers it.
        pytest.param(redis("aof-always"), "42", id="redis-aof-always", marks=needs_redis),
        # No snapshot since the write: a restart keeps none of it.
        pytest.param(redis("rdb"), "", id="redis-rdb", marks=needs_redis),
        pytest.param(redis("none"), "", id="redis-none", marks=needs_redis),
    ],
)
def test_a_restart_after_a_crash_keeps_what_the_persistence_promises(kind: Kind, kept: str) -> None:
    with kind.make() as server:
        server.start()
        kind.set(server, "answer", "42")
        before = server.processes()
        server.restart_after_crash()
        assert not any(pid in server.processes() for pid in before)
        assert not any(alive(pid) for pid in before)
        assert kind.ready(server)
        assert kind.get(server, "answer") == kept
    assert not server.root.exists()


@needs_redis
def test_redis_rdb_keeps_its_last_snapshot_across_a_crash() -> None:
    with ThrowawayRedis("rdb") as server:
        server.start()
        _redis(server, "SET", "snapshotted", "1")
        assert _redis(server, "SAVE") == "OK"
        _redis(server, "SET", "after", "2")
        server.restart_after_crash()
        assert (_redis(server, "GET", "snapshotted"), _redis(server, "GET", "after")) == ("1", "")


def assert_fails_leaving_nothing(server: Throwaway, said: str) -> ServerUnavailable:
    """``server.start()`` raises ServerUnavailable matching ``said``; no process of it is
    left, and leaving the block removes its directory."""
    with server:
        with pytest.raises(ServerUnavailable, match=said) as refused:
            server.start()
        assert not server.running
        assert server.processes() == []
        assert left_running(server.root) == []
    assert not server.root.exists()
    return refused.value


@needs_postgres
def test_a_postgres_start_refused_for_a_bad_setting_leaves_nothing() -> None:
    server = ThrowawayServer(settings={**SETTINGS, "shared_buffers": "plenty"})
    refused = assert_fails_leaving_nothing(server, "postgres server: pg_ctl -D failed")
    assert 'invalid value for parameter "shared_buffers"' in str(refused)


@needs_postgres
def test_a_postgres_start_that_times_out_leaves_no_postmaster_running() -> None:
    # pg_ctl gives up waiting (here at once) and leaves the postmaster it started running.
    server = ThrowawayServer()
    server.start_timeout_s = 0
    assert_fails_leaving_nothing(server, "server did not start in time")


@needs_postgres
def test_a_postgres_binary_that_exits_leaves_nothing() -> None:
    bindir = find_binaries()
    assert bindir is not None
    # Beside the servers' directories, where the server's account may run what it holds.
    with tempfile.TemporaryDirectory(prefix="crashqueuelab-test-") as made:
        fakes = Path(made)
        fakes.chmod(0o755)
        (fakes / "initdb").symlink_to(bindir / "initdb")
        (fakes / "postgres").symlink_to(bindir / "postgres")
        (fakes / "pg_ctl").write_text("#!/bin/sh\necho 'no such server' >&2\nexit 3\n")
        (fakes / "pg_ctl").chmod(0o755)
        server = ThrowawayServer(bindir=fakes)
        refused = assert_fails_leaving_nothing(server, r"pg_ctl -D failed \(exit 3\)")
    assert "no such server" in str(refused)


@needs_redis
def test_a_redis_binary_that_exits_leaves_nothing(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'no such server' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert_fails_leaving_nothing(
        ThrowawayRedis(binary=fake), "redis server: redis-server did not start: no log"
    )


@needs_redis
def test_a_redis_start_refused_for_a_bad_setting_leaves_nothing(tmp_path: Path) -> None:
    real = find_redis_server()
    wrapped = tmp_path / "redis-server"
    # The last of an option given twice wins: a socket where none can be made. Its path is
    # short, as a socket's must be (under 108 bytes), wherever the tests run.
    short = Path(tempfile.mkdtemp(prefix="r"))
    try:
        wrapped.write_text(f'#!/bin/sh\nexec {real} "$@" --unixsocket {short}/none/redis.sock\n')
        wrapped.chmod(0o755)
        assert_fails_leaving_nothing(
            ThrowawayRedis(binary=wrapped),
            "redis-server did not start: .*Failed opening Unix socket: bind: No such file",
        )
    finally:
        short.rmdir()


@needs_redis
def test_a_redis_that_never_answers_is_killed_when_its_wait_ends(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    pid_file = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    fake.chmod(0o755)
    server = ThrowawayRedis(binary=fake)
    server.start_timeout_s = 0.5
    assert_fails_leaving_nothing(server, "redis-server did not start")
    assert not alive(int(pid_file.read_text()))


@needs_redis
def test_a_version_the_binary_does_not_say_is_server_unavailable(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'who knows'\n")
    fake.chmod(0o755)
    said = "redis-server did not say its version"
    with ThrowawayRedis(binary=fake) as server, pytest.raises(ServerUnavailable, match=said):
        server.describe()
    assert not server.root.exists()


@needs_redis
def test_started_names_the_server_to_children_while_it_runs() -> None:
    before = os.environ.get(SOCKET_VARIABLE)
    with started(ThrowawayRedis("none")) as server:
        assert os.environ[SOCKET_VARIABLE] == str(server.socket)
        assert server.environment() == {SOCKET_VARIABLE: str(server.socket)}
        assert ping(Path(os.environ[SOCKET_VARIABLE]))
    assert os.environ.get(SOCKET_VARIABLE) == before
    assert not server.root.exists()


@needs_postgres
def test_a_postgres_server_is_named_by_its_dsn() -> None:
    with ThrowawayServer() as server:
        assert server.environment() == {DSN_VARIABLE: server.dsn}


def test_a_free_port_is_below_the_ephemeral_range_and_skips_one_taken() -> None:
    # A port of the kernel's ephemeral range can be taken by any outgoing connection while
    # the server that listened on it restarts; the servers' ports are chosen below it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port: int = taken.getsockname()[1]
        picks = iter([taken_port - LOWEST_PORT, 12345 - LOWEST_PORT])
        chosen = free_port(floor=65536, choose=lambda n: next(picks))
    assert chosen == 12345
    assert LOWEST_PORT <= free_port() < ephemeral_floor()


def test_a_free_port_is_the_kernels_choice_where_nothing_below_the_range_binds() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port: int = taken.getsockname()[1]
        asked: list[int] = []

        def always_taken(n: int) -> int:
            asked.append(n)
            return taken_port - LOWEST_PORT

        chosen = free_port(floor=65536, choose=always_taken)
        assert chosen != taken_port
        assert len(asked) == PORT_CANDIDATES
        assert free_port(floor=LOWEST_PORT, choose=always_taken) > 0
        assert len(asked) == PORT_CANDIDATES  # no room below the range: nothing was tried


def test_the_ephemeral_floor_is_read_from_the_kernel_or_linuxs_default(tmp_path: Path) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("40000\t60999\n")
    assert ephemeral_floor(source) == 40000
    source.write_text("garbage\n")
    assert ephemeral_floor(source) == 32768
    assert ephemeral_floor(tmp_path / "missing") == 32768


class _Spawning(Throwaway):
    """A server whose second process is started only as the first is killed: as pg_ctl's fork
    starts the postmaster after a start that timed out was listed."""

    name = "spawning"

    def __init__(self) -> None:
        super().__init__()
        self.children: list[subprocess.Popen[bytes]] = []
        self.listings = 0

    @property
    def running(self) -> bool:
        return any(child.poll() is None for child in self.children)

    @property
    def settings(self) -> dict[str, str]:
        return {}

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def launch(self) -> None:
        self.children.append(subprocess.Popen(["sleep", "60"]))
        raise ServerUnavailable("did not start in time", self.name)

    def stop(self) -> None:
        self.kill()

    def processes(self) -> list[int]:
        self.listings += 1
        if self.listings == 1:
            # Listed now; the next one starts after this list was made.
            listed = [child.pid for child in self.children if child.poll() is None]
            self.children.append(subprocess.Popen(["sleep", "60"]))
            return listed
        return [child.pid for child in self.children if child.poll() is None]

    def read_version(self) -> str:
        return "0"

    def environment(self) -> dict[str, str]:
        return {}

    def forget(self) -> None:
        for child in self.children:
            child.wait(timeout=10)


def test_a_failed_start_kills_a_process_that_began_after_the_first_listing() -> None:
    server = _Spawning()
    with server:
        with pytest.raises(ServerUnavailable, match="did not start in time"):
            server.start()
        assert len(server.children) == 2
        assert [child.returncode for child in server.children] == [-9, -9]
        assert server.processes() == []
    assert not server.root.exists()
