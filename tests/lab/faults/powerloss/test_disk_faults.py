"""Disk errors answered by the mounted file system to a plain ``os`` caller, disarmed again,
and fsyncgate through the mount: a write whose fsync failed is gone after the cut even
though a later fsync succeeded."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from crashqueuelab.judges.readers.walqueue import read_walqueue_directory
from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, crash_choices, materialize
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk
from crashqueuelab.lab.faults.powerloss.faults import DiskFault
from tests.lab.faults.powerloss.test_mount import needs_fuse
from walqueue.queue import Queue
from walqueue.store import Store

CALLS: dict[str, Callable[[int], object]] = {
    "eio-fsync": os.fsync,
    "eio-write": lambda fd: os.pwrite(fd, b"more", 4),
    "eio-read": lambda fd: os.pread(fd, 4, 0),
    "enospc": lambda fd: os.pwrite(fd, b"more", 4),
}


@needs_fuse
@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_fault_is_answered_by_the_file_system_and_disarmed(tmp_path: Path, name: str) -> None:
    fault = DiskFault.named(name, path="data")
    call = CALLS[name]
    with PowerLossDisk(tmp_path / "disk", tmp_path / "mnt") as disk:
        path = tmp_path / "mnt" / "data"
        path.write_bytes(b"base")
        fd = os.open(path, os.O_RDWR)
        try:
            disk.arm(fault, arming=name)
            with pytest.raises(OSError, match=os.strerror(getattr(errno, fault.error))) as error:
                call(fd)
            assert error.value.errno == getattr(errno, fault.error)
            (tmp_path / "mnt" / "other").write_bytes(b"not covered")  # another path passes
            disk.disarm()
            call(fd)  # a healthy disk again
        finally:
            os.close(fd)
        # Only the armed path, only while armed (the kernel may retry a failed read once).
        fired = {(f["arming"], f["path"], f["error"]) for f in disk.fired()}
        assert fired == {(name, "/data", fault.error)}
        disk.cut()


@needs_fuse
def test_a_write_whose_fsync_failed_is_gone_after_the_cut(tmp_path: Path) -> None:
    with PowerLossDisk(tmp_path / "disk", tmp_path / "mnt") as disk:
        path = tmp_path / "mnt" / "wal"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
            os.fsync(os.open(tmp_path / "mnt", os.O_RDONLY))
            os.pwrite(fd, b"first", 0)
            disk.arm(DiskFault.named("eio-fsync", count=1))
            with pytest.raises(OSError, match="Input/output error"):
                os.fsync(fd)
            disk.disarm()
            assert os.pread(fd, 5, 0) == b"first"  # the page cache still shows it
            os.fsync(fd)  # succeeds: fsyncgate, the dropped pages are not written
            os.pwrite(fd, b"second", 5)
            os.fsync(fd)
        finally:
            os.close(fd)
        journal = disk.cut()
    assert [op.new for op in journal.failed] == [b"first"]
    for choice in [LOSE_ALL, *crash_choices(journal, seed=5)]:
        store = tmp_path / "states" / choice.name
        if not store.exists():
            materialize(tmp_path / "disk", journal, choice, store)
            assert (store / "wal").read_bytes() == bytes(5) + b"second", choice.name


def _cut_after_a_failed_directory_fsync(tmp_path: Path, retried: bool) -> Path:
    """A file created, its directory's fsync failed (then, if ``retried``, done again on a
    healthy disk), and the power cut: the crash state that loses everything it may."""
    with PowerLossDisk(tmp_path / "disk", tmp_path / "mnt") as disk:
        (tmp_path / "mnt" / "made").write_bytes(b"data")
        directory = os.open(tmp_path / "mnt", os.O_RDONLY)
        try:
            disk.arm(DiskFault.named("eio-dirsync", count=1), arming="dirsync")
            with pytest.raises(OSError, match="Input/output error"):
                os.fsync(directory)
            disk.disarm()
            if retried:
                os.fsync(directory)
        finally:
            os.close(directory)
        assert [(f["operation"], f["path"]) for f in disk.fired()] == [("fsyncdir", "/")]
        journal = disk.cut()
    store = tmp_path / "state"
    materialize(tmp_path / "disk", journal, LOSE_ALL, store)
    return store


@needs_fuse
def test_a_name_whose_directory_fsync_failed_is_not_durable_until_one_succeeds(
    tmp_path: Path,
) -> None:
    assert not (_cut_after_a_failed_directory_fsync(tmp_path / "failed", False) / "made").exists()
    assert (_cut_after_a_failed_directory_fsync(tmp_path / "retried", True) / "made").exists()


def _put_after_a_failed_fsync(tmp_path: Path) -> Path:
    """walqueue's put fails its fsync; reopened on the recovered disk, it puts another
    task; then the power goes. The crash state, as the disk holds it."""
    with PowerLossDisk(tmp_path / "disk", tmp_path / "mnt") as disk:
        with Queue(tmp_path / "mnt" / "q") as queue:
            queue.put("first", {"n": 1})
            disk.arm(DiskFault.named("eio-fsync", path="*.log", count=1))
            with pytest.raises(OSError, match="Input/output error"):
                queue.put("dropped", {"n": 2})
            disk.disarm()
        with Queue(tmp_path / "mnt" / "q") as reopened:
            # The page cache still holds the dropped frame: walqueue reads it back.
            assert "dropped" in reopened.task_ids()
            reopened.put("acknowledged", {"n": 3})
        journal = disk.cut()
    return materialize(tmp_path / "disk", journal, LOSE_ALL, tmp_path / "state").directory


@needs_fuse
def test_walqueue_reopened_after_a_failed_fsync_keeps_what_it_acknowledged(
    tmp_path: Path,
) -> None:
    reading = read_walqueue_directory(_put_after_a_failed_fsync(tmp_path) / "q")
    assert reading.ok, reading.problems
    assert {"first", "acknowledged"} <= set(reading.tasks)


@needs_fuse
def test_without_writing_its_frames_again_walqueue_loses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the disk-fault run found before walqueue's open wrote its live frames again: a
    hole of zeros where the dropped frame was, before an acknowledged one."""
    monkeypatch.setattr(Store, "_resync", lambda self, frames: None)
    reading = read_walqueue_directory(_put_after_a_failed_fsync(tmp_path) / "q")
    assert not reading.ok
    assert "zeros at byte" in reading.problems[0]
