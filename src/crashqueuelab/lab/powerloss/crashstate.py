"""From a power cut to what the disk holds: a crash state.

The backing tree holds every operation the system made; the journal holds the ones the disk
had not made durable, with the bytes each one overwrote. A crash state is a copy of the tree
with pending operations taken back, newest first:

* ``lose_all``: every pending operation is lost (the state the strict POSIX reading allows
  and the one that catches a missing fsync whatever the seed);
* ``seeded(seed)``: a random prefix of the pending directory changes survives (a journaling
  file system commits its metadata in order), each pending write or truncation survives on
  its own with probability one half, and the last survivor may be torn: only its first
  whole 512-byte sectors reach the disk, as when a drive loses power mid-write.

Every choice is written into the state's ``fate`` so a report can say which bytes survived.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashqueuelab.lab.powerloss.journal import GRAVEYARD, TREE, DataOp, Journal, NameOp

SECTOR = 512


@dataclass(frozen=True)
class Choice:
    """Which pending operations survive: all lost (``seed`` None) or a seeded subset."""

    seed: int | None

    @property
    def name(self) -> str:
        return "lose-all" if self.seed is None else f"seed-{self.seed}"


LOSE_ALL = Choice(None)


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


def _survivors(journal: Journal, choice: Choice) -> tuple[int, dict[int, int]]:
    """How many directory changes survive, and for each surviving data op the bytes kept."""
    if choice.seed is None:
        return 0, {}
    rng = random.Random(choice.seed)
    names_kept = rng.randint(0, len(journal.names))
    kept = {op.seq: len(op.new) for op in journal.data if rng.random() < 0.5}
    last = max(kept, default=None)
    if last is not None and rng.random() < 0.5:
        op = next(op for op in journal.data if op.seq == last)
        # Sector boundaries strictly inside the write, in file offsets.
        first = (op.offset // SECTOR + 1) * SECTOR
        cuts = range(first, op.offset + len(op.new), SECTOR)
        if op.kind == "write" and len(cuts) > 0:
            kept[last] = rng.choice(cuts) - op.offset
    return names_kept, kept


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
        _move(self.root / self.locations[ino], self.root / where)
        self.locations[ino] = where

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


def materialize(root: Path, journal: Journal, choice: Choice, target: Path) -> CrashState:
    """Copy ``root``'s tree to ``target``/tree and take back what ``choice`` loses."""
    scratch = target / ".materializing"
    shutil.copytree(root / TREE, scratch / TREE, symlinks=True)
    shutil.copytree(root / GRAVEYARD, scratch / GRAVEYARD, symlinks=True)
    replayer = _Replayer(scratch, journal.locations)
    names_kept, kept = _survivors(journal, choice)
    state = CrashState(choice, target / TREE)
    for lost in reversed(journal.names[names_kept:]):
        replayer.undo_name(lost)
    for pending in reversed(journal.data):
        replayer.undo_data(pending)
    for pending in journal.data:
        if pending.seq in kept:
            replayer.redo_data(pending, kept[pending.seq])
    for index, name_op in enumerate(journal.names):
        state.fate.append(
            {
                "seq": name_op.seq,
                "operation": name_op.kind,
                "path": name_op.path,
                **({"target": name_op.target} if name_op.target is not None else {}),
                "fate": "kept" if index < names_kept else "lost",
            }
        )
    for data_op in journal.data:
        length = kept.get(data_op.seq)
        fate = "lost" if length is None else "kept" if length == len(data_op.new) else "torn"
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
    state.fate.sort(key=lambda entry: entry["seq"])
    os.rename(scratch / TREE, target / TREE)
    shutil.rmtree(scratch)
    return state
