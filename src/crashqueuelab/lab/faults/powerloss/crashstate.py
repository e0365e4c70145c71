"""From a power cut to what the disk holds: a crash state.

The backing tree holds every operation the system made; the journal holds the ones the disk
had not made durable, with the bytes each one overwrote. A crash state is a copy of the tree
with pending operations taken back, newest first:

* every pending write and truncation lost, with each subset of the pending directory changes
  kept (POSIX orders none of them; the subsets are enumerated, so a catch never depends on
  a seed); ``LOSE_ALL`` is the one that keeps none;
* seeded: each pending directory change, write or truncation survives on its own with
  probability one half, and the last surviving write may be torn: only its first whole
  512-byte sectors reach the disk, as when a drive loses power mid-write;
* **zeroed tails** (``ZEROED_TAILS``): every pending write and truncation lost, but every
  file keeps the size it had at the cut, so what was appended reads as zeros: ext4 with
  ``data=writeback`` and XFS commit a file's new size in their metadata journal apart from
  its data. One state keeps no pending directory change, one keeps them all (a journal
  that committed the size committed the metadata before it). Made only when a pending
  write grew a file.

Writes a failed ``fsync`` dropped (``Journal.failed``, fsyncgate) are lost in every crash
state; writes synced after such a failure are taken back and put on again above them.

A kept directory change keeps the earlier ones it depends on (same file or name). A cut
with nothing pending allows one crash state, ``LOSE_ALL`` alone.

Every choice is written into the state's ``fate`` so a report can say which bytes survived.
Different choices can make the same crash state: a kept rename keeps the create it renamed,
a seed can draw the fates of an enumerated subset, a kept truncation can leave what losing
it and the write before it leaves. ``DistinctStates`` keeps each state once, by the fates
of the pending operations and then by the bytes of the tree, and names what it skipped.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.powerloss.journal import GRAVEYARD, TREE, DataOp, Journal, NameOp

SECTOR = 512


@dataclass(frozen=True)
class Choice:
    """Which pending operations survive a cut.

    ``names_kept`` lists the pending directory changes kept (by their index in the journal;
    None: drawn from ``seed``); ``seed`` None loses every pending write and truncation.
    """

    names_kept: frozenset[int] | None
    seed: int | None
    #: Every file keeps its size at the cut: lost appended bytes read as zeros.
    zeroed_tails: bool = False

    @property
    def name(self) -> str:
        if self.seed is not None:
            return f"seed-{self.seed}"
        kept = self.names_kept or frozenset()
        if self.zeroed_tails:
            return ZEROED_TAILS + ("" if not kept else "-keep-names")
        return (
            "lose-all" if not kept else "keep-names-" + "-".join(str(i + 1) for i in sorted(kept))
        )


LOSE_ALL = Choice(frozenset(), None)
ZEROED_TAILS = "zeroed-tails"
#: Up to this many pending directory changes, every subset of them is a crash state of its own.
ENUMERATED_NAMES = 5
SEEDED_STATES = 3


def crash_choices(journal: Journal, seed: int, *, seeded: int = SEEDED_STATES) -> list[Choice]:
    """The crash states a campaign judges after one cut.

    POSIX orders no unsynced directory changes, so with few of them pending every subset is
    tried with every pending write lost (deterministic: a catch does not depend on a seed);
    then ``seeded`` states draw directory changes, writes and a torn sector from ``seed``.
    """
    pending = len(journal.names)
    if not pending and not journal.data:
        return [LOSE_ALL]
    if pending <= ENUMERATED_NAMES:
        subsets = [
            frozenset(i for i in range(pending) if mask >> i & 1) for mask in range(2**pending)
        ]
    else:
        rng = random.Random(seed)
        subsets = [frozenset(), frozenset(range(pending))]
        subsets += [
            frozenset(i for i in range(pending) if rng.random() < 0.5)
            for _ in range(2**ENUMERATED_NAMES - 2)
        ]
    # A subset that keeps what its changes depend on comes first, so that the state judged
    # for a set of fates carries the name that says what it kept.
    subsets = sorted(
        dict.fromkeys(subsets),
        key=lambda kept: _dependent_closure(journal.names, set(kept)) != kept,
    )
    choices = [Choice(subset, None) for subset in subsets]
    if appended(journal):
        kept_all = frozenset(range(pending))
        choices += [
            Choice(kept, None, zeroed_tails=True) for kept in dict.fromkeys((frozenset(), kept_all))
        ]
    return choices + [Choice(None, seed * 1000 + k) for k in range(seeded)]


def bounded_order(choices: Sequence[Choice], journal: Journal) -> list[Choice]:
    """``choices`` in the order a run that judges only the first few starts them (each
    state boots a server that is slow to boot): ``lose-all``, every pending directory change
    kept, the zeroed tails, the seeded states, then the other subsets."""
    everything = frozenset(range(len(journal.names)))

    def rank(choice: Choice) -> int:
        if choice.seed is not None:
            return 3
        if choice.zeroed_tails:
            return 2
        kept = choice.names_kept or frozenset()
        return 0 if not kept else 1 if kept == everything else 4

    return sorted(choices, key=rank)


def appended(journal: Journal) -> bool:
    """Whether a pending (or dropped) write grew a file: a zeroed tail is then possible."""
    return any(
        op.kind == "write" and op.offset + len(op.new) > op.old_size
        for op in (*journal.data, *journal.failed)
    )


@dataclass
class CrashState:
    """Where a crash state was made and what became of each pending operation."""

    choice: Choice
    directory: Path
    fate: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for entry in self.fate:
            counts[entry["fate"]] = counts.get(entry["fate"], 0) + 1
        return {
            "choice": self.choice.name,
            "pending": len(self.fate),
            **dict(sorted(counts.items())),
        }


def _dependent_closure(names: list[NameOp], kept: set[int]) -> set[int]:
    """Keeping a directory change keeps every earlier one on the same file or name: a rename
    cannot survive without the create it renamed."""

    def touches(op: NameOp) -> set[object]:
        return {op.ino, op.path, *([op.target] if op.target is not None else [])}

    closed = set(kept)
    for j in sorted(kept, reverse=True):
        for i in range(j):
            if i not in closed and touches(names[i]) & touches(names[j]):
                closed.add(i)
    return closed if closed == set(kept) else _dependent_closure(names, closed)


@dataclass(frozen=True)
class Outcome:
    """What a choice keeps of a cut: the fate of every pending operation."""

    #: The pending directory changes kept, by their index in the journal.
    names: frozenset[int]
    #: The pending writes and truncations kept, each as (its seq, the bytes of it kept).
    data: tuple[tuple[int, int], ...]
    #: Every file kept its size at the cut.
    zeroed_tails: bool = False


def outcome(journal: Journal, choice: Choice) -> Outcome:
    names, kept = _survivors(journal, choice)
    return Outcome(frozenset(names), tuple(sorted(kept.items())), choice.zeroed_tails)


def _survivors(journal: Journal, choice: Choice) -> tuple[set[int], dict[int, int]]:
    """Which directory changes survive, and for each surviving data op the bytes kept."""
    rng = random.Random(choice.seed)
    if choice.names_kept is not None:
        names = set(choice.names_kept)
    else:
        names = {i for i in range(len(journal.names)) if rng.random() < 0.5}
    names = _dependent_closure(journal.names, names)
    if choice.seed is None:
        return names, {}
    kept = {op.seq: len(op.new) for op in journal.data if rng.random() < 0.5}
    last = max(kept, default=None)
    if last is not None and rng.random() < 0.5:
        op = next(op for op in journal.data if op.seq == last)
        # Sector boundaries strictly inside the write, in file offsets.
        first = (op.offset // SECTOR + 1) * SECTOR
        cuts = range(first, op.offset + len(op.new), SECTOR)
        if op.kind == "write" and len(cuts) > 0:
            kept[last] = rng.choice(cuts) - op.offset
    return names, kept


def _in_tree(path: str) -> str:
    return f"{TREE}/{path.lstrip('/')}"


def _move(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(source, target)


class _Replayer:
    """Undo and redo journal operations inside one copied root."""

    def __init__(self, root: Path, locations: dict[int, str]) -> None:
        self.root = root
        self.locations = dict(locations)
        self._undone = 0

    def file(self, ino: int) -> Path:
        return self.root / self.locations[ino]

    def _relocate(self, ino: int, where: str) -> None:
        was = self.locations[ino]
        _move(self.root / was, self.root / where)
        # A moved directory takes its entries along.
        for other, location in self.locations.items():
            if location == was or location.startswith(was + "/"):
                self.locations[other] = where + location[len(was) :]

    def undo_name(self, op: NameOp) -> None:
        if op.kind in ("create", "mkdir"):
            self._undone += 1
            self._relocate(op.ino, f"{GRAVEYARD}/never-created-{self._undone:08d}")
        elif op.kind in ("unlink", "rmdir"):
            self._relocate(op.ino, _in_tree(op.path))
        else:  # rename
            assert op.target is not None
            self._relocate(op.ino, _in_tree(op.path))
            if op.buried_ino is not None:
                self._relocate(op.buried_ino, _in_tree(op.target))

    def undo_data(self, op: DataOp) -> None:
        with open(self.file(op.ino), "r+b") as stream:
            if op.old:
                stream.seek(op.offset)
                stream.write(op.old)
            stream.truncate(op.old_size)

    def redo_data(self, op: DataOp, length: int) -> None:
        with open(self.file(op.ino), "r+b") as stream:
            if op.kind == "truncate":
                stream.truncate(op.offset)
            else:
                stream.seek(op.offset)
                stream.write(op.new[:length])


def materialize(root: Path, journal: Journal, choice: Choice, store: Path) -> CrashState:
    """Copy ``root``'s tree to ``store`` and take back what ``choice`` loses."""
    scratch = store.with_name(store.name + ".materializing")
    shutil.copytree(root / TREE, scratch / TREE, symlinks=True)
    shutil.copytree(root / GRAVEYARD, scratch / GRAVEYARD, symlinks=True)
    replayer = _Replayer(scratch, journal.locations)
    names_kept, kept = _survivors(journal, choice)
    state = CrashState(choice, store)
    touched = journal.touched()
    # The size of each file the undone operations touched, as the cut left it.
    sizes = {op.ino: replayer.file(op.ino).stat().st_size for op in touched}
    for index in reversed(range(len(journal.names))):
        if index not in names_kept:
            replayer.undo_name(journal.names[index])
    for undone in reversed(touched):
        replayer.undo_data(undone)
    durable = {op.seq for op in journal.synced_after_failure}
    for redone in touched:
        if redone.seq in durable:
            replayer.redo_data(redone, len(redone.new))
        elif redone.seq in kept:
            replayer.redo_data(redone, kept[redone.seq])
    if choice.zeroed_tails:
        for ino, size in sizes.items():
            os.truncate(replayer.file(ino), size)
    for index, name_op in enumerate(journal.names):
        state.fate.append(
            {
                "seq": name_op.seq,
                "operation": name_op.kind,
                "path": name_op.path,
                **({"target": name_op.target} if name_op.target is not None else {}),
                "fate": "kept" if index in names_kept else "lost",
            }
        )
    for data_op in journal.data:
        length = kept.get(data_op.seq)
        fate = "lost" if length is None else "kept" if length == len(data_op.new) else "torn"
        if fate == "lost" and choice.zeroed_tails and data_op.kind == "write":
            fate = "zeroed" if data_op.offset + len(data_op.new) > data_op.old_size else fate
        state.fate.append(
            {
                "seq": data_op.seq,
                "operation": data_op.kind,
                "path": data_op.path,
                "offset": data_op.offset,
                "bytes": len(data_op.new),
                "fate": fate,
                **({"bytes_kept": length} if fate == "torn" else {}),
            }
        )
    for dropped in journal.failed:
        state.fate.append(
            {
                "seq": dropped.seq,
                "operation": dropped.kind,
                "path": dropped.path,
                "offset": dropped.offset,
                "bytes": len(dropped.new),
                "fate": "dropped-by-failed-fsync",
            }
        )
    state.fate.sort(key=lambda entry: entry["seq"])
    os.rename(scratch / TREE, store)
    shutil.rmtree(scratch)
    return state


