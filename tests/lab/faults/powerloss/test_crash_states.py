"""The power-loss model without a mount: the file system's operations are called directly on
a backing tree, and each crash state is checked byte for byte."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from crashqueuelab.judges.readers.walqueue import read_walqueue_directory
from crashqueuelab.lab.faults.powerloss.crashstate import (
    BY_BYTES,
    BY_FATE,
    LOSE_ALL,
    SECTOR,
    Choice,
    DistinctStates,
    crash_choices,
    materialize,
    tree_digest,
)
from crashqueuelab.lab.faults.powerloss.filesystem import PowerLossFilesystem
from crashqueuelab.lab.faults.powerloss.journal import GRAVEYARD, TREE, Journal, load_journal
from tests.walqueue.helpers import LAYOUTS, Layout, build_big


@pytest.fixture
def fs(tmp_path: Path) -> PowerLossFilesystem:
    (tmp_path / "root" / TREE).mkdir(parents=True)
    (tmp_path / "root" / GRAVEYARD).mkdir()
    return PowerLossFilesystem(tmp_path / "root", Journal())


def write_file(fs: PowerLossFilesystem, path: str, data: bytes, *, offset: int = 0) -> int:
    fh = (
        fs.create(path, 0o644)
        if not (fs.tree / path.lstrip("/")).exists()
        else fs.open(path, os.O_RDWR)
    )
    fs.write(path, data, offset, fh)
    return fh


def state(fs: PowerLossFilesystem, tmp_path: Path, choice: Choice = LOSE_ALL) -> dict[str, bytes]:
    # Through the journal's own file, so the dump and the load are part of every check.
    tmp_path.mkdir(exist_ok=True)
    fs.journal.dump(tmp_path / "journal.json")
    journal = load_journal(tmp_path / "journal.json")
    store = tmp_path / "states" / choice.name
    store.parent.mkdir(parents=True, exist_ok=True)
    if store.exists():
        shutil.rmtree(store)
    materialize(fs.tree.parent, journal, choice, store)
    # A directory shows as "/": the tests look into it themselves.
    return {p.name: b"/" if p.is_dir() else p.read_bytes() for p in sorted(store.iterdir())}


def test_an_unsynced_write_is_lost_and_a_synced_one_kept(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = write_file(fs, "/db", b"A" * 100)
    fs.fsync("/db", 0, fh)
    fs.fsyncdir("/", 0, 0)
    fs.write("/db", b"B" * 10, 20, fh)  # overwrite, unsynced
    fs.write("/db", b"C" * 50, 100, fh)  # append, unsynced
    assert (fs.tree / "db").read_bytes() == b"A" * 20 + b"B" * 10 + b"A" * 70 + b"C" * 50
    assert state(fs, tmp_path) == {"db": b"A" * 100}
    fs.fsync("/db", 1, fh)
    fs.release("/db", fh)
    assert state(fs, tmp_path, Choice(frozenset(), None)) == {
        "db": b"A" * 20 + b"B" * 10 + b"A" * 70 + b"C" * 50
    }


def test_a_create_without_a_directory_sync_vanishes_even_when_its_data_was_synced(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = write_file(fs, "/new", b"data")
    fs.fsync("/new", 0, fh)
    fs.release("/new", fh)
    assert state(fs, tmp_path) == {}
    fs.fsyncdir("/", 0, 0)
    assert state(fs, tmp_path, Choice(frozenset(), None)) == {"new": b"data"}


def test_unlink_and_rename_over_a_file_come_back_unless_the_directory_was_synced(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    for name, data in (("/current", b"old"), ("/segment", b"frames"), ("/current.tmp", b"new")):
        fh = write_file(fs, name, data)
        fs.fsync(name, 0, fh)
        fs.release(name, fh)
    fs.fsyncdir("/", 0, 0)
    fs.rename("/current.tmp", "/current")
    fs.unlink("/segment")
    assert sorted(os.listdir(fs.tree)) == ["current"]
    assert state(fs, tmp_path) == {"current": b"old", "current.tmp": b"new", "segment": b"frames"}
    # Only the unlink reaching the disk: the state a rename without a directory sync allows.
    only_unlink = Choice(frozenset({1}), None)
    assert state(fs, tmp_path, only_unlink) == {"current": b"old", "current.tmp": b"new"}
    fs.fsyncdir("/", 0, 0)
    assert state(fs, tmp_path, Choice(frozenset(), None)) == {"current": b"new"}


def test_a_kept_rename_keeps_the_create_it_depends_on(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = write_file(fs, "/snapshot.tmp", b"state")
    fs.fsync("/snapshot.tmp", 0, fh)
    fs.release("/snapshot.tmp", fh)
    fs.rename("/snapshot.tmp", "/snapshot")
    choices = crash_choices(fs.journal, seed=1, seeded=0)
    # The subsets that keep what they depend on first: the one that does not comes last.
    assert [c.name for c in choices] == [
        "lose-all",
        "keep-names-1",
        "keep-names-1-2",
        "keep-names-2",
    ]
    assert state(fs, tmp_path, choices[3]) == {"snapshot": b"state"}
    assert state(fs, tmp_path, choices[1]) == {"snapshot.tmp": b"state"}


def test_open_with_truncation_and_truncate_are_taken_back(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = write_file(fs, "/file", b"0123456789")
    fs.fsync("/file", 0, fh)
    fs.fsyncdir("/", 0, 0)
    fs.release("/file", fh)
    fs.release("/file", fs.open("/file", os.O_WRONLY | os.O_TRUNC))
    assert (fs.tree / "file").read_bytes() == b""
    assert state(fs, tmp_path) == {"file": b"0123456789"}
    fh = fs.open("/file", os.O_RDWR)
    fs.fsync("/file", 0, fh)  # the emptied file is durable now
    fs.write("/file", b"abc", 0, fh)
    fs.truncate("/file", 1, fh)
    fs.truncate("/file", 0)  # by path, without a handle
    assert state(fs, tmp_path) == {"file": b""}
    fs.release("/file", fh)


def test_a_seeded_state_keeps_some_writes_and_may_tear_the_last_at_a_sector(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    fh = write_file(fs, "/wal", b"")
    fs.fsync("/wal", 0, fh)
    fs.fsyncdir("/", 0, 0)
    frames = [bytes([65 + i]) * 1500 for i in range(8)]
    for i, frame in enumerate(frames):
        fs.write("/wal", frame, i * 1500, fh)
    fs.release("/wal", fh)
    seen = set()
    for seed in range(40):
        choice = Choice(None, seed)
        result = state(fs, tmp_path, choice)["wal"]
        assert result == state(fs, tmp_path / "again", choice)["wal"]  # the seed decides
        for i, frame in enumerate(frames):
            piece = result[i * 1500 : (i + 1) * 1500]
            kept = len(piece) - len(piece.lstrip(frame[:1]))
            assert kept in (0, len(piece)) or (i * 1500 + kept) % SECTOR == 0
            seen.add("torn" if 0 < kept < 1500 else "whole" if kept else "lost")
    assert seen == {"torn", "whole", "lost"}


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_every_tear_of_a_walqueue_append_is_a_torn_tail_to_walqueue_and_its_reader(
    fs: PowerLossFilesystem, tmp_path: Path, layout: Layout
) -> None:
    """walqueue's last frame written as its hook splits it (two writes) and not synced: every
    seeded crash state (each write kept, lost or torn at a sector) is whole or a torn tail to
    walqueue and to its reader alike, never corruption."""
    segment, frames, start = build_big(tmp_path / "made", layout)
    fs.mkdir("/q", 0o755)
    fh = write_file(fs, f"/q/{segment.name}", layout.segment(frames[:start]))
    fs.fsync(f"/q/{segment.name}", 0, fh)
    fs.fsyncdir("/", 0, 0)
    fs.fsyncdir("/q", 0, 0)
    half = start + (len(frames) - start) // 2
    fs.write(f"/q/{segment.name}", frames[start:half], start, fh)
    fs.write(f"/q/{segment.name}", frames[half:], half, fh)
    fs.release(f"/q/{segment.name}", fh)
    outcomes = set()
    for seed in range(60):
        choice = Choice(None, seed)
        state(fs, tmp_path / "states", choice)
        directory = tmp_path / "states" / "states" / choice.name / "q"
        left = (directory / segment.name).read_bytes()[start:]
        reading = read_walqueue_directory(directory, preallocated=layout.preallocate)
        assert reading.problems == [], seed
        with layout.open(directory) as queue:
            tasks = queue.task_ids()
        assert sorted(reading.tasks) == tasks, seed
        outcome = "whole" if len(tasks) == 3 else "torn" if any(left) else "lost"
        assert reading.facts["torn_tail"] == (outcome == "torn"), seed
        outcomes.add(outcome)
    assert outcomes == {"whole", "torn", "lost"}


def test_enumerated_subsets_stop_at_a_bound_and_then_are_sampled(fs: PowerLossFilesystem) -> None:
    for i in range(8):
        fs.release(f"/f{i}", write_file(fs, f"/f{i}", b"x"))
    choices = crash_choices(fs.journal, seed=3)
    unseeded = [c for c in choices if c.seed is None]
    assert unseeded[0] == LOSE_ALL
    assert unseeded[1].names_kept == frozenset(range(8))
    assert 2 < len(unseeded) <= 32
    assert len(choices) - len(unseeded) == 3
    assert crash_choices(fs.journal, seed=3) == choices


def test_directories_are_journalled_too(fs: PowerLossFilesystem, tmp_path: Path) -> None:
    fs.mkdir("/sub", 0o755)
    fh = write_file(fs, "/sub/file", b"x")
    fs.fsync("/sub/file", 0, fh)
    fs.release("/sub/file", fh)
    fs.fsyncdir("/sub", 0, 0)
    assert state(fs, tmp_path) == {}  # the directory itself was never made durable
    fs.fsyncdir("/", 0, 0)
    fs.unlink("/sub/file")
    fs.rmdir("/sub")
    assert state(fs, tmp_path) == {"sub": b"/"}
    assert (tmp_path / "states" / "lose-all" / "sub" / "file").read_bytes() == b"x"


def test_what_is_not_modelled_is_refused(fs: PowerLossFilesystem) -> None:
    fs.release("/f", write_file(fs, "/f", b"x"))
    for refused in (fs.link, fs.symlink):
        with pytest.raises(OSError, match="not modelled") as error:
            refused("/g", "/f")
        assert error.value.errno == 1  # EPERM
    with pytest.raises(OSError, match="not empty"):
        fs.rmdir("/")
    fs.chmod("/f", 0o600)
    fs.chown("/f", os.getuid(), os.getgid())
    fs.utimens("/f", (1, 2))
    fs.utimens("/f")
    assert fs.getattr("/f")["st_size"] == 1
    assert fs.readdir("/", 0) == [".", "..", "f"]
    assert fs.statfs("/")["f_bsize"] > 0
    assert fs.access("/f", os.R_OK) == 0
    assert (fs.opendir("/"), fs.releasedir("/", 0), fs.flush("/f", 0)) == (0, 0, 0)


def test_a_cut_with_nothing_unsynced_allows_one_crash_state(fs: PowerLossFilesystem) -> None:
    fh = write_file(fs, "/file", b"synced")
    fs.fsync("/file", 0, fh)
    fs.fsyncdir("/", 0, 0)
    fs.release("/file", fh)
    assert crash_choices(fs.journal, seed=3) == [LOSE_ALL]


def test_choices_that_keep_the_same_operations_are_judged_once(
    fs: PowerLossFilesystem,
) -> None:
    """Keeping a rename keeps the create it renamed, so "keep the rename" is "keep both";
    a seeded choice of the same fates is no new state either."""
    fh = write_file(fs, "/snapshot.tmp", b"state")
    fs.fsync("/snapshot.tmp", 0, fh)
    fs.release("/snapshot.tmp", fh)
    fs.rename("/snapshot.tmp", "/snapshot")
    distinct = DistinctStates(fs.journal)
    choices = crash_choices(fs.journal, seed=1)
    new = [choice.name for choice in choices if distinct.new_fate(choice)]
    assert new == ["lose-all", "keep-names-1", "keep-names-1-2"]
    skipped = [same.to_json() for same in distinct.skipped]
    assert skipped[0] == {"choice": "keep-names-2", "same_as": "keep-names-1-2", "by": BY_FATE}
    assert [same["choice"] for same in skipped[1:]] == [c.name for c in choices[4:]]
    assert {same["same_as"] for same in skipped[1:]} <= set(new)
    assert len(new) + len(skipped) == len(choices)


def test_different_fates_that_leave_the_same_bytes_are_judged_once(
    fs: PowerLossFilesystem, tmp_path: Path
) -> None:
    """A write then a truncation back to nothing: keeping only the truncation leaves what
    losing both leaves, byte for byte."""
    fh = write_file(fs, "/wal", b"")
    fs.fsync("/wal", 0, fh)
    fs.fsyncdir("/", 0, 0)
    fs.write("/wal", b"frame", 0, fh)
    fs.truncate("/wal", 0, fh)
    fs.release("/wal", fh)
    distinct = DistinctStates(fs.journal)
    judged = []
    for seed in range(40):
        choice = LOSE_ALL if seed == 0 else Choice(None, seed)
        if not distinct.new_fate(choice):
            continue
        store = tmp_path / choice.name
        materialize(fs.tree.parent, fs.journal, choice, store)
        if distinct.new_bytes(choice, store):
            judged.append((choice.name, (store / "wal").read_bytes()))
    assert judged == [("lose-all", b""), (judged[1][0], b"frame")]
    by_bytes = [same.to_json() for same in distinct.skipped if same.by == BY_BYTES]
    assert by_bytes
    assert {same["same_as"] for same in by_bytes} == {"lose-all"}


def test_a_tree_digest_sees_names_bytes_and_links_and_nothing_else(tmp_path: Path) -> None:
    def tree(name: str, content: bytes, link: str) -> Path:
        root = tmp_path / name
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "file").write_bytes(content)
        (root / "link").symlink_to(link)
        return root

    first = tree("a", b"bytes", "sub/file")
    assert tree_digest(first) == tree_digest(tree("b", b"bytes", "sub/file"))
    os.utime(first / "sub" / "file", (0, 0))  # times are not part of a state
    assert tree_digest(first) == tree_digest(tree("c", b"bytes", "sub/file"))
    assert tree_digest(first) != tree_digest(tree("d", b"bytez", "sub/file"))
    assert tree_digest(first) != tree_digest(tree("e", b"bytes", "sub"))
    (tmp_path / "f" / "sub").mkdir(parents=True)
    (tmp_path / "f" / "sub" / "file").mkdir()  # a directory where a file was
    assert tree_digest(tmp_path / "f") != tree_digest(tree("g", b"", "sub/file"))
