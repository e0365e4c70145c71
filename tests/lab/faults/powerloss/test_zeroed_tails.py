"""The crash state "appended bytes lost, size kept" (ext4 data=writeback, XFS), and the
writes a failed fsync dropped (fsyncgate), on the file system's operations directly."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from crashqueuelab.judges.readers.walqueue import read_walqueue_directory
from crashqueuelab.lab.faults.powerloss.crashstate import (
    LOSE_ALL,
    ZEROED_TAILS,
    Choice,
    DistinctStates,
    crash_choices,
    materialize,
)
from crashqueuelab.lab.faults.powerloss.faults import DiskFault, FaultPlan, arm, disarm, fired
from crashqueuelab.lab.faults.powerloss.filesystem import PowerLossFilesystem
from crashqueuelab.lab.faults.powerloss.journal import GRAVEYARD, TREE, Journal, load_journal
from walqueue.queue import Queue

ZEROED = Choice(frozenset(), None, zeroed_tails=True)


@pytest.fixture
def fs(tmp_path: Path) -> PowerLossFilesystem:
    root = tmp_path / "root"
    (root / TREE).mkdir(parents=True)
    (root / GRAVEYARD).mkdir()
    return PowerLossFilesystem(root, Journal(), faults=FaultPlan(root))


def synced_file(fs: PowerLossFilesystem, path: str, data: bytes) -> int:
    fh = fs.create(path, 0o644)
    fs.write(path, data, 0, fh)
    fs.fsync(path, 0, fh)
    fs.fsyncdir("/", 0, 0)
    return fh


def state(fs: PowerLossFilesystem, tmp_path: Path, choice: Choice) -> Path:
    fs.journal.dump(tmp_path / "journal.json")
    store = tmp_path / "states" / choice.name
    if store.exists():
        shutil.rmtree(store)
    materialize(fs.tree.parent, load_journal(tmp_path / "journal.json"), choice, store)
    return store


def test_an_append_lost_with_its_size_kept_reads_as_zeros(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = synced_file(fs, "/wal", b"synced")
    fs.write("/wal", b"appended", 6, fh)
    choices = crash_choices(fs.journal, seed=1, seeded=0)
    assert [c.name for c in choices] == ["lose-all", ZEROED_TAILS]
    assert (state(fs, tmp_path, LOSE_ALL) / "wal").read_bytes() == b"synced"
    assert (state(fs, tmp_path, ZEROED) / "wal").read_bytes() == b"synced" + bytes(8)
    made = materialize(fs.tree.parent, fs.journal, ZEROED, tmp_path / "again")
    assert [entry["fate"] for entry in made.fate] == ["zeroed"]
    distinct = DistinctStates(fs.journal)
    assert all(distinct.new_fate(choice) for choice in choices)


def test_an_overwrite_inside_the_file_is_simply_lost(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = synced_file(fs, "/db", b"0123456789")
    fs.write("/db", b"ab", 2, fh)
    assert [c.name for c in crash_choices(fs.journal, seed=1, seeded=0)] == ["lose-all"]


def test_a_created_file_keeps_its_size_when_its_name_is_kept(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    synced_file(fs, "/old", b"x")
    fh = fs.create("/new", 0o644)
    fs.write("/new", b"frame", 0, fh)
    names = [c.name for c in crash_choices(fs.journal, seed=1, seeded=0)]
    assert names == ["lose-all", "keep-names-1", ZEROED_TAILS, f"{ZEROED_TAILS}-keep-names"]
    kept = Choice(frozenset({0}), None, zeroed_tails=True)
    assert (state(fs, tmp_path, kept) / "new").read_bytes() == bytes(5)
    assert not (state(fs, tmp_path, ZEROED) / "new").exists()


def test_walqueue_reads_a_zeroed_final_frame_as_absent(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    """The frame of an unsynced put reaches the disk as zeros: a torn tail to walqueue and
    to its independent reader alike, neither data nor corruption."""
    real = tmp_path / "real"
    with Queue(real) as queue:
        queue.put("a", {"n": 1})
        first = next(real.glob("wal-*.log")).read_bytes()
        queue.put("b", {"n": 2})
    name = next(real.glob("wal-*.log")).name
    both = (real / name).read_bytes()
    path = f"/{name}"
    fh = synced_file(fs, path, first)
    fs.write(path, both[len(first) :], len(first), fh)  # the second put, never synced
    store = state(fs, tmp_path, ZEROED)
    assert (store / name).read_bytes() == first + bytes(len(both) - len(first))
    reading = read_walqueue_directory(store)
    assert reading.ok, reading.problems
    assert sorted(reading.tasks) == ["a"]
    assert reading.facts["torn_tail"]
    with Queue(store) as reopened:
        assert reopened.task_ids() == ["a"]
    # walqueue cut the zeros off before its next append.
    assert (store / name).read_bytes() == first


def test_a_write_whose_fsync_failed_is_lost_even_after_a_later_fsync_succeeds(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = synced_file(fs, "/wal", b"AAAA")
    fs.write("/wal", b"BBBB", 4, fh)
    arm(fs.tree.parent, [DiskFault("fsync", "EIO", "wal", count=1)], "one")
    with pytest.raises(OSError, match="Input/output error") as failed:
        fs.fsync("/wal", 0, fh)
    assert failed.value.errno == errno.EIO
    disarm(fs.tree.parent)
    # The page cache still holds it: a reader sees the dropped bytes until the cut.
    assert fs.read("/wal", 8, 0, fh) == b"AAAABBBB"
    fs.write("/wal", b"CCCC", 8, fh)
    fs.fsync("/wal", 0, fh)  # succeeds, and brings nothing back
    assert [op.new for op in fs.journal.failed] == [b"BBBB"]
    for choice in crash_choices(fs.journal, seed=2):
        assert (state(fs, tmp_path, choice) / "wal").read_bytes() == b"AAAA" + bytes(4) + b"CCCC"
    assert fired(fs.tree.parent) == [
        {"arming": "one", "operation": "fsync", "path": "/wal", "error": "EIO", "nth": 0}
    ]


def test_faults_hit_their_window_only(fs: PowerLossFilesystem) -> None:
    fh = synced_file(fs, "/f", b"x")
    arm(fs.tree.parent, [DiskFault("write", "ENOSPC", "f", skip=1, count=2)], "w")
    fs.write("/f", b"1", 1, fh)
    for offset in (2, 3):
        with pytest.raises(OSError, match="No space left") as full:
            fs.write("/f", b"2", offset, fh)
        assert full.value.errno == errno.ENOSPC
    fs.write("/f", b"4", 2, fh)
    assert os.pread(fh, 8, 0) == b"x14"
    arm(fs.tree.parent, [DiskFault("read", "EIO", "other*")], "r")
    assert fs.read("/f", 3, 0, fh) == b"x14"  # another path: not covered


def test_a_fault_named_badly_is_refused_in_one_line() -> None:
    from crashqueuelab.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="disk_fault: 'eio-everything' is not one of"):
        DiskFault.named("eio-everything")
    with pytest.raises(InvalidInput, match="window"):
        DiskFault("fsync", "EIO", count=0)
