"""Redis on the power-loss disk: what an acknowledged write survives, and what a first start
of Redis leaves unsynced (evidence for ``docs/real-queues.md``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from crashqueuelab.judges.resp import RespConnection, text
from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, Choice, DistinctStates
from crashqueuelab.lab.faults.powerloss.redisdisk import STATE_SERVER_LOG, RedisOnDisk
from crashqueuelab.servers.redis import SOCKET_VARIABLE, find_redis_server

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not Path("/dev/fuse").exists(),
        reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
    ),
    pytest.mark.skipif(find_redis_server() is None, reason="no redis-server here"),
]


def kept_after_a_cut(case_dir: Path, settled: bool) -> tuple[str, list[str]]:
    """Write one key to an ``aof-always`` Redis on the disk (answered: synced), cut the power,
    and read the key back from the state that keeps nothing unsynced."""
    case_dir.mkdir()
    with RedisOnDisk(case_dir, "aof-always", settled=settled) as target:
        with RespConnection(target.server.socket) as connection:
            assert connection.command("SET", "answer", "42") == "OK"
        journal = target.cut()
        pending = [f"{op.kind} {op.path}" for op in journal.names]
        state_dir = case_dir / "lose-all"
        state_dir.mkdir()
        with target.place(journal, LOSE_ALL, state_dir, DistinctStates(journal)) as placed:
            if placed.problem is not None:
                return f"refused: {placed.problem}", pending
            with RespConnection(os.environ[SOCKET_VARIABLE]) as connection:
                return text(connection.command("GET", "answer")), pending


def test_an_answered_write_survives_a_cut_on_a_settled_server(tmp_path: Path) -> None:
    value, pending = kept_after_a_cut(tmp_path / "settled", settled=True)
    assert (value, pending) == ("42", [])


def test_a_first_start_of_redis_leaves_its_append_only_directory_unsynced(
    tmp_path: Path,
) -> None:
    # Redis 7.0 makes appendonlydir and renames its base file into it at its first start,
    # and syncs the data directory after neither: until the file system commits those
    # names on its own, a power cut takes the whole append-only file, acknowledged writes
    # and all, even with appendfsync always.
    value, pending = kept_after_a_cut(tmp_path / "fresh", settled=False)
    assert "mkdir /appendonlydir" in pending
    assert value == ""


def test_a_state_with_the_bytes_of_one_placed_before_starts_no_server(tmp_path: Path) -> None:
    case_dir, first, again = tmp_path / "case", tmp_path / "first", tmp_path / "again"
    for directory in (case_dir, first, again):
        directory.mkdir()
    with RedisOnDisk(case_dir, "aof-always") as target:
        journal = target.cut()
        distinct = DistinctStates(journal)
        with target.place(journal, LOSE_ALL, first, distinct) as placed:
            assert (placed.repeated, placed.problem) == (False, None)
        same_choice = Choice(frozenset(), None)  # the same choice, made again
        with target.place(journal, same_choice, again, distinct) as placed:
            assert placed.repeated
    # A started server leaves its log in the state's directory; none was started again.
    assert (first / STATE_SERVER_LOG).exists()
    assert list(again.iterdir()) == []
    [same] = distinct.skipped
    assert same.to_json() == {"choice": "lose-all", "same_as": "lose-all", "by": "bytes"}