#: Why a skipped choice is the state of an earlier one.
BY_FATE = "fate"  # it keeps, loses and tears the same pending operations
BY_BYTES = "bytes"  # its fates differ, but the tree it leaves is the same, byte for byte


@dataclass(frozen=True)
class SameState:
    """A choice skipped because it makes the crash state of an earlier one."""

    choice: Choice
    same_as: Choice
    by: str

    def to_json(self) -> dict[str, str]:
        return {"choice": self.choice.name, "same_as": self.same_as.name, "by": self.by}


def tree_digest(root: Path) -> str:
    """The names, kinds and bytes of every entry under ``root`` (nothing else: a restarted
    system sees neither times nor inode numbers)."""
    digest = hashlib.sha256()
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        where = Path(directory)
        digest.update(b"d\0" + str(where.relative_to(root)).encode() + b"\0")
        for name in sorted(files):
            path = where / name
            if path.is_symlink():
                digest.update(b"l\0" + name.encode() + b"\0" + os.readlink(path).encode())
                continue
            digest.update(b"f\0" + name.encode() + b"\0" + str(path.stat().st_size).encode())
            with open(path, "rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


class DistinctStates:
    """The crash states of one cut, each judged once.

    ``new_fate`` before a state is made (a choice with the fates of an earlier one makes the
    same bytes: ``materialize`` is deterministic), ``new_bytes`` once it is made (different
    fates can still leave the same tree). Each skipped choice is kept in ``skipped`` with
    the earlier choice it equals.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.skipped: list[SameState] = []
        self._fates: dict[Outcome, Choice] = {}
        self._trees: dict[str, Choice] = {}

    def new_fate(self, choice: Choice) -> bool:
        fates = outcome(self.journal, choice)
        earlier = self._fates.setdefault(fates, choice)
        if earlier is not choice:
            self.skipped.append(SameState(choice, earlier, BY_FATE))
        return earlier is choice

    def repeats(self, choice: Choice) -> bool:
        """Whether ``choice`` has the fates of a choice taken before (then it is kept in
        ``skipped``, as ``new_fate`` keeps it); a choice with new fates is not taken: a run
        that judges no more states leaves it unstarted."""
        earlier = self._fates.get(outcome(self.journal, choice))
        if earlier is None:
            return False
        self.skipped.append(SameState(choice, earlier, BY_FATE))
        return True

    def new_bytes(self, choice: Choice, tree: Path) -> bool:
        earlier = self._trees.setdefault(tree_digest(tree), choice)
        if earlier is not choice:
            self.skipped.append(SameState(choice, earlier, BY_BYTES))
        return earlier is choice
