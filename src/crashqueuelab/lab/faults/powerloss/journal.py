"""What the disk has not made durable yet, in the order it happened.

The pass-through file system applies every operation to its backing tree at once and tells
the journal what it did, with the bytes it overwrote: an undo log. An ``fsync`` of a file
makes that file's writes and truncations durable; an ``fsync`` of a directory makes the
creates, renames and unlinks in it durable (a rename needs both of its directories). What is
still pending when the power goes is what a crash state may lose (``crashstate``).

Files are named by the backing tree's inode number, because a rename must not separate a
file from its unsynced writes; ``locations`` says where each known inode is now: under
``tree/`` or, once unlinked or replaced, under ``graveyard/`` (kept, so that a lost unlink
can give the file back).

A failed ``fsync`` (a disk fault, ``faults.py``) is PostgreSQL's "fsyncgate": the kernel
reports the error once and drops the dirty pages the sync covered, so the writes it covered
never reach the disk, and a later ``fsync`` that succeeds does not bring them back. The
journal moves them to ``failed`` (lost at any cut, whatever the crash state keeps), and from
then on keeps that file's later writes even once synced (``synced_after_failure``): a crash
state takes the failed writes back under them and puts the synced ones on again.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TREE = "tree"
GRAVEYARD = "graveyard"
JOURNAL_FILE = "unsynced.json"


@dataclass
class DataOp:
    """A write (``new`` at ``offset``) or a truncation (to ``offset``) of one file."""

    seq: int
    kind: str  # "write" | "truncate"
    ino: int
    path: str
    offset: int
    new: bytes
    #: The bytes the operation replaced, and the file's size before it.
    old: bytes
    old_size: int


@dataclass
class NameOp:
    """A create, unlink, rename, mkdir or rmdir, durable once its directories are synced."""

    seq: int
    kind: str  # "create" | "unlink" | "rename" | "mkdir" | "rmdir"
    path: str
    ino: int
    target: str | None = None  # a rename's new name
    #: Where the removed file (an unlink's, or the one a rename replaced) was put aside.
    buried: str | None = None
    buried_ino: int | None = None
    directories: set[str] = field(default_factory=set)


def parent_of(path: str) -> str:
    """The directory holding ``path`` ("/" for the mount's top)."""
    return os.path.dirname(path.rstrip("/")) or "/"


class Journal:
    """The pending (unsynced) operations of one mount, in the order they were made."""

    def __init__(self) -> None:
        self._seq = 0
        self.data: list[DataOp] = []
        self.names: list[NameOp] = []
        self.locations: dict[int, str] = {}
        self.synced_files = 0
        self.synced_directories = 0
        #: Writes and truncations a failed fsync covered: never durable (fsyncgate).
        self.failed: list[DataOp] = []
        #: Writes and truncations synced after a failure on the same file: durable, kept so
        #: that a crash state can undo the failed ones beneath them and redo these.
        self.synced_after_failure: list[DataOp] = []
        self.failed_syncs = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def seen(self, ino: int, location: str) -> None:
        self.locations[ino] = location

    def wrote(
        self, ino: int, path: str, offset: int, new: bytes, old: bytes, old_size: int
    ) -> None:
        self.data.append(DataOp(self._next(), "write", ino, path, offset, new, old, old_size))

    def truncated(self, ino: int, path: str, length: int, old: bytes, old_size: int) -> None:
        self.data.append(DataOp(self._next(), "truncate", ino, path, length, b"", old, old_size))

    def file_synced(self, ino: int) -> None:
        self.synced_files += 1
        if any(op.ino == ino for op in self.failed):
            self.synced_after_failure += [op for op in self.data if op.ino == ino]
        self.data = [op for op in self.data if op.ino != ino]

    def file_sync_failed(self, ino: int) -> None:
        """An fsync of ``ino`` answered an error: its pending writes are dropped for good."""
        self.failed_syncs += 1
        self.failed += [op for op in self.data if op.ino == ino]
        self.data = [op for op in self.data if op.ino != ino]

    def touched(self) -> list[DataOp]:
        """Every write and truncation a crash state must take back first, oldest first."""
        return sorted([*self.data, *self.failed, *self.synced_after_failure], key=lambda o: o.seq)

    def directory_synced(self, directory: str) -> None:
        self.synced_directories += 1
        for op in self.names:
            op.directories.discard(directory)
        self.names = [op for op in self.names if op.directories]

    def name_op(self, kind: str, path: str, ino: int, **extra: Any) -> NameOp:
        op = NameOp(self._next(), kind, path, ino, **extra)
        op.directories = {parent_of(path)} | (
            {parent_of(op.target)} if op.target is not None else set()
        )
        self.names.append(op)
        return op

    def to_json(self) -> dict[str, Any]:
        def encode(data: bytes) -> str:
            return base64.b64encode(data).decode("ascii")

        def data_ops(ops: list[DataOp]) -> list[dict[str, Any]]:
            return [
                {
                    "seq": op.seq,
                    "kind": op.kind,
                    "ino": op.ino,
                    "path": op.path,
                    "offset": op.offset,
                    "new": encode(op.new),
                    "old": encode(op.old),
                    "old_size": op.old_size,
                }
                for op in ops
            ]

        return {
            "locations": {str(ino): where for ino, where in sorted(self.locations.items())},
            "synced_files": self.synced_files,
            "synced_directories": self.synced_directories,
            "failed_syncs": self.failed_syncs,
            "data": data_ops(self.data),
            "failed": data_ops(self.failed),
            "synced_after_failure": data_ops(self.synced_after_failure),
            "names": [
                {
                    "seq": op.seq,
                    "kind": op.kind,
                    "path": op.path,
                    "ino": op.ino,
                    "target": op.target,
                    "buried": op.buried,
                    "buried_ino": op.buried_ino,
                    "directories": sorted(op.directories),
                }
                for op in self.names
            ],
        }

    def dump(self, path: Path) -> None:
        """Write the pending operations where the lab reads them after the power cut."""
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump(self.to_json(), stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)


def load_journal(path: Path) -> Journal:
    """The journal a mount left, read back (the inverse of ``Journal.to_json``)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    journal = Journal()
    journal.locations = {int(ino): where for ino, where in raw["locations"].items()}
    journal.synced_files = raw["synced_files"]
    journal.synced_directories = raw["synced_directories"]
    journal.failed_syncs = raw.get("failed_syncs", 0)

    def data_ops(items: list[dict[str, Any]]) -> list[DataOp]:
        return [
            DataOp(
                item["seq"],
                item["kind"],
                item["ino"],
                item["path"],
                item["offset"],
                base64.b64decode(item["new"]),
                base64.b64decode(item["old"]),
                item["old_size"],
            )
            for item in items
        ]

    journal.data = data_ops(raw["data"])
    journal.failed = data_ops(raw.get("failed", []))
    journal.synced_after_failure = data_ops(raw.get("synced_after_failure", []))
    journal.names = [
        NameOp(
            item["seq"],
            item["kind"],
            item["path"],
            item["ino"],
            item["target"],
            item["buried"],
            item["buried_ino"],
            set(item["directories"]),
        )
        for item in raw["names"]
    ]
    return journal
