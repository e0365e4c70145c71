"""Power cuts in a chaos run: the store lives on a power-loss disk, and a cut loses what
nobody synced while every process that had the store open dies with it.

Each mount's backing root is ``disks/disk-N``. At a cut the supervisor kills every process
(the machine is off), the file system stops and writes its journal, and the next disk is
made from a crash state of the last one: every pending operation lost at the first,
third, ... cut, a seeded subset (with a torn sector) at the second, fourth, ... Everything
restarts on the new disk, which keeps its predecessor and journal as evidence. At the end,
after a clean shutdown, the last disk's tree holds every write (an orderly shutdown
flushes the page cache) and is what the accounting reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, Choice, materialize
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk
from crashqueuelab.lab.faults.powerloss.journal import GRAVEYARD, JOURNAL_FILE, TREE

DISKS_DIRECTORY = "disks"


class PowerSupply:
    """The run's current disk, mounted at the store directory, and the cuts so far."""

    def __init__(self, output_dir: Path, mountpoint: Path, seed: int) -> None:
        self.output_dir = output_dir
        self.mountpoint = mountpoint
        self.seed = seed
        self.cuts = 0
        self.disk = PowerLossDisk(self._root(0), mountpoint)

    def _root(self, index: int) -> Path:
        return self.output_dir / DISKS_DIRECTORY / f"disk-{index}"

    def start(self) -> None:
        self.disk.start()

    def cut(self) -> dict[str, Any]:
        """Cut the power (every process on the disk must be dead) and boot the next disk."""
        journal = self.disk.cut()
        self.cuts += 1
        choice = LOSE_ALL if self.cuts % 2 else Choice(None, self.seed * 1000 + self.cuts)
        before, after = self._root(self.cuts - 1), self._root(self.cuts)
        after.mkdir(parents=True)
        state = materialize(before, journal, choice, after / TREE)
        (after / GRAVEYARD).mkdir()
        self.disk = PowerLossDisk(after, self.mountpoint)
        self.disk.start()
        relative = before.relative_to(self.output_dir)
        return {
            "crash_state": choice.name,
            "pending_writes": len(journal.data),
            "pending_directory_changes": len(journal.names),
            "fate": state.summary(),
            "journal": str(relative / JOURNAL_FILE),
            "next_disk": str(after.relative_to(self.output_dir)),
        }

    def finish(self) -> Path:
        """Stop the disk after a clean shutdown; the tree the accounting reads."""
        self.disk.cut()
        return self._root(self.cuts) / TREE

    def stop(self) -> None:
        """Make sure nothing stays mounted, whatever happened."""
        self.disk.__exit__(None, None, None)
